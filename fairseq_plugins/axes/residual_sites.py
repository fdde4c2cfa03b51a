"""The 2024-26 residual-site ideas as ``--residual`` choices (their table entries are added to RESIDUALS).

    layerscale   x <- x + diag(lambda) F(LN(x)), lambda_0 = CaiT's eps(depth)   modules/layer_scale.py
    rezero       x <- x + alpha F(x), alpha_0 = 0, no norms; one alpha per layer   modules/rezero.py
    orthogonal   x <- x + (f - <x,f>/(|x|^2+eps) x), f = F(LN(x)), per token    modules/orthogonal_residual.py
    peri         x <- x + LN_out(F(LN_in(x)))  (Peri-LN = Sandwich-LN)          modules/norm_placement.py
    mix          Mix-LN: the first floor(0.25 L) layers of each stack Post-LN   modules/norm_placement.py
    hybrid       HybridNorm: Q/K/V norms in attention, FFN x <- N(x) + FFN(N(x)) modules/hybrid_norm.py
                 (--hybrid-first-layer pre: HybridNorm*, a Pre-LN first layer in each stack)
    ngpt         nGPT: h <- Norm(Norm(h) + |alpha| (Norm(F(h)) - Norm(h))), unit weights modules/ngpt.py

Why these are residual choices and not a separate branch-update axis: each paper defines its update on a
Pre-LN layer (LayerScale, orthogonal) or replaces the layer's norm placement (ReZero, Peri, Mix, Hybrid), the
same part of the model (the layer's forward) that DeepNet, Admin, B2T, ... own. Composing LayerScale or the
orthogonal update with Post-LN/DeepNet/Admin would be a model none of the papers describe (a scaled branch
inside a normalised sum); so one switch, one owner of the layer (``owns = {"layer"}``), and they compose with
every stack that treats a layer as a black box (DenseFormer, DLCL, LAuReL), with tying and with the norm axis.
All keep fairseq's stack-final LayerNorm (``pre_ln``), as the papers keep their final norm, except ReZero, whose
authors' code has none (``--rezero-final-norm``).

With a stream carry (axes/residual.py's ``stream_site``): LayerScale, ReZero and Peri-LN change each branch alone
(diag(lambda) b, alpha b without sublayer norms, LN_out(b)), so they compose, their update modules' ``branch``
on the carry's layers (modules/site_layers.py's ``BranchChange``); the orthogonal update, Mix-LN, HybridNorm and
nGPT act on the stream at the sum, and declare what.
"""

from functools import partial

from ..modules import ngpt
from ..modules import site_layers as sl
from ..modules.layer_scale import LayerScale, cait_eps
from ..modules.norm_placement import mix_ln_post_layers
from ..modules.orthogonal_residual import OrthogonalResidual
from ..modules.rezero import ReZeroGate
from ..validation import PluginOptionError, check_bool, check_choice, check_float
from .choice import KEEPS_PACE, Option, Speed, set_defaults_since
from .residual import CARRY_OWNS, RECORDS_SITES, Residual, refuse_pruning


def stack_layers(model) -> list[list]:
    """The layers of each stack of ``model`` that has any (an LM's NoEncoder has none), encoder first."""
    stacks = (list(getattr(getattr(model, side), "layers", None) or []) for side in ("encoder", "decoder"))
    return [layers for layers in stacks if layers]


class _SiteUpdate(Residual):
    owns = frozenset({"layer"})  # SiteResidual layers (residual_wiring.py): each choice declares scripts = RECORDS_SITES

    @classmethod
    def update(cls, embed_dim: int, depth: int, args):
        raise NotImplementedError

    @classmethod
    def per_layer(cls, args) -> bool:
        """Whether one update module serves every site of a layer (else one per site)."""
        return False

    @classmethod
    def branch_change(cls, args) -> sl.BranchChange | None:
        """The same update modules (``update``) on a stream carry's layers, their ``branch`` alone."""
        if cls.stream_site is not None:
            return None
        return sl.BranchChange(partial(cls.update, args=args), cls.per_layer(args), cls.sublayer_norms)

    @classmethod
    def encoder_layer(cls, cfg, args):
        dim, depth = args.encoder_embed_dim, args.encoder_layers
        return sl.SiteUpdateEncoderLayer(
            cfg, lambda site: cls.update(dim, depth, args), cls.sublayer_norms, cls.per_layer(args)
        )

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        dim, depth = args.decoder_embed_dim, args.decoder_layers
        return sl.SiteUpdateDecoderLayer(
            cfg, no_encoder_attn, lambda site: cls.update(dim, depth, args), cls.sublayer_norms, cls.per_layer(args)
        )


class LayerScaleChoice(_SiteUpdate):
    name, source = "layerscale", "LayerScale (CaiT, Touvron et al. 2021, arXiv:2103.17239, section 2)"
    stream_site = None  # b -> diag(lambda) b
    paper, code, preset = "https://arxiv.org/abs/2103.17239", "https://github.com/facebookresearch/deit", "layerscale"
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES
    float32, speed = (), KEEPS_PACE  # eps = 1e-6 is stored in the float32 master weights (modules/layer_scale.py)
    options = (
        Option("layerscale_init", check_float, (0.0, 1.0), None, "EPS",  # unset: CaiT's rule, by depth
               "LayerScale's initial lambda, 0 <= eps <= 1 (default: CaiT section 2's rule per stack depth L: "
               "0.1 for L <= 18, 1e-5 for L <= 24, 1e-6 deeper)"),
    )  # fmt: skip

    @classmethod
    def update(cls, embed_dim, depth, args):
        init = getattr(args, "layerscale_init", None)
        return LayerScale(embed_dim, cait_eps(depth) if init is None else init)


REZERO_GATES = ("layer", "sublayer")
# what the code before issue 55 built, for checkpoints saved by it (their args lack the two options)
REZERO_BEFORE = {"rezero_gate": "sublayer", "rezero_final_norm": True}


class ReZero(_SiteUpdate):
    name, source = "rezero", "ReZero (Bachlechner et al. 2020, arXiv:2003.04887, eq. 1, section 5; majumderb/rezero)"
    sublayer_norms = False
    stream_site = None  # b -> alpha b, the sublayers without norms
    paper, code, preset = "https://arxiv.org/abs/2003.04887", "https://github.com/majumderb/rezero", "rezero"
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES
    float32, speed = (), KEEPS_PACE
    options = (
        Option("rezero_gate", check_choice, (REZERO_GATES,), None, "GATE",  # filled by defaults(): by origin
               "ReZero's gates: layer (default: one alpha per layer shared by its sublayers, 2 in an encoder layer "
               "and 3 in a decoder layer, as the authors' code majumderb/rezero rztx.py (one resweight per "
               "RZTXEncoderLayer/RZTXDecoderLayer) and the paper's 'single additional learned parameter per "
               "layer') or sublayer (one alpha per sublayer; this plugin's form before issue 55, and what a "
               "checkpoint saved before then is rebuilt with)"),
        Option("rezero_final_norm", check_bool, (), None, "BOOL",
               "keep fairseq's stack-final LayerNorm on the encoder output and before the output projection: false "
               "(default: none, as the authors' README, 'make sure norm argument is left as None' in "
               "nn.TransformerEncoder/Decoder) or true (this plugin's form before issue 55, and what a checkpoint "
               "saved before then is rebuilt with); the flag alone means true", const=True),
    )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        set_defaults_since(args, {"rezero_gate": "layer", "rezero_final_norm": False}, REZERO_BEFORE)
        super().defaults(args)

    @classmethod
    def per_layer(cls, args) -> bool:
        return args.rezero_gate == "layer"

    @classmethod
    def conflict(cls, other) -> str | None:
        # like T-Fixup: another function would replace no norm of the authors' form (--rezero-final-norm, the
        # plugin's older form, keeps one; the axes decide at every choice's defaults)
        if other.axis == "norm" and other.name != "layernorm":
            return "ReZero's layers have no normalisation, so there is no normalisation function to choose"
        return None

    @classmethod
    def update(cls, embed_dim, depth, args):
        return ReZeroGate()

    @classmethod
    def prepare(cls, model) -> None:
        if not model.args.rezero_final_norm:
            for side in ("encoder", "decoder"):
                stack = getattr(model, side, None)
                if getattr(stack, "layer_norm", None) is not None:  # fairseq's forward skips a None final norm
                    stack.layer_norm = None


class Orthogonal(_SiteUpdate):
    name, source = "orthogonal", "orthogonal residual update (Oh et al., NeurIPS 2025, arXiv:2505.11881)"
    stream_site = ("the orthogonal update removes F's component along the stream it joins, reading x at each sum, "
                   f"x <- x + F - <x,F>/|x|^2 x, {CARRY_OWNS}")  # fmt: skip
    paper, code, preset = "https://arxiv.org/abs/2505.11881", "https://github.com/BootsofLagrangian/ortho-residual", "ortho"
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES
    float32 = ("the projection <x, f> / (|x|^2 + eps) of the update on the stream",)
    speed = KEEPS_PACE

    @classmethod
    def update(cls, embed_dim, depth, args):
        return OrthogonalResidual()


class Peri(_SiteUpdate):
    name, source = "peri", "Peri-LN (arXiv:2502.02732, eq. 3) = Sandwich-LN (CogView, arXiv:2105.13290)"
    stream_site = None  # b -> LN_out(b)
    paper, code, preset = "https://arxiv.org/abs/2502.02732", "", "periln"
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES
    float32, speed = (), KEEPS_PACE  # its output norms are LayerNorms (the --norm choice's float32)

    @classmethod
    def update(cls, embed_dim, depth, args):
        return sl.PeriOutput(embed_dim)


class Mix(Residual):
    name, source = "mix", "Mix-LN (Li et al. 2024, arXiv:2412.13795; alpha 0.25 as the authors' scripts)"
    owns = frozenset({"layer"})
    stream_site = f"Mix-LN's first layers normalise the stream after each sublayer's sum, x <- LN(x + F(x)), {CARRY_OWNS}"
    paper, code, preset = "https://arxiv.org/abs/2412.13795", "https://github.com/pixeli99/MixLN", "mixln"
    # which layers are Post-LN follows from the stack's depth: a pruned stack would re-partition them
    prunes = ("Mix-LN's Post-LN layers are the first floor(alpha L) of the stack, so the kept layers would be "
              "re-partitioned between Post-LN and Pre-LN for the pruned depth, a model that was never trained")
    scripts = activation_checkpointing = double_backward = None
    float32, speed = (), KEEPS_PACE
    options = (
        Option("mix_ln_alpha", check_float, (0.0, 1.0), 0.25, "A",
               "Mix-LN: the first floor(A L) layers of each stack are Post-LN, the rest Pre-LN, 0 <= A <= 1 "
               "(default 0.25, the authors' POST_NUM 3 of 12)"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        refuse_pruning(args, cls.who(), cls.prunes)

    @classmethod
    def prepare(cls, model) -> None:
        # fairseq's layers read normalize_before in forward: the leading layers become Post-LN with their own norms
        for layers in stack_layers(model):
            for layer in layers[: mix_ln_post_layers(len(layers), model.args.mix_ln_alpha)]:
                layer.normalize_before = False


class Hybrid(Residual):
    name, source = "hybrid", "HybridNorm (Zhuo et al. 2025, arXiv:2503.04598)"
    owns = frozenset({"layer"})
    stream_site = ("HybridNorm's FFN sum replaces the stream by its norm, x <- N(x) + FFN(N(x)), "
                   f"{CARRY_OWNS}")  # fmt: skip
    paper, code, preset = "https://arxiv.org/abs/2503.04598", "https://github.com/BryceZhuo/HybridNorm", "hybridnorm"
    # at its default --hybrid-first-layer hybrid; HybridNorm* (pre) refuses pruning in check(), its first layer
    # being built differently from the others
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES
    float32 = ("the Q/K/V norms' mean square (accumulated in float32, modules/hybrid_norm.py)",)
    speed = KEEPS_PACE
    options = (
        Option("hybrid_first_layer", check_choice, (("hybrid", "pre"),), "hybrid", "KIND",
               "HybridNorm's first layer of each stack: hybrid (default, the paper's HybridNorm) or pre "
               "(HybridNorm*, the paper's variant, the authors' norm_pos_special_config: layer 0 keeps a pre-norm "
               "on its attention inputs, Q/K/V norms included, and a Pre-LN FFN)"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        if args.hybrid_first_layer == "pre":
            # the special layer is the stack's first: pruning it would leave a model that was never trained
            refuse_pruning(args, "--hybrid-first-layer pre", "HybridNorm*'s first layer of each stack is built "
                           "differently from the others, and pruning would move another layer into its place")  # fmt: skip

    @classmethod
    def prepare(cls, model) -> None:
        if model.args.hybrid_first_layer == "pre":
            for layers in stack_layers(model):
                layers[0].keep_pre_ln()

    @classmethod
    def conflict(cls, other) -> str | None:
        if other.axis == "tying" and {"key-query", "value"} & set(other.blocks):
            return "HybridNorm wraps q/k/v_proj with per-head norms, which tying would share as bare Linears"
        return None

    @classmethod
    def encoder_layer(cls, cfg, args):
        return sl.HybridEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return sl.HybridDecoderLayer(cfg, no_encoder_attn)


SPHERE = "nGPT keeps the hidden state on the unit sphere between layers, and a mix of layer outputs would leave it"


class NGPT(_SiteUpdate):
    name, source = "ngpt", "nGPT (Loshchilov et al., ICLR 2025, arXiv:2410.01131; NVIDIA/ngpt model.py)"
    sublayer_norms = False  # every norm is the L2 projection onto the sphere (M:81-83: no LayerNorms)
    stream_site = SPHERE  # conflict() names it for every choice that owns the stream
    paper, code, preset = "https://arxiv.org/abs/2410.01131", "https://github.com/NVIDIA/ngpt", "ngpt"
    prunes = activation_checkpointing = double_backward = None
    scripts = RECORDS_SITES
    float32 = ("the L2 norms of the stream, the branch output and each head's q and k (in float32, cast back)",
               "the per-step weight projection")  # fmt: skip
    # not KEEPS_PACE: measured (CPU time, docs/speed.md "nGPT and LIMe") train 0.71-0.79, decode 0.85-0.87 of Pre-LN;
    # no matrix product is added, but three L2 norms per site, the per-head q/k norms and the per-step weight
    # projection are separate element-wise passes where Pre-LN runs one fused LayerNorm kernel per sublayer
    speed = (Speed("train", ">=", 0.75), Speed("decode", ">=", 0.80))  # the level measured, within +-0.04
    options = (
        Option("ngpt_alpha_init", check_float, (0.0, 1.0, True), ngpt.ALPHA_INIT, "A",
               "nGPT's per-dimension step sizes (eigen learning rates) alpha of every sublayer site at init, cross-"
               "attention included, 0 < A <= 1 (default 0.05, the authors' code NVIDIA/ngpt model.py "
               "attn/mlp_alpha_init_value)"),
        Option("ngpt_alpha_scale", check_float, (0.0, 1.0, True), None, "S",
               "the scale nGPT's alpha is stored at (effective alpha = stored * A / S, so S sets its effective "
               "learning rate under Adam), 0 < S <= 1 (default 1/sqrt(C) of each stack, the authors' base_scale, "
               "NVIDIA/ngpt model.py). Use --weight-decay 0 as the authors (train.py)"),
    )  # fmt: skip

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        who = cls.label()

        def refuse_option(flag, why):
            raise PluginOptionError(f"{flag} cannot be used with {who}: {why}")

        if getattr(args, "fp16", False) and not getattr(args, "memory_efficient_fp16", False) or \
                getattr(args, "bf16", False) and not getattr(args, "memory_efficient_bf16", False):  # fmt: skip
            refuse_option("--fp16" if getattr(args, "fp16", False) else "--bf16",
                          "fairseq's FP16Optimizer steps float32 master copies that nGPT's per-step weight "
                          "projection cannot reach; use --memory-efficient-fp16 (or -bf16), --amp or "
                          "--autocast-dtype")  # fmt: skip
        if getattr(args, "ddp_backend", None) == "fully_sharded":
            refuse_option("--ddp-backend fully_sharded", "FSDP flattens and shards the matrices, so their rows "
                          "are not whole on one rank for the weight projection; use c10d, legacy_ddp or "
                          "no_c10d")  # fmt: skip
        plain_table = "the embedding and output tables must be plain V x C matrices on the sphere"
        no_norm = "nGPT has no normalisation layer (the first site's Norm puts the embedding on the sphere)"
        for option, why in (("layernorm_embedding", no_norm),
                            ("adaptive_softmax_cutoff", plain_table), ("adaptive_input", plain_table),
                            ("character_embeddings", plain_table)):  # fmt: skip
            if getattr(args, option, None):
                refuse_option("--" + option.replace("_", "-"), why)
        if (getattr(args, "quant_noise_pq", 0) or 0) > 0:
            refuse_option("--quant-noise-pq", "quant noise wraps the Linears that nGPT keeps on the sphere")
        for option in ("decoder_input_dim", "decoder_output_dim"):
            if getattr(args, option, None) not in (None, args.decoder_embed_dim):
                refuse_option(f"--{option.replace('_', '-')} other than --decoder-embed-dim",
                              "its projection would be an unnormalised matrix on the sphere's path")  # fmt: skip

    @classmethod
    def conflict(cls, other) -> str | None:
        if "stream" in other.owns:
            return SPHERE
        if other.axis == "norm" and other.name != "layernorm":
            return "nGPT has no normalisation layer: every norm is the L2 projection onto the sphere"
        if other.axis == "tying" and "key-query" in other.blocks:
            return "nGPT's q_proj/k_proj are per-head sphere projections, which tying would share as bare Linears"
        return None

    @classmethod
    def update(cls, embed_dim, depth, args):
        return ngpt.SphereUpdate(embed_dim, args.ngpt_alpha_init, getattr(args, "ngpt_alpha_scale", None))

    @classmethod
    def encoder_layer(cls, cfg, args):
        layer = super().encoder_layer(cfg, args)
        ngpt.sphere_layer_(layer, args.encoder_embed_dim)
        return layer

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        layer = super().decoder_layer(cfg, args, no_encoder_attn)
        ngpt.sphere_layer_(layer, args.decoder_embed_dim)
        return layer

    @classmethod
    def prepare(cls, model) -> None:
        ngpt.sphere_model_(model)

    @classmethod
    def initialize(cls, model, args) -> None:
        ngpt.initialize_(model)


SITE_RESIDUALS = (LayerScaleChoice, ReZero, Orthogonal, Peri, Mix, Hybrid, NGPT)
