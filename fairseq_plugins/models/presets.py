"""One table of named architectures: every ``--arch`` name of the plugin is a row here.

A family (a model plus its fixed settings: since issue 26 the axis choices of ``residual_axes``, rows in
families.py) is crossed with every width and depth below, so ``register_family("residual",
"residual_transformer", family_architecture("residual_transformer"))`` registers ``residual_e6d6`` ...
``residual_e36d6`` and ``residual_iwslt_e6d6`` ... ``residual_iwslt_e36d6``; ``residual_transformer`` is the
alias of ``residual_axes`` with ``--residual resi-dual``.
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
) -> Preset:
    """Register one ``--arch`` name for ``model`` and record it in PRESETS."""
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
        _set_defaults(args, shape)
        _set_defaults(args, preset.settings)
        base_architecture(args)

    architecture.__name__ = arch
    architecture.__doc__ = f"{family}: E{encoder_layers}D{decoder_layers}, width {width}"
    register_model_architecture(model, arch)(architecture)
    PRESETS[arch] = preset
    return preset


def register_family(
    prefix: str, model: str, base_architecture: Callable, settings: dict[str, object] | None = None
) -> None:
    """Register ``{prefix}_{width}{depth}`` for every width and depth of the table."""
    for width_name, width in WIDTHS.items():
        for depth_name, (encoder_layers, decoder_layers) in DEPTHS.items():
            register_preset(
                f"{prefix}_{width_name}{depth_name}",
                model,
                prefix,
                encoder_layers,
                decoder_layers,
                width,
                base_architecture,
                settings,
            )
