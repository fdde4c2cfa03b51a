"""``--value-residual``: ResFormer's value residual (arXiv:2410.17897; modules/value_residual.py) on the model,
an option beside the four axes rather than a fifth axis: it changes only each attention's v_proj, so it
composes with every residual wiring, aggregation and norm whose attentions are fairseq's plain
MultiheadAttention, and it is refused (naming both) where another choice already owns v_proj.

    none      off (default)
    decoder   decoder self-attention: layers n >= 2 attend over V'_n = lambda_1 V_1 + lambda_2 V_n
    both      encoder self-attention too (each stack mixes in its own first layer's values)

``--value-residual-cross`` adds decoder cross-attention (V_1 = decoder layer 1's encoder-side values; off by
default: the paper has no cross-attention). ``--value-residual-mode`` is the module's mode (identity: the
paper's and the authors' code's fixed 0.5/0.5, default; learnable: Learnable-ResFormer; token: x-transformers'
per-token gate, refused on cross-attention). The mix happens inside v_proj, before fairseq caches the values,
so incremental decoding equals full decoding and beam reordering needs nothing extra.

Its three values declare the capabilities every axis choice declares (``VALUE_RESIDUALS``, read through
``axes.declarations()``); they are not an axis table, so ``axes.tables()`` and the grid leave them out.
"""

from ..modules.value_residual import MODES, attach_value_residual
from ..validation import PluginOptionError, check_bool, check_choice
from .choice import (
    KEEPS_PACE,
    Choice,
    Option,
    drop_if_stored,
    is_set,
    refuse_checkpointing,
    set_defaults,
)


class ValueResidual(Choice):
    axis = "value_residual"


class NoValueResidual(ValueResidual):
    name, source = "none", "no value residual"
    paper, code, preset = "", "", None  # the default
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), ()


class DecoderValueResidual(ValueResidual):
    name, source = "decoder", "ResFormer's value residual (arXiv:2410.17897)"
    paper, code, preset = "https://arxiv.org/abs/2410.17897", "https://github.com/Zcchill/Value-Residual-Learning", None
    # not refused today, though a pruned first layer hands the v_1 role to a layer trained without it
    prunes = None
    # not refused cleanly either: torch.jit.script stops at attach()'s forward hook with a compiler error
    scripts = "attach() registers a Python lambda as a forward hook (clearing the v_1 store), which TorchScript cannot compile"
    activation_checkpointing = ("every layer mixes in the first layer's values v_1, which the stack passes between "
                                "layers and a recomputed layer does not see")  # fmt: skip
    double_backward = None
    float32 = ("the token gate's sigmoid (--value-residual-mode token)",)
    speed = ()


class BothValueResidual(DecoderValueResidual):
    name, preset, speed = "both", "value_residual", KEEPS_PACE


VALUE_RESIDUALS: dict[str, type[ValueResidual]] = {c.name: c for c in (NoValueResidual, DecoderValueResidual,
                                                                         BothValueResidual)}  # fmt: skip
SIDES = tuple(VALUE_RESIDUALS)  # none, decoder, both


OPTIONS = (
    Option("value_residual", check_choice, (SIDES,), "none", "WHERE",
           "value residual (ResFormer, arXiv:2410.17897): none (default), decoder (decoder self-attention, as "
           "the paper's decoder-only models) or both (encoder self-attention too)"),
    Option("value_residual_mode", check_choice, (tuple(m for m in MODES if m != "constant"),), "identity", "MODE",
           "identity (default: lambda = 0.5, 0.5, the paper and the authors' code), learnable "
           "(Learnable-ResFormer, init 0.5, 0.5) or token (x-transformers' per-token gate, not in the paper); the "
           "module's constant mode needs lambdas and is not an option"),
    Option("value_residual_cross", check_bool, (), False, "BOOL",
           "also mix decoder layer 1's cross-attention values into later layers' (default false: the paper "
           "has no cross-attention); not with --value-residual-mode token", const=True),
)  # fmt: skip


def add_args(parser) -> None:
    for option in OPTIONS:
        option.add(parser)


def defaults(args) -> None:
    """--value-residual none, and the other two only for a model that reads them (a default filled where nothing
    reads it would be stored in checkpoints as if it were read)."""
    set_defaults(args, {OPTIONS[0].name: OPTIONS[0].default})
    if args.value_residual != "none":
        set_defaults(args, {option.name: option.default for option in OPTIONS[1:]})


def check(args, plan) -> None:
    OPTIONS[0].validate(args)
    if args.value_residual == "none":
        for option in OPTIONS[1:]:  # read only by the mixes, which --value-residual none does not install
            if is_set(args, option.name) and not drop_if_stored(args, option.name):
                raise PluginOptionError(
                    f"--{option.name.replace('_', '-')} needs --value-residual decoder or both: the model has "
                    "--value-residual none, so it would be ignored; drop it or choose one of those"
                )
        return
    for option in OPTIONS[1:]:
        option.validate(args)
    choice = VALUE_RESIDUALS[args.value_residual]
    label = choice.label()
    refuse_checkpointing(args, label, choice.activation_checkpointing)
    for side in ("decoder", "encoder") if args.value_residual == "both" else ("decoder",):
        if (getattr(args, f"{side}_layerdrop", 0) or 0) != 0:  # != 0, not > 0: NaN is refused too
            raise PluginOptionError(
                f"--{side}-layerdrop cannot be used with {label}: a dropped first layer leaves the later layers "
                f"without the values v_1 they mix in; use --{side}-layerdrop 0"
            )
    if args.value_residual_cross and args.value_residual_mode == "token":
        raise PluginOptionError(
            "--value-residual-cross cannot be used with --value-residual-mode token: its gate is indexed by "
            "target position and cross-attention's values by source position; use identity or learnable"
        )
    if "value" in plan.tying.blocks:
        raise PluginOptionError(
            f"{label} cannot be combined with {plan.tying.label()}: tying shares v_proj between adjacent layers "
            "as a bare Linear, and the value residual replaces v_proj by its mixing projection"
        )
    if plan.residual.name == "hybrid":
        raise PluginOptionError(
            f"{label} cannot be combined with {plan.residual.label()}: HybridNorm's N_v and the value residual "
            "both replace v_proj (modules/hybrid_norm.check_plain_linear)"
        )


def attach(model, args) -> None:
    """Install the mixes. The stack's last layer takes V_1 out of the store; the hook also clears it after every
    call through the module, for a pass that stopped before the last layer (an exception)."""
    if args.value_residual == "none":
        return
    wired = [("decoder", "self_attn", False)]
    if args.value_residual == "both":
        wired.append(("encoder", "self_attn", False))
    if args.value_residual_cross:
        wired.append(("decoder", "encoder_attn", True))
    stores = {}
    for side, attr, cross in wired:
        layers = getattr(getattr(model, side, None), "layers", None)
        if not layers:
            continue  # a language model's NoEncoder
        attentions = [getattr(layer, attr) for layer in layers if getattr(layer, attr, None) is not None]
        stores[side] = attach_value_residual(attentions, args.value_residual_mode, cross_attention=cross,
                                             store=stores.get(side))  # fmt: skip
    for side, store in stores.items():
        getattr(model, side).register_forward_hook(lambda module, inputs, output, store=store: store.clear())
