"""Axis ``--depth-aggregation``: how a layer reads the earlier layers.

A choice builds the encoder and the decoder (``build_stack(side, cfg, dictionary, embed_tokens, args,
make_layer, no_encoder_attn)``): every choice but ``none`` is a ``LayerStackEncoder``/``LayerStackDecoder``
(modules/layer_stack.py) whose ``begin_layers``/``run_layer``/``end_layers`` thread its carry between layers.
Choices that treat a layer as a black box x -> y (``none``, DenseFormer, DLCL, LAuReL) build every layer with
``make_layer``, the residual axis's factory, so they compose with every residual choice that does not own the
carry itself; choices whose layers read their inputs differently (DCA: GRN mixtures as queries, keys and
values; hyper-connections: n streams per token) build their own Pre-LN layers (``own_layers``), whose every
sublayer branch a residual choice may change when its update is a function of the branch alone (its
``branch_change``: LayerScale, ReZero, Peri-LN, T-Fixup, NormFormer; modules/site_layers.py's ``BranchChange``
states the composed maths); the other residual choices act on the stream at the sum, which these own, and
declare what (``stream_site``, their refusal here). The math is in ``fairseq_plugins/modules/`` (dca.py,
depth_stack.py and grn.py for DCA, depth_aggregation.py, laurel.py, hyper_connections.py).

The stream-carry ideas (hyper-connections here; mHC, mHC-lite, frac-connections, Full and Block AttnRes in
aggregation_streams.py), DCA and the between-layer ideas (DenseFormer, DLCL, LAuReL) are ``CarryAggregation``
choices: each declares its carry (modules/carry.py: a site factory or its own layers, ``begin``,
``layer_input``/``call_layer``, ``after_layer``, ``end``/``output``), and one encoder and one decoder run them
all (modules/carry_stack.py).
"""

from ..modules.carry import Carry
from ..modules.carry_stack import CarryDecoder, CarryEncoder
from ..modules.dca import DCACarry
from ..modules.depth_aggregation import (
    DLCL_INITS,
    DenseFormerCarry,
    DepthWeightedAverages,
    DLCLCarry,
    DynamicLinearCombination,
)
from ..modules.depth_stack import DCA_MODES
from ..modules.grn import GRN
from ..modules.hyper_connections import MODES as HC_MODES
from ..modules.hyper_connections import HyperConnection
from ..modules.laurel import RW_NORMS, VARIANTS, LaurelCarry, LaurelConnection
from ..modules.layer_stack import FactoryDecoder, FactoryEncoder, build_with_layers
from ..modules.mhc import StreamCarry
from ..validation import PluginOptionError, check_choice, check_int
from .choice import AGGREGATES, Choice, Option, Speed, set_defaults

# the declared reasons shared by the layer-stack choices (each choice declares them itself)
POSITION_INDEXED = "its weights are sized and indexed by each layer's position in the stack"
LAYER_LOOP = "its layer loop threads state through hooks TorchScript cannot compile"  # modules/layer_stack.py's


def check_position_indexed(args, who: str, why: str = POSITION_INDEXED) -> None:
    """Reject what a stack whose weights are indexed by layer position cannot run, naming the option."""
    for side in ("encoder", "decoder"):
        if (getattr(args, f"{side}_layerdrop", 0) or 0) != 0 or getattr(args, f"{side}_layers_to_keep", None):
            raise PluginOptionError(f"--{side}-layerdrop and --{side}-layers-to-keep cannot be used with {who}: {why}")
    if getattr(args, "cross_self_attention", False):
        raise PluginOptionError(f"--cross-self-attention cannot be used with {who}")


class Aggregation(Choice):
    axis = "depth_aggregation"
    family = ""  # the model name of the presets that used it before issue 26 (named in its errors)
    own_layers = False  # True: builds its own Pre-LN layers (a residual choice changes their branches or is refused)
    pinned: tuple[str, str] | None = None  # (option, value) the choice's name sets: LAuReL's variant, HC's mode
    min_layers = 0  # a stack with fewer layers has nothing to aggregate over (its modules refuse to build)

    @classmethod
    def who(cls) -> str:
        return f"{cls.family} ({cls.label()})" if cls.family else cls.label()

    @classmethod
    def conflict(cls, other) -> str | None:
        if cls.own_layers and other.axis == "residual" and other.stream_site is not None:
            return str(other.stream_site)  # what the residual choice does at the sum, which this choice's site owns
        return None

    @classmethod
    def defaults(cls, args) -> None:
        if cls.pinned:
            set_defaults(args, dict([cls.pinned]))
        super().defaults(args)

    @classmethod
    def check(cls, args) -> None:
        check_position_indexed(args, cls.who(), cls.prunes)
        for side in ("encoder", "decoder"):
            layers = getattr(args, f"{side}_layers", None)  # None: a language model has no encoder
            if layers is not None and int(layers) < cls.min_layers:
                raise PluginOptionError(
                    f"--{side}-layers must be at least {cls.min_layers} with {cls.label()}, got {layers}"
                )
        cls.check_options(args)
        if cls.pinned and getattr(args, cls.pinned[0]) != cls.pinned[1]:
            option = cls.pinned[0]
            raise PluginOptionError(f"--{option.replace('_', '-')} {getattr(args, option)} contradicts {cls.label()}")

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        """The encoder and decoder classes (modules/: imports run models -> axes -> modules)."""
        raise NotImplementedError

    @classmethod
    def stack_args(cls, args) -> tuple:
        """What the stacks take after (cfg, dictionary, embed_tokens): the choice's options."""
        return ()

    @classmethod
    def build(cls, stack, make_layer, *args, **kwargs):
        # a choice with its own layers has no use for the residual axis' layer factory
        return stack(*args, **kwargs) if cls.own_layers else build_with_layers(stack, make_layer, *args, **kwargs)

    @classmethod
    def stack_kwargs(cls, change) -> dict:
        """What the stacks take by keyword from the residual choice: its ``branch_change`` (site_layers.py's
        ``BranchChange``), for a choice that builds its own layers; None: the layers are the carry's alone."""
        return {}

    @classmethod
    def encoder(cls, cfg, dictionary, embed_tokens, args, make_layer, change=None):
        return cls.build(cls.stacks()[0], make_layer, cfg, dictionary, embed_tokens, *cls.stack_args(args),
                         **cls.stack_kwargs(change))  # fmt: skip

    @classmethod
    def decoder(cls, cfg, dictionary, embed_tokens, args, make_layer, no_encoder_attn, change=None):
        return cls.build(cls.stacks()[1], make_layer, cfg, dictionary, embed_tokens, *cls.stack_args(args),
                         no_encoder_attn=no_encoder_attn, **cls.stack_kwargs(change))  # fmt: skip


class NoAggregation(Aggregation):
    name, source = "none", "the residual stream alone (fairseq's layer loop)"
    paper, code, preset = "", "", None  # the default: every preset without an aggregation
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), ()

    @classmethod
    def check(cls, args) -> None:
        pass  # fairseq's own loop: layer drop and pruning work as in fairseq

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        return FactoryEncoder, FactoryDecoder


class CarryAggregation(Aggregation):
    """An idea declared by its carry (``carry``, modules/carry.py): the carry and its modules are all it adds,
    the stacks are carry_stack.py's. A stream-carry idea runs that module's Pre-LN layers on its sites, and DCA
    and MUDD their own layers (their carries build them), whose branches the residual choice's ``branch_change``
    changes (``own_layers``; the other residual choices are refused by ``conflict``); a between-layer idea
    (DenseFormer, DLCL, LAuReL) sets ``own_layers = False`` and runs the residual axis's layers."""

    owns, own_layers = frozenset({"stream"}), True

    @classmethod
    def carry(cls, args) -> Carry:
        """The carry of one stack (encoder or decoder) from the choice's options."""
        raise NotImplementedError

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        return CarryEncoder, CarryDecoder

    @classmethod
    def stack_args(cls, args) -> tuple:
        return (cls.carry(args),)

    @classmethod
    def stack_kwargs(cls, change) -> dict:
        return {"change": change} if cls.own_layers and change is not None else {}


MAX_DCA_K = 10_000  # parse-time bound only; check bounds k by the model's depth


class DCA(CarryAggregation):
    name, source, family = "dca", "DeepCrossAttention (arXiv:2502.06785)", "dca_transformer"
    owns, own_layers = frozenset({"stream"}), True
    default_k = 0
    paper, code, preset = "https://arxiv.org/abs/2502.06785", "", "dca"
    # the texts of its refusals (check, and DCACarry's torchscript_unsupported_reason in modules/dca.py)
    prunes = "every layer owns GRNs sized by its position in the stack"
    scripts = ("DeepCrossAttention's GRNs and depth stack run hand-written torch.autograd.Function subclasses, its "
               "layers take the stack as a variable number of chunks and its layer loop carries a Python DepthStack")
    activation_checkpointing = None
    double_backward = "grn.py: the GRNs' hand-written backward (fused kernels and PyTorch alike) is once-differentiable"
    float32 = (GRN, "the stack of layer outputs (float32 by type promotion)")
    speed = (Speed("train", ">=", 0.90, "e12d12"), Speed("train", ">=", 0.85, "e18d18"), Speed("decode", ">=", 0.90))
    options = (
        Option("dca_mode", check_choice, (tuple(DCA_MODES),), "dca", "MODE",
               "how a layer reads the stack of earlier outputs: dca (default; three GRN-v3 give the "
               "self-attention's queries, keys and values, paper section 3.2) or grn-v1 | grn-v2 | grn-v3 (one "
               "GRN of that version gives the layer's input; the ablation of paper table 7)"),
        Option("dca_k", check_int, (0, MAX_DCA_K), None, "K",  # default: default_k, by the choice
               "k-DCA: the stack holds the embedding, the sum of the middle outputs and the last K outputs, "
               "so cost stays flat with depth (paper section 3.1). 0 keeps every output (default of --depth-"
               "aggregation dca; dca-k defaults to 2, the paper's example); 0 <= K <= the number of layers of the "
               "deeper side"),
    )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        super().defaults(args)
        set_defaults(args, {"dca_k": cls.default_k})

    @classmethod
    def conflict(cls, other) -> str | None:
        if other.axis == "norm" and other.name != "layernorm":
            return "DCA's GRNs are fused with the LayerNorm that follows them (modules/grn.py and its kernels)"
        if other.axis == "residual" and other.stream_site is None and not other.sublayer_norms:
            return (f"DCA's attention reads LN(GRN(G)) for its queries, keys and values (the norm fused with the "
                    f"GRNs), and {other.name}'s sublayers have no input norm")  # fmt: skip
        return super().conflict(other)

    @classmethod
    def check(cls, args) -> None:
        """Reject options outside their range or that DCA's layers do not implement, naming them (also run by
        scripts/training/retrofit_dca.py)."""
        args.dca_mode = check_choice("dca_mode", args.dca_mode, tuple(DCA_MODES))
        depth = max(args.encoder_layers, args.decoder_layers)
        try:
            args.dca_k = check_int("dca_k", args.dca_k, 0, depth)
        except PluginOptionError as err:
            raise PluginOptionError(
                f"{err} (0 keeps every layer output; k = the number of layers already does, so larger k is "
                f"rejected; the deeper side has {depth} layers)"
            ) from None
        for side in ("encoder", "decoder"):
            if not getattr(args, f"{side}_normalize_before", False):
                raise PluginOptionError(
                    f"{cls.who()} needs --{side}-normalize-before: DCA is built on Pre-LN layers "
                    "(the GRNs replace the Pre-LN residual stream)"
                )
        check_position_indexed(args, cls.who(), cls.prunes)

    @classmethod
    def carry(cls, args) -> Carry:
        return DCACarry(args.dca_mode, args.dca_k)


class DCAK(DCA):
    name, default_k = "dca-k", 2
    preset = "dca_k2"
    # issue 15, item 1: k-DCA keeps pace with Pre-LN, and its training ratio stays flat with depth
    speed = (Speed("train", ">=", 0.95), Speed("decode", ">=", 0.95), Speed("memory", "<=", 1.10),
             Speed("train_flat", ">=", 0.95))  # fmt: skip


MAX_PERIOD = 10_000  # k or p beyond a stack's depth is allowed and degenerate (the baseline)


class DenseFormer(CarryAggregation):
    name, source, family = "denseformer", "DenseFormer (arXiv:2402.02622)", "denseformer_transformer"
    owns, own_layers = frozenset({"stream"}), False
    paper, code, preset = "https://arxiv.org/abs/2402.02622", "https://github.com/epfml/DenseFormer", "denseformer"
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = double_backward = None
    float32, speed = (DepthWeightedAverages, "the stack of layer outputs (float32 by type promotion)"), AGGREGATES
    options = (
        Option("denseformer_dilation", check_int, (1, MAX_PERIOD), 1, "K",
               "dilation k: DWA i averages X_j for j = i mod k (paper section 3.3); "
               "1 (default) averages every earlier output; 1 <= K <= 10000"),
        Option("denseformer_period", check_int, (1, MAX_PERIOD), 1, "P",
               "period p: a DWA follows only the blocks i with i mod p = 0 (section 3.3); "
               "1 (default) after every block; 1 <= P <= 10000"),
    )  # fmt: skip

    @classmethod
    def carry(cls, args) -> Carry:
        return DenseFormerCarry(args.denseformer_dilation, args.denseformer_period)


class DLCL(CarryAggregation):
    name, source, family = "dlcl", "DLCL (Wang et al., ACL 2019)", "dlcl_transformer"
    owns, own_layers = frozenset({"stream"}), False
    paper, code, preset = "https://arxiv.org/abs/1906.01787", "https://github.com/wangqiangneu/dlcl", "dlcl"
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = double_backward = None
    float32, speed = (DynamicLinearCombination,), AGGREGATES
    options = (
        Option("dlcl_init", check_choice, (DLCL_INITS,), "avg", "INIT",
               "initial weights W of the lower triangle: avg (default, the authors' choice: row l = "
               "1/(l+1), each layer starts from the average of the earlier outputs) or one (all 1)"),
    )  # fmt: skip

    @classmethod
    def carry(cls, args) -> Carry:
        # export: fairseq's LayerNorm choice for the LN_k (cfg.export, read from args)
        return DLCLCarry(args.dlcl_init, export=getattr(args, "export", False))


MAX_LAUREL_RANK, MAX_LAUREL_PA_K = 65_536, 64


LAUREL_VARIANT = Option("laurel_variant", check_choice, (VARIANTS,), "lr", "V",
                        "rw (learned residual weights, section 2.1), lr (low-rank B A x added to the skip, eq. 3) or "
                        "pa (low-rank mix of the last k streams, eq. 4); set by the laurel_rw/lr/pa presets")
LAUREL_RW_NORM = Option("laurel_rw_norm", check_choice, (RW_NORMS,), "softmax", "N",
                        "rw: softmax (default: (alpha, beta) = softmax of two logits from 0, i.e. 0.5/0.5; the paper, "
                        "section 2.1, says the learned weights must be bounded in practice, by softmax or sigmoid) or "
                        "none (alpha, beta learned directly from 1, unbounded, the Pre-LN baseline at initialisation; "
                        "this plugin's default until issue 26); one of none, softmax")
LAUREL_RANK = Option("laurel_rank", check_int, (1, MAX_LAUREL_RANK), 32, "R",
                     "lr and pa: rank r of B A (default 32, the paper's ablation value; 4 and 64 for its 1B and 4B "
                     "LLMs); 1 <= R <= 65536")
LAUREL_PA_K = Option("laurel_pa_k", check_int, (1, MAX_LAUREL_PA_K), 3, "K",
                     f"pa: how many streams x_i, x_{{i-1}}, ... are mixed (default 3, the paper's ablation); "
                     f"1 <= K <= {MAX_LAUREL_PA_K}")


class Laurel(CarryAggregation):
    """LAuReL; each variant declares only the options it reads (issue 56: an option another variant reads is
    refused, not ignored), in the order they are checked."""

    name, source, family = "laurel", "LAuReL (arXiv:2411.07501)", "laurel_transformer"
    owns, own_layers = frozenset({"stream"}), False
    options = (LAUREL_VARIANT, LAUREL_RW_NORM, LAUREL_RANK, LAUREL_PA_K)
    paper, code, preset = "https://arxiv.org/abs/2411.07501", "", None  # each variant names its preset
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = double_backward = None
    float32, speed = (LaurelConnection,), ()

    @classmethod
    def carry(cls, args) -> Carry:
        given = {"rank": "laurel_rank", "pa_k": "laurel_pa_k", "rw_norm": "laurel_rw_norm"}
        read = {option.name for option in cls.options}
        return LaurelCarry({"variant": args.laurel_variant, **{k: getattr(args, v) for k, v in given.items() if v in read}})


class LaurelRW(Laurel):
    name, pinned, options = "laurel-rw", ("laurel_variant", "rw"), (LAUREL_VARIANT, LAUREL_RW_NORM)
    preset = "laurel_rw"


class LaurelLR(Laurel):
    name, pinned, options = "laurel-lr", ("laurel_variant", "lr"), (LAUREL_VARIANT, LAUREL_RANK)
    preset = "laurel_lr"


class LaurelPA(Laurel):
    name, pinned, options = "laurel-pa", ("laurel_variant", "pa"), (LAUREL_VARIANT, LAUREL_RANK, LAUREL_PA_K)
    preset = "laurel_pa"


MAX_HC_RATE = 64


class HyperConnections(CarryAggregation):
    name, source, family = "hc", "Hyper-Connections (arXiv:2409.19606)", "hc_transformer"
    paper, code, preset = "https://arxiv.org/abs/2409.19606", "", None  # each mode names its preset
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = None
    double_backward = ("the fused CPU kernels (kernels/mhc_ops.py, float32 CPU streams) are once-differentiable; "
                       "FAIRSEQ_PLUGINS_MHC_KERNEL=0 runs hyper_connections.py's PyTorch code, which is not")
    # its stream mixing runs the sublayer inside its forward (wrapping it would run the sublayer in float32 too);
    # the mixing weights are tanh-bounded
    float32, speed = (), AGGREGATES
    options = (
        Option("hc_mode", check_choice, (HC_MODES,), None, "MODE",  # set by the choice's name (pinned)
               "static (SHC: learned A_m, A_r, B) or dynamic (DHC: plus input-dependent tanh terms, section "
               "2.3); set by the hc_static/hc_dynamic presets"),
        Option("hc_rate", check_int, (1, MAX_HC_RATE), 4, "N",
               f"expansion rate n, the streams per token (default 4, the paper's main setting; n = 1 gave no "
               f"gain there); 1 <= N <= {MAX_HC_RATE}"),
    )  # fmt: skip

    @classmethod
    def carry(cls, args) -> Carry:
        # export: fairseq's LayerNorm choice for the dynamic coefficients' norm (cfg.export, read from args)
        return StreamCarry(args.hc_rate, HyperConnection, dynamic=args.hc_mode == "dynamic",
                           export=getattr(args, "export", False))  # fmt: skip


class HCStatic(HyperConnections):
    name, pinned, preset = "hc-static", ("hc_mode", "static"), "hc_static"


class HCDynamic(HyperConnections):
    name, pinned, preset = "hc-dynamic", ("hc_mode", "dynamic"), "hc_dynamic"


# this module's choices, in the order of the docs and the grid (the package joins them with aggregation_streams.py's)
LAYER_AGGREGATIONS = (NoAggregation, DCA, DCAK, DenseFormer, DLCL, LaurelRW, LaurelLR, LaurelPA, HCStatic, HCDynamic)
