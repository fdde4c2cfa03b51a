"""One table of named architectures: every ``--arch`` name of the plugin is a row here.

A family (a model plus its fixed settings: since issue 26 the axis choices of ``residual_axes``, rows in
families.py) is crossed with the widths and depths below, so ``register_family("residual",
"residual_transformer", family_architecture("residual_transformer"), depths=LEGACY_DEPTHS)`` registers
``residual_e6d6`` ... ``residual_e36d6`` and ``residual_iwslt_e6d6`` ... ``residual_iwslt_e36d6``;
``residual_transformer`` is the alias of ``residual_axes`` with ``--residual resi-dual``. Which depths a family
gets is the table's data (``LEGACY_DEPTHS``, ``KEPT_DEPTHS``, ``ALSO_KEPT`` below, and why).
``scripts/analysis/param_table.py`` prints the table with the parameter count of each built model.

Presets fix only the shape (depth, width, heads) and the family's own switches, and only as defaults:
anything given on the command line wins, as with fairseq's own architectures. Training hyper-parameters
(dropout, learning rate, ...) belong to the recipes.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from fairseq.models import register_model_architecture


@dataclass(frozen=True)
class Width:
    embed_dim: int
    ffn_dim: int
    heads: int
    source: str


# arch-name infix -> width. "" is the base/WMT width.
WIDTHS: dict[str, Width] = {
    "": Width(512, 2048, 8, "ResiDual table 10 (WMT), Transformer-base"),
    "iwslt_": Width(256, 1024, 4, "ResiDual table 9 (IWSLT-14)"),
}

# arch-name suffix -> (encoder layers, decoder layers)
DEPTHS: dict[str, tuple[int, int]] = {
    "e6d6": (6, 6),
    "e12d12": (12, 12),
    "e18d18": (18, 18),
    "e24d24": (24, 24),
    "e12d6": (12, 6),
    "e18d6": (18, 6),
    "e24d6": (24, 6),
    "e36d6": (36, 6),
}

# Which names are registered (issue 54 item 7: names users rely on keep working, the table stops generating names
# nobody uses; tests/test_arch_names.py holds both):
# - every family registered before issue 26 (the seed families, ROWS in families.py, and the two baselines) keeps
#   every width and depth: with crossformer_all_e16d6 and the 13 family model names these are the 350 names of the
#   plugin before the axes and the 2024-26 ideas (tests/golden/legacy_archs.txt), which checkpoints, scripts and
#   studies of that time may name;
# - every family added since (issue 26's combinations, issue 27's ideas, every declared preset) gets KEPT_DEPTHS at
#   both widths: the benchmark's default depths (scripts/benchmark/bench_families.py DEFAULT_DEPTHS; the choices'
#   speed targets are declared at them), which are also the depths of every committed study and test of those
#   families (E6D6, E12D12, the benchmark's E18D18 and E36D6);
# - and the few other names a committed file uses (ALSO_KEPT, each with its user).
LEGACY_DEPTHS: tuple[str, ...] = tuple(DEPTHS)
KEPT_DEPTHS: tuple[str, ...] = ("e6d6", "e12d12", "e18d18", "e36d6")
ALSO_KEPT: frozenset[str] = frozenset({
    "mixln_e12d6",  # tests/test_axes_new_ideas.py: Mix-LN's split of an encoder deeper than its decoder
})  # fmt: skip


@dataclass(frozen=True)
class Preset:
    arch: str
    model: str
    family: str
    encoder_layers: int
    decoder_layers: int
    width: Width
    settings: dict[str, object] = field(default_factory=dict)


# arch name -> preset, filled by register_family / register_preset
PRESETS: dict[str, Preset] = {}


def _set_defaults(args, values: dict[str, object]) -> None:
    for name, value in values.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def register_preset(
    arch: str,
    model: str,
    family: str,
    encoder_layers: int,
    decoder_layers: int,
    width: Width,
    base_architecture: Callable,
    settings: dict[str, object] | None = None,
    legacy: Callable | None = None,
) -> Preset:
    """Register one ``--arch`` name for ``model`` and record it in PRESETS. ``legacy(args)``, if given, runs first:
    it translates options whose meaning changed (families.py: crossformer_hg's old ``--guidance``) before the
    preset's settings fill anything."""
    preset = Preset(arch, model, family, encoder_layers, decoder_layers, width, dict(settings or {}))
    shape = {
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
        "encoder_embed_dim": width.embed_dim,
        "decoder_embed_dim": width.embed_dim,
        "encoder_ffn_embed_dim": width.ffn_dim,
        "decoder_ffn_embed_dim": width.ffn_dim,
        "encoder_attention_heads": width.heads,
        "decoder_attention_heads": width.heads,
    }

    def architecture(args):
        if legacy is not None:
            legacy(args)
        _set_defaults(args, shape)
        _set_defaults(args, preset.settings)
        base_architecture(args)

    architecture.__name__ = arch
    architecture.__doc__ = f"{family}: E{encoder_layers}D{decoder_layers}, width {width}"
    register_model_architecture(model, arch)(architecture)
    PRESETS[arch] = preset
    return preset


def register_family(
    prefix: str,
    model: str,
    base_architecture: Callable,
    settings: dict[str, object] | None = None,
    depths: tuple[str, ...] = KEPT_DEPTHS,
    legacy: Callable | None = None,
) -> None:
    """Register ``{prefix}_{width}{depth}`` for every width and each of ``depths`` (a new family: KEPT_DEPTHS),
    plus the family's names in ALSO_KEPT; in the table's order of widths and depths."""
    for width_name, width in WIDTHS.items():
        for depth_name, (encoder_layers, decoder_layers) in DEPTHS.items():
            arch = f"{prefix}_{width_name}{depth_name}"
            if depth_name not in depths and arch not in ALSO_KEPT:
                continue
            register_preset(
                arch,
                model,
                prefix,
                encoder_layers,
                decoder_layers,
                width,
                base_architecture,
                settings,
                legacy,
            )
