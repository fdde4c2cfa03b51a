"""The 2024-26 stream-carry ideas as ``--depth-aggregation`` choices (their entries join AGGREGATIONS).

    mhc        mHC (arXiv:2512.24880): n streams, H_res doubly stochastic by Sinkhorn       modules/mhc.py
    mhc-lite   mHC-lite (arXiv:2601.05732): H_res a convex combination of permutations     modules/mhc.py
    attnres    Full AttnRes (arXiv:2603.15031): softmax over all earlier sublayer outputs   modules/attn_res.py
    attnres-block  Block AttnRes: over block sums of S sublayers (--attnres-block-size)   modules/attn_res.py
    mudd       MUDDFormer (arXiv:2502.12170): Q/K/V/R ways from all earlier layer outputs  modules/muddformer.py
    frac       frac-connections (arXiv:2503.14125): HC's matrices across m fractions of C  modules/frac_connections.py
    lime       LIMe (arXiv:2502.09245): each layer's keys/values routed from all earlier    modules/lime.py
               layers' keys/values (not a stream carry: it wraps the self-attentions' k/v_proj, owns nothing)

Like hyper-connections they own the carry between layers (``owns = {"stream"}``) and build their layers
(carry_stack.py's Pre-LN sublayers on their sites, MUDD its own): they refuse the other stream owners and the
residual choices that act on the stream at the sum (their ``stream_site``), and run the others' change of each
branch (``branch_change``: LayerScale, ReZero, Peri-LN, T-Fixup, NormFormer; modules/site_layers.py's
``BranchChange``; MUDD only those that keep the sublayer norms its ways read).
mHC, mHC-lite, frac, the AttnRes pair and MUDD are ``CarryAggregation`` choices: their carry (modules/carry.py)
is all they add to the one carry stack (modules/carry_stack.py).
"""

from dataclasses import replace

from ..modules.attn_res import AttnResCarry
from ..modules.carry import Carry
from ..modules.frac_connections import FracCarry
from ..modules.layer_stack import (
    FactoryDecoder,
    FactoryEncoder,
    _refuse_unless_scriptable,
)
from ..modules.lime import INITS as LIME_INITS
from ..modules.lime import attach_lime
from ..modules.mhc import BIAS_INITS, ManifoldHyperConnection, StreamCarry
from ..modules.muddformer import MUDDCarry
from ..validation import PluginOptionError, check_choice, check_float, check_int
from .aggregation import LAYER_LOOP, POSITION_INDEXED, Aggregation, CarryAggregation
from .choice import AGGREGATES, Option, refuse_checkpointing, set_defaults_since

MAX_RATE = 16


class MHC(CarryAggregation):
    name, source = "mhc", "mHC (Xie et al., DeepSeek, arXiv:2512.24880)"
    residual = "sinkhorn"
    # DeepSeek's own mHC code (2026-04, after the paper): kernels and a functional layer whose callers pass phi, alpha
    # and b, so it fixes no starting values (issue 55: the default start stays the mhc-lite authors' code's)
    paper, code, preset = "https://arxiv.org/abs/2512.24880", "https://github.com/deepseek-ai/TileKernels", "mhc"
    prunes, scripts, activation_checkpointing = POSITION_INDEXED, LAYER_LOOP, None
    double_backward = ("mhc.py: the Sinkhorn normalisation (kernels/sinkhorn.py) and skinny.py's RMS-scaled "
                       "coefficient product treat saved forward intermediates as constants")  # fmt: skip
    float32 = ("the coefficients H_pre, H_post, H_res and the Sinkhorn iterations (the mixing in the streams' dtype)",)
    speed = AGGREGATES
    options = (
        Option("mhc_rate", check_int, (1, MAX_RATE), 4, "N",
               f"mHC/mHC-lite: streams per token n (default 4, the paper's; mhc-lite needs n! coefficients: "
               f"n <= 5); 1 <= N <= {MAX_RATE}"),
        Option("mhc_bias_init", check_choice, (BIAS_INITS,), None, "INIT",  # filled by defaults(): by origin
               "mHC's static biases b at init (the mHC paper states none): mhc_lite (default: the authors' line of "
               "code, FFTYYY/mhc-lite@ea19775 hyper_conn/mhc.py and mhc_lite.py: b_pre = b_post = +1 on stream "
               "k mod n and -1 elsewhere, so H_pre 0.73 / 0.27 and H_post 1.46 / 0.54; H_res logits 0 / -8, "
               "~ I), preln (HC's init through mHC's constraints: H_post = 1, every stream equals the Pre-LN "
               "state at init; the default before issue 55, and what a checkpoint saved before then is rebuilt "
               "with) or mixed (preln with H_res starting at SK(exp I), 0.475 on the diagonal for n = 4, "
               "lucidrains' mHCv2 H_res start: the streams mix from the first step; still Pre-LN at init)"),
    )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        set_defaults_since(args, {"mhc_bias_init": "mhc_lite"}, {"mhc_bias_init": "preln"})
        super().defaults(args)

    @classmethod
    def carry(cls, args) -> Carry:
        return StreamCarry(args.mhc_rate, ManifoldHyperConnection, residual=cls.residual, bias_init=args.mhc_bias_init)


class MHCLite(MHC):
    name, source = "mhc-lite", "mHC-lite (Yang & Gao, arXiv:2601.05732)"
    residual, max_rate = "permutations", 5
    paper, code, preset = "https://arxiv.org/abs/2601.05732", "https://github.com/FFTYYY/mhc-lite", "mhc_lite"
    double_backward = "mhc.py: skinny.py's RMS-scaled coefficient product treats saved forward intermediates as constants"
    float32 = ("the coefficients H_pre, H_post, H_res (the mixing in the streams' dtype)",)

    @classmethod
    def check(cls, args) -> None:
        if args.mhc_rate is not None and not 1 <= int(args.mhc_rate) <= cls.max_rate:
            raise PluginOptionError(
                f"--mhc-rate must be in [1, 5] with {cls.label()}: H_res mixes the n! permutation matrices, got "
                f"{args.mhc_rate}"
            )
        super().check(args)


FRAC_MODES = ("dynamic", "static")


class Frac(CarryAggregation):
    name, source = "frac", "frac-connections (Zhu et al., arXiv:2503.14125)"
    paper, code, preset = "https://arxiv.org/abs/2503.14125", "", "frac"
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = double_backward = None
    float32 = ("the coefficient maths (LayerNorm, products with W, tanh; the mixing in the input dtype)",)
    speed = AGGREGATES
    options = (
        Option("frac_rate", check_int, (1, 64), 2, "M",
               "frac-connections: fractions m of the C-wide state, must divide the embedding width (default 2; "
               "the paper runs m = 2 and 4); 1 <= M <= 64"),
        Option("frac_mode", check_choice, (FRAC_MODES,), "dynamic", "MODE",
               "dynamic (default, eq. 11-14) or static (eq. 8) frac-connections"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        for side in ("encoder", "decoder"):
            width = getattr(args, f"{side}_embed_dim")
            if width % args.frac_rate:
                raise PluginOptionError(
                    f"--frac-rate {args.frac_rate} must divide --{side}-embed-dim {width} (m fractions of C)"
                )

    @classmethod
    def carry(cls, args) -> Carry:
        return FracCarry(args.frac_rate, args.frac_mode == "dynamic")


class AttnRes(CarryAggregation):
    name, source = "attnres", "Attention Residuals, Full (Kimi Team, arXiv:2603.15031)"
    min_layers = 1
    paper, code, preset = "https://arxiv.org/abs/2603.15031", "https://github.com/MoonshotAI/Attention-Residuals", "attnres"
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = ("every sublayer reads the completed blocks of the whole stack and their logits, kept in "
                                "one state per forward pass that a recomputed layer would extend a second time")
    double_backward = "attn_res.py: its backward accumulates into buffers shared by the forward pass, outside autograd"
    float32 = ("the logits, RMS and softmax over depth (the weighted sum at least in the stream's dtype)",)
    speed = AGGREGATES
    options = (
        Option("attnres_block_size", check_int, (1, 10_000), 1, "S",  # 1: Full AttnRes; AttnResBlock's is 6
               "Block AttnRes: sublayers per block S (default 6, the paper's Kimi Linear setting and a multiple "
               "of the encoder's 2 and the decoder's 3 sublayers per layer; the paper found S = 2-8 equally "
               "good); S >= 1, only with --depth-aggregation attnres-block"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        refuse_checkpointing(args, cls.label(), cls.activation_checkpointing)
        if cls.name == "attnres" and args.attnres_block_size != 1:
            raise PluginOptionError(
                "--attnres-block-size must be 1 with --depth-aggregation attnres (Full AttnRes); use "
                "--depth-aggregation attnres-block for blocks"
            )

    @classmethod
    def carry(cls, args) -> Carry:
        return AttnResCarry(args.attnres_block_size)


class AttnResBlock(AttnRes):
    name, source = "attnres-block", "Attention Residuals, Block (Kimi Team, arXiv:2603.15031, eq. 5-6)"
    preset = "attnres_block"
    options = (replace(AttnRes.options[0], default=6),)


class MUDD(CarryAggregation):
    name, source = "mudd", "MUDDFormer (Xiao et al., arXiv:2502.12170)"
    owns, own_layers, min_layers = frozenset({"stream"}), True, 1
    paper, code, preset = "https://arxiv.org/abs/2502.12170", "https://github.com/Caiyun-AI/MUDDFormer", "mudd"
    prunes, scripts = POSITION_INDEXED, LAYER_LOOP
    activation_checkpointing = ("every layer reads the outputs of all earlier layers, gathered once per forward pass "
                                "in one state that a recomputed layer would extend a second time")
    double_backward = "muddformer.py: its backward accumulates into buffers shared by the forward pass, outside autograd"
    float32 = ("the MLP and the weights A over the earlier layers",)
    speed = AGGREGATES

    @classmethod
    def conflict(cls, other) -> str | None:
        if other.axis == "residual" and other.stream_site is None and not other.sublayer_norms:
            return (f"MUDD normalises each of its Q, K and V ways with its own LayerNorm (eq. 7), and {other.name}'s "
                    "sublayers have no input norm")  # fmt: skip
        return super().conflict(other)

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        refuse_checkpointing(args, cls.label(), cls.activation_checkpointing)

    @classmethod
    def carry(cls, args) -> Carry:
        return MUDDCarry()


LIME_SCRIPTS = ("its k/v projections share a per-pass Python store of the stack's keys and values, which "
                "TorchScript cannot compile")


class LimeEncoder(FactoryEncoder):
    """``none``'s encoder (fairseq's loop), refusing torch.jit.script with LIMe's reason, not a compiler error."""

    torchscript, torchscript_unsupported_reason = False, LIME_SCRIPTS
    __prepare_scriptable__ = _refuse_unless_scriptable  # layer_stack.py's refusal, shared by its stacks


class LimeDecoder(FactoryDecoder):
    """``none``'s decoder, refusing torch.jit.script as LimeEncoder."""

    torchscript, torchscript_unsupported_reason = False, LIME_SCRIPTS
    __prepare_scriptable__ = _refuse_unless_scriptable


class LIMe(Aggregation):
    """Built as ``none`` (the residual axis's layers in fairseq's loop), then every self-attention's k_proj and
    v_proj of each stack is replaced by LIMe's routing projections (modules/lime.py)."""

    name, source = "lime", "LIMe, Layer-Integrated Memory (Gerasimov et al., arXiv:2502.09245 v2)"
    owns, min_layers = frozenset(), 1  # neither the carry nor the layer's forward: only k_proj and v_proj
    paper, code, preset = "https://arxiv.org/abs/2502.09245", "https://github.com/corl-team/lime", "lime"
    prunes = POSITION_INDEXED
    scripts = LIME_SCRIPTS
    activation_checkpointing = ("every layer's k/v projections read the keys and values the earlier layers left in "
                                "one store per forward pass, which a recomputed layer would extend a second time")
    double_backward = None  # autograd ops only
    float32 = ()  # a linear mix of the projections' outputs, no reduction beyond fairseq's own
    speed = AGGREGATES  # met in CPU time at E12D12: train 0.92, decode 0.94 (docs/speed.md "nGPT and LIMe")
    options = (
        Option("lime_init", check_choice, (LIME_INITS,), "uniform", "INIT",
               "LIMe's routes at init: uniform (default, the authors' code corl-team/lime src/lm/lime.py "
               "StaticRouter: each entry U(+-sqrt(3/((l+1)H))), the layer's own heads the identity) or identity "
               "(ours: the earlier layers' weights 0, so the model starts as its --residual choice without LIMe)"),
        Option("lime_router_lr_scale", check_float, (0.0, 1000.0, True), 10.0, "C",
               "LIMe's routes are stored divided by C and used times C, so Adam moves them C times faster than the "
               "other weights (C^2 under SGD); 0 < C <= 1000 (default 10: the authors' router_lr 1e-2 over lr "
               "1e-3, corl-team/lime config.py). Their gradient enters --clip-norm C times larger"),
    )  # fmt: skip

    @classmethod
    def conflict(cls, other) -> str | None:
        if other.axis == "residual" and "stream" in other.owns:
            return f"{other.name} builds its own stacks, whose attentions LIMe would not reach"
        if other.axis == "residual" and other.name in ("hybrid", "ngpt"):
            return f"LIMe and {other.name} both replace the self-attention's k_proj (and v_proj)"
        if other.axis == "tying" and {"key-query", "value"} & set(other.blocks):
            return ("tying shares k_proj or v_proj between adjacent layers as a bare Linear, which would drop "
                    "LIMe's routes")
        return super().conflict(other)

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        refuse_checkpointing(args, cls.label(), cls.activation_checkpointing)
        value_residual = getattr(args, "value_residual", None)
        if value_residual not in (None, "none"):
            raise PluginOptionError(
                f"--value-residual {value_residual} cannot be combined with {cls.label()}: both replace the "
                "self-attention's v_proj (ResFormer's mix is one fixed LIMe route); use --value-residual none"
            )

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        return LimeEncoder, LimeDecoder

    @classmethod
    def attach(cls, stack, args):
        attach_lime([layer.self_attn for layer in stack.layers], args.lime_init, args.lime_router_lr_scale)
        return stack

    @classmethod
    def encoder(cls, cfg, dictionary, embed_tokens, args, make_layer, change=None):
        return cls.attach(super().encoder(cfg, dictionary, embed_tokens, args, make_layer, change), args)

    @classmethod
    def decoder(cls, cfg, dictionary, embed_tokens, args, make_layer, no_encoder_attn, change=None):
        return cls.attach(super().decoder(cfg, dictionary, embed_tokens, args, make_layer, no_encoder_attn, change),
                          args)  # fmt: skip


STREAM_AGGREGATIONS = (MHC, MHCLite, AttnRes, AttnResBlock, Frac, MUDD, LIMe)
