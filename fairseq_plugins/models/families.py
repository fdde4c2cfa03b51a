"""The named families: rows of the preset table (presets.py) that set axis choices of ``residual_axes``.

Every family of the plugin before issue 26 was its own model (``residual_transformer``, ``dca_transformer``,
...). Each of those model names stays registered, as an alias of ``residual_axes`` that only changes the axis
defaults (``FAMILIES``), so ``--arch dca_transformer``, scripts that name a family's model and checkpoints
saved by the code before issue 26 keep working: fairseq rebuilds a checkpoint through its ``--arch`` name
(``cfg.model._name``), whose architecture function here fills the axis choices the checkpoint's args lack.

A family may read the option its presets used to set (``DERIVED``): ``laurel_transformer`` checkpoints carry
``laurel_variant``, ``hc_transformer`` ones ``hc_mode``, and the axis choice follows it. ``crossformer_hg``
checkpoints saved before issue 54 name their tied blocks in ``guidance`` (``crossformer_hg_guidance``).

Which depths and widths each row registers is presets.py's data: the seed rows below keep all of them.
"""

from fairseq.models import register_model, register_model_architecture

from ..axes import declarations, set_defaults
from ..criterions.label_smoothed_cross_entropy_with_guidance import (
    NAME as GUIDANCE_CRITERION,
)
from ..validation import STORED_ARGS, PluginOptionError
from . import baselines  # noqa: F401  (registers transformer_preln/postln first: DECLARED below skips taken names)
from .axes_transformer import MODEL, AxesTransformerModel, axes_architecture
from .presets import LEGACY_DEPTHS, PRESETS, WIDTHS, register_family, register_preset

# legacy model name -> its axis settings
FAMILIES: dict[str, dict[str, str]] = {
    "residual_transformer": {"residual": "resi-dual"},
    "deepnet_transformer": {"residual": "deepnet"},
    "tfixup_transformer": {"residual": "tfixup"},
    "b2t_transformer": {"residual": "b2t"},
    "normformer_transformer": {"residual": "normformer"},
    "admin_transformer": {"residual": "admin"},
    "dca_transformer": {"depth_aggregation": "dca"},
    "denseformer_transformer": {"depth_aggregation": "denseformer"},
    "dlcl_transformer": {"depth_aggregation": "dlcl"},
    "laurel_transformer": {"depth_aggregation": "laurel-lr"},
    "hc_transformer": {"depth_aggregation": "hc-dynamic"},
    "crossformer_sg": {"guidance": "key-query", "guidance_norm": "l2"},
    "crossformer_hg": {"tying": "key-query"},
}
# legacy model name -> (the option its presets set, how the axis choice follows from it)
DERIVED = {
    "laurel_transformer": ("laurel_variant", lambda v: {"depth_aggregation": f"laurel-{v}"}),
    "hc_transformer": ("hc_mode", lambda v: {"depth_aggregation": f"hc-{v}"}),
}


def crossformer_hg_guidance(args) -> None:
    """crossformer_hg's ``--guidance`` before issue 54: it named the tied blocks (the presets read it as their
    ``--tying``). ``--guidance`` is Crossformer's soft guidance on every model now, and these presets set ``tying``.

    A checkpoint saved by the older code (``validation.STORED_ARGS`` on its args) stores the tied blocks in
    ``guidance`` and no ``tying`` (before issue 26) or the same blocks in it (since): it loads as it was built,
    tied and without soft guidance. A command line giving ``--guidance`` to a crossformer_hg arch with a criterion
    that does not train the regularizer is the old spelling of ``--tying`` (the older code refused the guidance
    criterion on these models): one error says so, instead of a model tied otherwise than the command meant."""
    guidance = getattr(args, "guidance", None)
    if guidance in (None, "none"):
        return
    overrides = getattr(args, STORED_ARGS, None)
    if overrides is not None and "guidance" not in overrides:
        if getattr(args, "tying", None) in (None, guidance):
            args.tying, args.guidance = guidance, "none"
        return
    criterion = getattr(args, "criterion", None)
    if isinstance(criterion, str) and criterion != GUIDANCE_CRITERION:
        raise PluginOptionError(
            f"--guidance {guidance} with --arch {getattr(args, 'arch', 'crossformer_hg')}: --guidance is "
            f"Crossformer's soft guidance, a regularizer only --criterion {GUIDANCE_CRITERION} trains, and the "
            f"criterion is {criterion}: it would be ignored. To tie blocks (what --guidance meant on the "
            f"crossformer_hg presets before issue 54) use --tying {guidance}"
        )


# legacy model name -> the translation of its presets' legacy options, run before any preset fills a default
LEGACY = {"crossformer_hg": crossformer_hg_guidance}


def family_architecture(model: str):
    def derive(args):
        if model in DERIVED:
            option, follow = DERIVED[model]
            if getattr(args, option, None) is not None:
                set_defaults(args, follow(getattr(args, option)))

    def architecture(args):
        if model in LEGACY:
            LEGACY[model](args)
        derive(args)  # a checkpoint's or the command line's legacy option first
        set_defaults(args, FAMILIES[model])
        axes_architecture(args)

    architecture.__name__ = f"{model}_architecture"
    return architecture


# legacy model name -> its class name before issue 26 (errors and logs name it)
CLASS_NAMES = {
    "residual_transformer": "ResiDualTransformerModel", "deepnet_transformer": "DeepNetTransformerModel",
    "tfixup_transformer": "TFixupTransformerModel", "b2t_transformer": "B2TTransformerModel",
    "normformer_transformer": "NormFormerTransformerModel", "admin_transformer": "AdminTransformerModel",
    "dca_transformer": "DCATransformerModel", "denseformer_transformer": "DenseFormerTransformerModel",
    "dlcl_transformer": "DLCLTransformerModel", "laurel_transformer": "LaurelTransformerModel",
    "hc_transformer": "HCTransformerModel", "crossformer_sg": "CrossformerSGModel",
    "crossformer_hg": "CrossformerHGModel",
}  # fmt: skip


def _register_alias(model: str) -> type:
    architecture = family_architecture(model)
    cls = type(
        CLASS_NAMES[model], (AxesTransformerModel,),
        {"__doc__": f"``{model}``: ``{MODEL}`` with {FAMILIES[model]} (families.py).",
         "architecture": classmethod(lambda cls, args: architecture(args))},
    )  # fmt: skip
    register_model(model)(cls)
    register_model_architecture(model, model)(architecture)
    return cls


ALIASES: dict[str, type] = {model: _register_alias(model) for model in FAMILIES}
register_model_architecture(MODEL, MODEL)(axes_architecture)

# family prefix -> (legacy model, preset settings); every depth and width of presets.py (LEGACY_DEPTHS: the seed
# families' names are the ones checkpoints, scripts and studies before issue 26 named)
ROWS: dict[str, tuple[str, dict]] = {  # in the registration order of the code before issue 26 (table order)
    "crossformer_sg": ("crossformer_sg", {}),
    "crossformer_hg": ("crossformer_hg", {}),
    # Crossformer table 1's other hard-guidance rows, one name each: a study compares them by --arch alone
    "crossformer_hg_ffn": ("crossformer_hg", {"tying": "ffn"}),
    "crossformer_hg_value": ("crossformer_hg", {"tying": "value"}),
    "dca": ("dca_transformer", {}),
    "dca_k2": ("dca_transformer", {"depth_aggregation": "dca-k", "dca_k": 2}),
    "denseformer": ("denseformer_transformer", {}),
    "dlcl": ("dlcl_transformer", {}),
    "hc_static": ("hc_transformer", {"hc_mode": "static"}),
    "hc_dynamic": ("hc_transformer", {"hc_mode": "dynamic"}),
    "laurel_rw": ("laurel_transformer", {"laurel_variant": "rw"}),
    "laurel_lr": ("laurel_transformer", {"laurel_variant": "lr"}),
    "laurel_pa": ("laurel_transformer", {"laurel_variant": "pa"}),
    "deepnet": ("deepnet_transformer", {}),
    "tfixup": ("tfixup_transformer", {}),
    "b2t": ("b2t_transformer", {}),
    "normformer": ("normformer_transformer", {}),
    "admin": ("admin_transformer", {}),
    "residual": ("residual_transformer", {}),
}
for _prefix, (_model, _settings) in ROWS.items():
    register_family(_prefix, _model, family_architecture(_model), _settings, LEGACY_DEPTHS, LEGACY.get(_model))
    if _prefix == "crossformer_hg_value":  # Crossformer-All, table 2's one configuration (modules/cross_layer_guidance.py)
        register_preset("crossformer_all_e16d6", "crossformer_hg", "crossformer_all", 16, 6, WIDTHS[""],
                        family_architecture("crossformer_hg"), {"tying": "all"}, crossformer_hg_guidance)  # fmt: skip

# combinations worth naming (issue 26 item 4): the project's three ideas in one model, ResiDual-free wiring with
# k-DCA's depth aggregation, and the combination study's rows (docs/study/combinations_e12d12): table 2's best
# wiring (T-Fixup) with the best aggregation it composed with when the study ran (DenseFormer; T-Fixup + Hyper-
# Connections builds since issue 54 item 3) and with key-query tying, and the best aggregation with key-query tying
COMBINATIONS: dict[str, dict[str, str]] = {
    "preln_kq_dca": {"residual": "pre", "tying": "key-query", "depth_aggregation": "dca"},
    "preln_kq_dca_k2": {"residual": "pre", "tying": "key-query", "depth_aggregation": "dca-k", "dca_k": 2},
    "deepnet_denseformer": {"residual": "deepnet", "depth_aggregation": "denseformer"},
    "preln_rmsnorm": {"residual": "pre", "norm": "rmsnorm"},
    "tfixup_denseformer": {"residual": "tfixup", "depth_aggregation": "denseformer"},
    "tfixup_kq": {"residual": "tfixup", "tying": "key-query"},
    "tfixup_kq_denseformer": {"residual": "tfixup", "tying": "key-query", "depth_aggregation": "denseformer"},
    "preln_kq_hc_dynamic": {"residual": "pre", "tying": "key-query", "depth_aggregation": "hc-dynamic"},
}
for _prefix, _settings in COMBINATIONS.items():
    register_family(_prefix, MODEL, axes_architecture, _settings)

# the 2024-26 ideas of issue 27 (docs/axes.md): each a Pre-LN model with one axis changed
NEW_IDEAS: dict[str, dict[str, str]] = {
    "layerscale": {"residual": "layerscale"},
    "rezero": {"residual": "rezero"},
    "ortho": {"residual": "orthogonal"},
    "periln": {"residual": "peri"},
    "mixln": {"residual": "mix"},
    "hybridnorm": {"residual": "hybrid"},
    "hybridnorm_star": {"residual": "hybrid", "hybrid_first_layer": "pre"},
    "dyt": {"residual": "pre", "norm": "dyt"},
    "derf": {"residual": "pre", "norm": "derf"},
    "value_residual": {"residual": "pre", "value_residual": "both"},
    "mhc": {"depth_aggregation": "mhc"},
    "mhc_lite": {"depth_aggregation": "mhc-lite"},
    "frac": {"depth_aggregation": "frac"},
    "attnres": {"depth_aggregation": "attnres"},
    "attnres_block": {"depth_aggregation": "attnres-block"},
    "mudd": {"depth_aggregation": "mudd"},
}
for _prefix, _settings in NEW_IDEAS.items():
    register_family(_prefix, MODEL, axes_architecture, _settings)

# every idea added since: the preset its choice declares (axes/__init__.py, ``Choice.preset``), that one choice on
# the Pre-LN defaults, registered after the tables above (frozen: their names and order are what checkpoints,
# studies and the golden commands use), so a new idea needs no row here
_TAKEN = {preset.family for preset in PRESETS.values()}
DECLARED: dict[str, dict[str, str]] = {
    choice.preset: {axis: name}
    for axis, table in declarations().items()
    for name, choice in table.items()
    if choice.preset and choice.preset not in _TAKEN
}
for _prefix, _settings in DECLARED.items():
    register_family(_prefix, MODEL, axes_architecture, _settings)
