"""One table of the language-model architectures: ``{family}_lm_{width}d{depth}``, every family crossed with
the LM widths and the kept depths, e.g. ``dca_lm_d12`` (512/2048/8, 12 layers), ``hc_dynamic_lm_gpt_d24``.

The families are read from the translation preset table (``fairseq_plugins.models.PRESETS``): one row per
family, its registered model and its settings, so a family added there becomes a language model here by
itself. The widths are fairseq's own LM architectures', named after them; the depths are the DCA paper's.

Presets fix the shape and the family's switches, as defaults only: the command line wins. Training
hyper-parameters belong to the recipes (scripts/lm/lm_setups.py).
"""

from dataclasses import dataclass, field

from fairseq.models import register_model_architecture

from ..models.presets import PRESETS
from .language_model import family_architecture, make_language_model


@dataclass(frozen=True)
class LMWidth:
    embed_dim: int
    ffn_dim: int
    heads: int
    source: str
    settings: dict[str, object] = field(default_factory=dict)


# arch-name infix -> width; "" is fairseq's transformer_lm and the DCA paper's LM width
LM_WIDTHS: dict[str, LMWidth] = {
    "": LMWidth(512, 2048, 8, "fairseq transformer_lm (base_lm_architecture); DCA section 5 (512, MLP 4x)"),
    "gpt_": LMWidth(
        768, 3072, 12, "fairseq transformer_lm_gpt (GELU, attention dropout 0.1)", {"activation_fn": "gelu", "attention_dropout": 0.1}
    ),
    "big_": LMWidth(1024, 4096, 16, "fairseq transformer_lm_big"),
}

# the depths of DCA figure 6 (LM1B, 6 to 42 layers)
LM_DEPTHS: tuple[int, ...] = (6, 12, 18, 24, 30, 36, 42)

# Which names are registered (issue 54 item 7: the table stops generating names nobody uses; tests/test_arch_names.py
# holds it). The LM names came a day before issue 26 and no checkpoint of the time names one, so no LM name is
# legacy; kept are:
# - every family at LM_KEPT_DEPTHS and every width: d6 is the depth of the LM golden commands
#   (tests/golden/lm_commands.txt), of the LM benchmark's default (scripts/benchmark/benchmark.py LM_DEFAULT_DEPTH)
#   and of the study lm_table5_d6; d12 that of lm_width_d12 (docs/study/);
# - DCA figure 6's sweep, the experiment LM_DEPTHS come from: its two models at every depth, base width;
# - the few other names a committed file uses (LM_ALSO_KEPT, each with its user).
LM_KEPT_DEPTHS: tuple[int, ...] = (6, 12)
LM_SWEPT_FAMILIES: tuple[str, ...] = ("transformer_preln", "dca")
LM_ALSO_KEPT: frozenset[str] = frozenset({
    "hc_dynamic_lm_gpt_d24",  # docs/language_models.md's example, tests/test_lm_model.py's shape check
})  # fmt: skip


def lm_kept(arch: str, family: str, width_name: str, layers: int) -> bool:
    """Whether the table registers ``arch`` (the rules above)."""
    swept = family in LM_SWEPT_FAMILIES and width_name == ""
    return layers in LM_KEPT_DEPTHS or swept or arch in LM_ALSO_KEPT


@dataclass(frozen=True)
class LMFamily:
    family: str
    translation_model: str  # registered translation model whose decoder the LM uses
    translation_arch: str  # a translation preset of the family (its settings)
    settings: dict[str, object]


@dataclass(frozen=True)
class LMPreset:
    arch: str
    family: str
    layers: int
    width: LMWidth


def lm_families() -> dict[str, LMFamily]:
    """family -> its row: the first translation preset registered for it gives the model and settings."""
    rows: dict[str, LMFamily] = {}
    for arch, preset in PRESETS.items():
        if preset.family not in rows:
            rows[preset.family] = LMFamily(preset.family, preset.model, arch, dict(preset.settings))
    return rows


LM_FAMILIES: dict[str, LMFamily] = {}
LM_PRESETS: dict[str, LMPreset] = {}


def register_lm_preset(arch: str, row: LMFamily, layers: int, width: LMWidth) -> LMPreset:
    shape = {
        "decoder_layers": layers,
        "decoder_embed_dim": width.embed_dim,
        "decoder_ffn_embed_dim": width.ffn_dim,
        "decoder_attention_heads": width.heads,
        **width.settings,
    }

    def architecture(args):
        for name, value in shape.items():
            if getattr(args, name, None) is None:
                setattr(args, name, value)
        family_architecture(args, row.translation_arch)

    architecture.__name__ = arch
    architecture.__doc__ = f"{row.family} LM: {layers} layers, width {width}"
    register_model_architecture(f"{row.family}_lm", arch)(architecture)
    LM_PRESETS[arch] = preset = LMPreset(arch, row.family, layers, width)
    return preset


def register_all() -> None:
    for family, row in lm_families().items():
        LM_FAMILIES[family] = row
        make_language_model(family, row.translation_model, row.translation_arch)
        for width_name, width in LM_WIDTHS.items():
            for layers in LM_DEPTHS:
                arch = f"{family}_lm_{width_name}d{layers}"
                if lm_kept(arch, family, width_name, layers):
                    register_lm_preset(arch, row, layers, width)


register_all()
