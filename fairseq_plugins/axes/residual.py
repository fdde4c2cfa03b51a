"""Axis ``--residual``: how a sublayer's output joins the residual stream.

A choice builds the layers (``encoder_layer(cfg, args)``, ``decoder_layer(cfg, args, no_encoder_attn)``),
states the LayerNorm position its layers need (``pre_ln``; the composed model sets fairseq's
``--{encoder,decoder}-normalize-before`` from it), may re-initialise the built model (``initialize``, before
tying), may keep model-level state (``prepare``, ``before_forward``), and may own the carry between layers
(``build_stack``: ResiDual's dual stream). The math of each idea lives in ``fairseq_plugins/modules/``:

    post, pre     fairseq's own layers (Post-LN / Pre-LN)
    resi-dual     modules/dual_residual.py (ResiDual, arXiv:2304.14802): Post-LN layers + a dual stream
    deepnet       modules/residual_wiring.py (DeepNet, arXiv:2203.00555): x <- LN(alpha x + F(x)), beta init
    admin         modules/admin.py (Admin, arXiv:2004.08249): x <- LN(omega x + F(x)), omega profiled
    tfixup        modules/residual_wiring.py (T-Fixup, ICML 2020): no LayerNorm, depth-scaled init
    b2t           modules/residual_wiring.py (B2T, Findings of ACL 2023): the layer input joins the last sum
    normformer    modules/normformer.py (NormFormer, arXiv:2110.09456): Pre-LN plus three extra operations
    layerscale, rezero, orthogonal, peri, mix, hybrid: the 2024-26 ideas, axes/residual_sites.py

With a stream carry (``--depth-aggregation`` hc-*, mhc*, attnres*, frac: one site per sublayer owns how the
sublayer's output updates the state; dca, dca-k and mudd likewise in their own layers) a choice composes when its
update is a function of each branch alone: ``branch_change`` gives that change (modules/site_layers.py's
``BranchChange``, where the composed maths is stated), built on the carry's layers. Every other choice declares why not in ``stream_site``: what it does to the
stream at the sum, which the carry's site owns (the aggregation's refusal reads it, axes/aggregation.py).

A residual-site hook for the next ideas (LayerScale, ReZero, an orthogonal update): a layer class that
overrides fairseq's one-line ``residual_connection(x, residual)`` (or ``SiteResidual.combine(site, x,
residual)`` when the sublayer matters), plus a Choice here whose ``encoder_layer``/``decoder_layer`` build it.
"""

import copy
from functools import partial

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ..modules import admin, normformer
from ..modules import residual_wiring as rw
from ..modules.dual_residual import ResiDualDecoder, ResiDualEncoder
from ..modules.site_layers import BranchChange
from ..validation import (
    PluginOptionError,
    check_bool,
    check_choice,
    check_float,
)
from .choice import MATCHES, UNDECLARED, Choice, Option, set_defaults


def require_layer_norm_position(args, family: str, pre_ln: bool) -> None:
    """Reject an ``--{side}-normalize-before`` that contradicts the family, naming it."""
    for side in ("encoder", "decoder"):
        if bool(getattr(args, f"{side}_normalize_before", False)) != pre_ln:
            flag = f"--{side}-normalize-before"
            raise PluginOptionError(
                f"{flag} {'must be set' if pre_ln else 'cannot be used'} with {family}: its layers are "
                f"{'Pre-LN' if pre_ln else 'Post-LN'}"
            )


def layers_of(model):
    """Every layer of the model as (side, layer): the encoder's, then the decoder's, each from the bottom."""
    for side in ("encoder", "decoder"):
        for layer in getattr(model, side).layers:
            yield side, layer


def refuse_pruning(args, who: str, why: str) -> None:
    """Reject ``--{side}-layers-to-keep`` for a choice whose layers depend on the stack's depth, saying why."""
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_layers_to_keep", None) not in (None, "", []):
            raise PluginOptionError(f"--{side}-layers-to-keep cannot be used with {who}: {why}")


# why the layers of a residual choice that records its residual sites (SiteResidual) do not script: the text of
# the model's refusal (models/axes_transformer.py), which names the class and the choice
RECORDS_SITES = ("its layers record the residual sites in forward with try/finally and **kwargs, which TorchScript "
                 "cannot compile")  # fmt: skip


# the end of every ``stream_site`` reason: what both own
CARRY_OWNS = "the sum that a stream carry replaces by its own update of its state"


class Residual(Choice):
    axis = "residual"
    pre_ln = True
    family = ""  # the model name of the presets that used it before issue 26 (named in its errors)
    # with a stream carry (module docstring): None, the choice composes (``branch_change``); else why not, one line
    # in the maths naming what the choice does at the sum that the carry's site owns. Every choice declares it.
    stream_site: str | None = UNDECLARED
    sublayer_norms = True  # False: its sublayers have no input norm (F(x), not F(LN(x)))

    @classmethod
    def branch_change(cls, args) -> BranchChange | None:
        """The change of every sublayer branch on a stream carry's layers (None: none, the carry's Pre-LN
        branches), for a choice whose ``stream_site`` is None; an option of the choice that the carry cannot run
        is refused here, naming it (the model calls this among its checks)."""
        return None

    @classmethod
    def defaults(cls, args) -> None:
        super().defaults(args)
        set_defaults(args, {"encoder_normalize_before": cls.pre_ln, "decoder_normalize_before": cls.pre_ln})

    @classmethod
    def check(cls, args) -> None:
        cls.check_options(args)
        require_layer_norm_position(args, cls.who(), cls.pre_ln)

    @classmethod
    def who(cls) -> str:
        return f"{cls.family} ({cls.label()})" if cls.family else cls.label()

    @classmethod
    def encoder_layer(cls, cfg, args):
        return TransformerEncoderLayerBase(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn: bool):
        return TransformerDecoderLayerBase(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args) -> None:
        """Re-initialise the freshly built model in place (before tying; a loaded checkpoint replaces it)."""

    @classmethod
    def scriptable(cls, args) -> bool:
        return cls.scripts is None

    @classmethod
    def build_stack(cls, side: str, cfg, dictionary, embed_tokens, args, no_encoder_attn: bool = False):
        """The encoder or decoder, for a choice that owns the carry between layers; None otherwise."""
        return

    @classmethod
    def prepare(cls, model) -> None:
        """Add model-level state (a buffer, a forward pre-hook) to the new model, in its ``__init__``."""


class Pre(Residual):
    name, source = "pre", "Pre-LN, x <- x + F(LN(x)) (Xiong et al. 2020; fairseq --*-normalize-before)"
    stream_site = None  # the carries' own sublayers: no change
    paper, code, preset = "https://arxiv.org/abs/2002.04745", "", "transformer_preln"  # the benchmark's baseline
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), ()


class Post(Residual):
    name, source, pre_ln = "post", "Post-LN, x <- LN(x + F(x)) (Vaswani et al. 2017; fairseq's default)", False
    stream_site = f"Post-LN normalises the stream after each sublayer's sum, x <- LN(x + F(x)), {CARRY_OWNS}"
    paper, code, preset = "https://arxiv.org/abs/1706.03762", "https://github.com/tensorflow/tensor2tensor", "transformer_postln"
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), ()


class ResiDual(Residual):
    name, source, pre_ln, family = "resi-dual", "ResiDual (arXiv:2304.14802)", False, "residual_transformer"
    owns = frozenset({"stream", "layer"})
    # shown only if the part rule (both own the carry between layers) did not refuse first
    stream_site = f"ResiDual adds each sublayer's output to a second, unnormalised stream too, {CARRY_OWNS}"
    paper, code, preset = "https://arxiv.org/abs/2304.14802", "https://github.com/microsoft/ResiDual", "residual"
    prunes = scripts = activation_checkpointing = double_backward = None
    float32 = ("the dual stream (float32 by type promotion under autocast; --dual-residual-scale for --fp16)",)
    speed = MATCHES
    options = (
        Option("dual_residual_scale", check_float, (0.0, 1.0, True), 1.0, "S",
               "scale s of the dual residual stream, 0 < s <= 1 (default 1). The output is unchanged "
               "(LN(s*x) = LN(x)); s < 1 keeps the stream inside the FP16 range in deep models "
               "(ResiDual appendix H.3; the authors used 0.05 for fp16 OPUS-100)"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        cls.check_options(args)
        for side in ("encoder", "decoder"):
            if getattr(args, f"{side}_normalize_before", False):
                raise PluginOptionError(
                    f"--{side}-normalize-before cannot be used with {cls.who()}: ResiDual's layers are Post-LN "
                    "and its dual stream plays the Pre-LN part (use a transformer_preln_* arch for a Pre-LN model)"
                )

    @classmethod
    def build_stack(cls, side, cfg, dictionary, embed_tokens, args, no_encoder_attn=False):
        if side == "encoder":
            return ResiDualEncoder(cfg, dictionary, embed_tokens, args.dual_residual_scale)
        return ResiDualDecoder(cfg, dictionary, embed_tokens, args.dual_residual_scale, no_encoder_attn)


DEEPNET_INITS = ("paper", "torchscale")


class DeepNet(Residual):
    name, source, pre_ln, family = "deepnet", "DeepNet (arXiv:2203.00555)", False, "deepnet_transformer"
    owns = frozenset({"layer"})
    stream_site = f"DeepNet scales the stream by alpha and normalises the sum, x <- LN(alpha x + F(x)), {CARRY_OWNS}"
    paper, code, preset = "https://arxiv.org/abs/2203.00555", "https://github.com/microsoft/torchscale", "deepnet"
    # alpha, a forward constant, is derived from both depths: fairseq's pruning would rebuild the kept layers with
    # the pruned depth's alpha, a model that was never trained
    prunes = ("DeepNorm's alpha (the skip's weight in every layer's forward) is derived from the encoder and decoder "
              "depths, so the kept layers would run with another alpha than they were trained with")  # fmt: skip
    scripts = activation_checkpointing = double_backward = None
    float32, speed = (), ()
    options = (
        Option("deepnet_init", check_choice, (DEEPNET_INITS,), "paper", "INIT",
               "paper (default, the paper's figure 2 pseudocode): xavier_normal with gain beta for fc1/fc2/v/out "
               "and 1 for q/k; torchscale (the authors' torchscale code): PyTorch-default Linear weights and biases, "
               "fc1/fc2/v/out weights and biases divided by torchscale's init_scale (encoder beta 1.32x the "
               "paper's); one of paper, torchscale"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        refuse_pruning(args, cls.who(), cls.prunes)

    @classmethod
    def encoder_layer(cls, cfg, args):
        return rw.DeepNetEncoderLayer(cfg, rw.deepnet_constants(args.encoder_layers, args.decoder_layers)["encoder_alpha"])

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        alpha = rw.deepnet_constants(args.encoder_layers, args.decoder_layers)["decoder_alpha"]
        return rw.DeepNetDecoderLayer(cfg, no_encoder_attn, alpha)

    @classmethod
    def initialize(cls, model, args):
        n, m = args.encoder_layers, args.decoder_layers
        if args.deepnet_init == "paper":
            constants = rw.deepnet_constants(n, m)
            for side, layer in layers_of(model):
                rw.deepnet_init_(layer, constants[f"{side}_beta"])
        else:
            scales = rw.torchscale_init_scales(n, m)
            for side, layer in layers_of(model):
                rw.torchscale_init_(layer, scales[side])


TFIXUP_DECODER_DEPTHS = ("encoder", "decoder")


class TFixup(Residual):
    name, source, pre_ln, family = "tfixup", "T-Fixup (Huang et al., ICML 2020)", False, "tfixup_transformer"
    owns = frozenset({"layer"})
    stream_site = None  # x <- x + F(x) without norms: F changes (no input norm, its init), the sum does not
    sublayer_norms = False
    paper, code = "https://proceedings.mlr.press/v119/huang20f.html", "https://github.com/layer6ai-labs/T-Fixup"
    preset = "tfixup"
    prunes = scripts = activation_checkpointing = double_backward = None  # the depth sets only the initial weights
    float32, speed = (), ()
    options = (
        Option("tfixup_decoder_depth", check_choice, (TFIXUP_DECODER_DEPTHS,), "decoder", "STACK",
               "the N of the decoder's (9N)^(-1/4): decoder (default: its own depth M, as the paper's "
               "derivation over the decoder's layers and the authors' code) or encoder (the encoder depth N, this "
               "plugin's default until issue 26); one of encoder, decoder"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        if getattr(args, "layernorm_embedding", False):
            raise PluginOptionError(f"--layernorm-embedding cannot be used with {cls.who()}: T-Fixup has no LayerNorm")

    @classmethod
    def conflict(cls, other) -> str | None:
        if other.axis == "norm" and other.name != "layernorm":
            return "T-Fixup removes every normalisation, so there is no normalisation function to choose"
        return None

    @classmethod
    def branch_change(cls, args) -> BranchChange:
        # the branch F(h) without its input norm; initialize() scales F's weights on the carry's layers as on its own
        return BranchChange(sublayer_norms=cls.sublayer_norms)

    @classmethod
    def encoder_layer(cls, cfg, args):
        return rw.TFixupEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return rw.TFixupDecoderLayer(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args):
        scales = rw.tfixup_scales(args.encoder_layers, args.decoder_layers, args.tfixup_decoder_depth)
        for side, layer in layers_of(model):
            rw.tfixup_init_(layer, scales[side])
        encoder_embedding = model.encoder.embed_tokens.weight
        rw.scale_weights_([model.encoder.embed_tokens], scales["encoder_embedding"])
        if model.decoder.embed_tokens.weight is not encoder_embedding:  # a shared table is scaled once, with N
            rw.scale_weights_([model.decoder.embed_tokens], scales["decoder_embedding"])


B2T_INITS = ("rescaled", "default")


class B2T(Residual):
    name, source, pre_ln, family = "b2t", "B2T connection (Takase et al., Findings of ACL 2023)", False, "b2t_transformer"
    owns = frozenset({"layer"})
    stream_site = ("B2T normalises each sum and adds the layer's input to its last one, x <- LN(x_in + x + F(x)), "
                   f"{CARRY_OWNS}")  # fmt: skip
    paper, code, preset = "https://arxiv.org/abs/2206.00330", "https://github.com/takase/b2t_connection", "b2t"
    prunes = activation_checkpointing = double_backward = None  # L^(-1/2) sets only the initial weights
    scripts = RECORDS_SITES
    float32, speed = (), ()
    options = (
        Option("b2t_init", check_choice, (B2T_INITS,), "rescaled", "INIT",
               "rescaled (default, the authors' code): every non-LayerNorm weight of a layer times L^(-1/2), "
               "L its stack's depth; default: fairseq's init"),
    )  # fmt: skip

    @classmethod
    def encoder_layer(cls, cfg, args):
        return rw.B2TEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return rw.B2TDecoderLayer(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args):
        if args.b2t_init == "rescaled":
            for side, layer in layers_of(model):
                rw.b2t_rescale_(layer, getattr(args, f"{side}_layers"))


NORMFORMER_DEFAULTS = {"scale_attn": True, "scale_fc": True, "scale_heads": True, "scale_resids": False}
NORMFORMER_HELP = {
    "scale_attn": "LN_a after self-attention (NormFormer; default true)",
    "scale_fc": "LN_f after the FFN activation, width ffn_dim (default true)",
    "scale_heads": "learned per-head scale g of self-attention (default true)",
    "scale_resids": "learned lambda on the FFN residual (default false; the authors advise it for small models only)",
}


class NormFormer(Residual):
    name, source, family = "normformer", "NormFormer (arXiv:2110.09456)", "normformer_transformer"
    owns = frozenset({"layer"})
    stream_site = None  # head scales and LN_a, LN_f change F alone; lambda (--scale-resids): branch_change refuses it
    paper, code = "https://arxiv.org/abs/2110.09456", "https://github.com/facebookresearch/fairseq/tree/main/examples/normformer"
    preset = "normformer"
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES  # of the paper's layers (the default); --normformer-impl fairseq scripts (scriptable)
    float32, speed = (), ()
    options = (
        Option("normformer_impl", check_choice, (normformer.IMPLEMENTATIONS,), "paper", "IMPL",
               "paper (default): NormFormer in encoder and decoder, head scale before W_O; fairseq: fairseq's "
               "own decoder-only code (head scale after W_O), plain Pre-LN encoder"),
        *(Option(flag, check_bool, (), NORMFORMER_DEFAULTS[flag], "BOOL",
                 NORMFORMER_HELP[flag] + "; the flag alone means true", const=True) for flag in normformer.FLAGS),
    )  # fmt: skip

    @classmethod
    def scriptable(cls, args) -> bool:
        return args.normformer_impl == "fairseq"  # the paper's encoder layer is a SiteResidual

    @classmethod
    def branch_change(cls, args) -> BranchChange:
        with_carry = f"with --depth-aggregation {args.depth_aggregation}"
        if args.scale_resids:
            raise PluginOptionError(
                f"--scale-resids cannot be used {with_carry}: NormFormer's lambda scales the stream at the FFN's "
                f"sum, x <- lambda x + F(x), {CARRY_OWNS}; use --scale-resids false"
            )
        if args.normformer_impl != "paper":
            raise PluginOptionError(
                f"--normformer-impl {args.normformer_impl} cannot be used {with_carry}: it is fairseq's decoder "
                "layer's own forward, which the carry's layers do not run; use --normformer-impl paper"
            )
        flags = {flag: bool(getattr(args, flag)) for flag in normformer.FLAGS}
        return BranchChange(inside=partial(normformer.carry_layer_, flags=flags, export=getattr(args, "export", False)))

    @classmethod
    def encoder_layer(cls, cfg, args):
        if args.normformer_impl == "fairseq":
            return TransformerEncoderLayerBase(cfg)
        return normformer.NormFormerEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        if args.normformer_impl == "fairseq":
            return normformer.NormFormerDecoderLayer(cfg, no_encoder_attn)
        cfg = copy.copy(cfg)
        cfg.scale_heads = False  # fairseq's post-W_O head scale off; the paper's is installed instead
        return normformer.NormFormerDecoderLayer(cfg, no_encoder_attn, heads_before_out_proj=args.scale_heads)


class Admin(Residual):
    name, source, pre_ln, family = "admin", "Admin (arXiv:2004.08249)", False, "admin_transformer"
    owns = frozenset({"layer"})
    stream_site = f"Admin scales the stream by omega and normalises the sum, x <- LN(omega x + F(x)), {CARRY_OWNS}"
    paper, code = "https://arxiv.org/abs/2004.08249", "https://github.com/LiyuanLucasLiu/Transformer-Clinic"
    preset = "admin"
    prunes = activation_checkpointing = double_backward = None  # the omegas are per layer and follow it
    scripts = RECORDS_SITES
    float32, speed = (), ()

    @classmethod
    def encoder_layer(cls, cfg, args):
        return admin.AdminEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return admin.AdminDecoderLayer(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args):
        for _, layer in layers_of(model):
            rw.xavier_fc_(layer)

    @classmethod
    def prepare(cls, model) -> None:
        # profiles itself on its first training batch; a hook, so the model's forward stays fairseq's
        model.register_buffer("admin_profiled", torch.zeros((), dtype=torch.bool))
        model.register_forward_pre_hook(_profile_on_first_training_batch, with_kwargs=True)


def _profile_on_first_training_batch(model, args, kwargs):
    if model.training and not bool(model.admin_profiled):
        model.profile_admin(*args, **kwargs)


# this module's choices, in the order of the docs and the grid (the package joins them with residual_sites.py's)
WIRINGS = (Pre, Post, ResiDual, DeepNet, Admin, TFixup, B2T, NormFormer)
