"""docs/architectures.md's list: every family of ``--arch`` names from the preset tables and what each sets."""

from fairseq.models import ARCH_MODEL_NAME_REGISTRY

from fairseq_plugins import cli, lm, models

from .markdown import table


def architectures_list() -> str:
    """One row per family of --arch names: its model, what it sets beyond residual_axes' defaults, its names."""
    base, names = cli.resolved(cli.MODEL), list(cli.declared_options())
    families: dict[str, list[str]] = {}
    for arch in cli.plugin_archs():
        preset = models.PRESETS.get(arch) or lm.LM_PRESETS.get(arch)
        family = preset.family + ("_lm" if arch in lm.LM_PRESETS else "") if preset else arch
        families.setdefault(family, []).append(arch)
    rows = []
    for family, archs in families.items():
        listed = archs if len(archs) <= 3 else [archs[0], "…", archs[-1]]
        rows.append([f"`{family}`", len(archs), " ".join(a if a == "…" else f"`{a}`" for a in listed),
                     f"`{ARCH_MODEL_NAME_REGISTRY[archs[0]]}`",
                     cli.changes(cli.resolved(archs[0]), base, names)])  # fmt: skip
    total = sum(len(a) for a in families.values())
    lm_presets, presets = lm.presets, models.presets

    def names(items) -> str:  # a table's order; a set sorted
        return " ".join(f"`{n}`" for n in (sorted(items) if isinstance(items, set | frozenset) else items))

    # which depths a family gets is the tables' data (presets.py, lm/presets.py: the kept names and why)
    translation_depths = (f"the seed families and baselines (before issue 26): {names(presets.LEGACY_DEPTHS)}; "
                          f"every family since: {names(presets.KEPT_DEPTHS)}; also {names(presets.ALSO_KEPT)}")
    lm_depths = (f"every family: {' '.join(f'`d{d}`' for d in lm_presets.LM_KEPT_DEPTHS)}; "
                 f"{names(lm_presets.LM_SWEPT_FAMILIES)} at the base width: "
                 f"{' '.join(f'`d{d}`' for d in lm_presets.LM_DEPTHS)} (DCA figure 6); also "
                 f"{names(lm_presets.LM_ALSO_KEPT)}")
    shapes = table(["names", "depths", "widths (infix: d_model/d_ffn/heads, source)"], [
        ["translation `{family}_{width}{depth}`", translation_depths,
         "; ".join(f"`{k or '(none)'}`: {w.embed_dim}/{w.ffn_dim}/{w.heads}, {w.source}" for k, w in models.WIDTHS.items())],
        ["language model `{family}_lm_{width}d{layers}`", lm_depths,
         "; ".join(f"`{k or '(none)'}`: {w.embed_dim}/{w.ffn_dim}/{w.heads}, {w.source}"
                   for k, w in lm_presets.LM_WIDTHS.items())],
    ])  # fmt: skip
    lines = [(f"{total} `--arch` names in {len(families)} families (translation: {len(models.PRESETS)} preset "
             f"names; language models: {len(lm.LM_PRESETS)}). What a family sets is beyond `{cli.MODEL}`'s defaults "
             "with the same axis choices; every name with its shape: `fairseq-residual list --archs`."), ""]  # fmt: skip
    lines += [*shapes, ""]
    lines += table(["family", "names", "first … last", "model", "sets"], rows)
    return "\n".join(lines) + "\n"
