"""The papers' comparison rows that change how a layer's residual stream is wired or initialised:
DeepNet (``deepnet_*``), Admin (``admin_*``), T-Fixup (``tfixup_*``), NormFormer (``normformer_*``) and B2T
(``b2t_*``). Each is fairseq's transformer whose layers are built by a subclass of fairseq's own layer
(one hook overridden) and, where the method is an initialization, re-initialised once after building.

The equations, constants and every reading of the papers are in the module docstrings:
``fairseq_plugins/modules/residual_wiring.py`` (DeepNet, T-Fixup, B2T), ``modules/admin.py`` and
``modules/normformer.py``. Named architectures come from the preset table (presets.py): every depth
from E6D6 to E36D6 at both widths, e.g. ``deepnet_e18d18``, ``tfixup_iwslt_e36d6``.
"""

import copy

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

from ..modules import admin, normformer
from ..modules import residual_wiring as rw
from ..validation import PluginOptionError, argparse_type, check_bool, check_choice
from .baselines import POST_LN, PRE_LN
from .layer_pruning import check_layers_to_keep
from .layer_stack import TorchScriptUnsupportedError, wrap_layer
from .presets import register_family


class WiredEncoder(TransformerEncoderBase):
    """fairseq's encoder whose layers come from ``make_layer(cfg)`` (the checkpoint/FSDP wrapping kept)."""

    def __init__(self, cfg, dictionary, embed_tokens, make_layer):
        self._make_layer = make_layer  # read by build_encoder_layer inside the base __init__
        super().__init__(cfg, dictionary, embed_tokens)
        del self._make_layer

    def build_encoder_layer(self, cfg):
        return wrap_layer(self._make_layer(cfg), cfg)


class WiredDecoder(TransformerDecoderBase):
    """fairseq's decoder whose layers come from ``make_layer(cfg, no_encoder_attn)``."""

    def __init__(self, cfg, dictionary, embed_tokens, make_layer, no_encoder_attn=False):
        self._make_layer = make_layer
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        del self._make_layer

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(self._make_layer(cfg, no_encoder_attn), cfg)


def require_layer_norm_position(args, family: str, pre_ln: bool) -> None:
    """Reject an ``--{side}-normalize-before`` that contradicts the family, naming it."""
    for side in ("encoder", "decoder"):
        if bool(getattr(args, f"{side}_normalize_before", False)) != pre_ln:
            flag = f"--{side}-normalize-before"
            raise PluginOptionError(
                f"{flag} {'must be set' if pre_ln else 'cannot be used'} with {family}: its layers are "
                f"{'Pre-LN' if pre_ln else 'Post-LN'}"
            )


class _WiredModel(TransformerModel):
    """fairseq's transformer with family-specific layers and an optional init pass after building.

    Layer pruning: fairseq's, as is, where a layer's forward reads nothing from the stack's depth (the
    depth-scaled inits of T-Fixup and B2T only set the starting weights, which a loaded checkpoint replaces;
    Admin's omegas are per-layer weights and buffers, so they follow their layer). DeepNet refuses it.
    TorchScript: the families whose layers record the residual sites (``SiteResidual``: B2T, Admin, the
    paper's NormFormer) use ``try``/``finally``, ``super()`` and ``**kwargs`` in ``forward``; making them
    scriptable means copying fairseq's layer forwards, so they refuse at once instead (``torchscript``).
    """

    torchscript = True  # False: torch.jit.script stops with TorchScriptUnsupportedError (class docstring)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module (also inside a SequenceGenerator) before compiling
        if not self.torchscript:
            raise TorchScriptUnsupportedError(
                f"{type(self).__name__} cannot be exported with TorchScript (torch.jit.script): its layers record "
                "the residual sites in forward with try/finally and **kwargs, which TorchScript cannot compile. "
                "Translate with the eager model (fairseq-generate, fairseq-interactive, from_pretrained); see the "
                "README, 'Layer pruning and TorchScript'"
            )
        return self

    @classmethod
    def architecture(cls, args) -> None:
        raise NotImplementedError

    @classmethod
    def check_args(cls, args) -> None:
        pass

    @classmethod
    def encoder_layer(cls, cfg, args):
        raise NotImplementedError

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn: bool):
        raise NotImplementedError

    @classmethod
    def initialize(cls, model, args) -> None:
        """Re-initialise the freshly built model in place (runs before any checkpoint is loaded)."""

    @classmethod
    def build_model(cls, args, task):
        cls.architecture(args)
        cls.check_args(args)
        check_layers_to_keep(args)  # fairseq's list-vs-string and one-sided pruning bugs (layer_pruning.py)
        model = super().build_model(args, task)
        model.torchscript = cls.scriptable(args)
        cls.initialize(model, args)
        return model

    @classmethod
    def scriptable(cls, args) -> bool:
        return cls.torchscript

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return WiredEncoder(cfg, src_dict, embed_tokens, lambda c: cls.encoder_layer(c, args))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return WiredDecoder(
            cfg, tgt_dict, embed_tokens, lambda c, no_attn: cls.decoder_layer(c, args, no_attn),
            no_encoder_attn=cfg.no_cross_attention,
        )  # fmt: skip


def _defaults(args, values: dict) -> None:
    for name, value in values.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


# ---------------------------------------------------------------------------------------------------
# DeepNet

DEEPNET_INITS = ("paper", "torchscale")


@register_model("deepnet_transformer")
class DeepNetTransformerModel(_WiredModel):
    """DeepNet / DeepNorm (arXiv:2203.00555): Post-LN, x <- LN(alpha x + F(x)), beta-scaled init."""


    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--deepnet-init", type=argparse_type(check_choice, "deepnet_init", DEEPNET_INITS), metavar="INIT",
            help="paper (default, the paper's figure 2 pseudocode): xavier_normal with gain beta for fc1/fc2/v/out "
            "and 1 for q/k; torchscale (the authors' torchscale code): PyTorch-default Linear weights and biases, "
            "fc1/fc2/v/out weights and biases divided by torchscale's init_scale (encoder beta 1.32x the paper's); "
            "one of paper, torchscale",
        )  # fmt: skip

    @classmethod
    def architecture(cls, args):
        deepnet_architecture(args)

    @classmethod
    def check_args(cls, args):
        args.deepnet_init = check_choice("deepnet_init", args.deepnet_init, DEEPNET_INITS)
        require_layer_norm_position(args, "deepnet_transformer", pre_ln=False)
        for side in ("encoder", "decoder"):
            # alpha, a forward constant, is derived from both depths: fairseq's pruning would rebuild the kept
            # layers with the pruned depth's alpha, a model that was never trained
            if getattr(args, f"{side}_layers_to_keep", None) not in (None, "", []):
                raise PluginOptionError(
                    f"--{side}-layers-to-keep cannot be used with deepnet_transformer: DeepNorm's alpha (the "
                    "skip's weight in every layer's forward) is derived from the encoder and decoder depths, so "
                    "the kept layers would run with another alpha than they were trained with"
                )

    @classmethod
    def encoder_layer(cls, cfg, args):
        alpha = rw.deepnet_constants(args.encoder_layers, args.decoder_layers)["encoder_alpha"]
        return rw.DeepNetEncoderLayer(cfg, alpha)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        alpha = rw.deepnet_constants(args.encoder_layers, args.decoder_layers)["decoder_alpha"]
        return rw.DeepNetDecoderLayer(cfg, no_encoder_attn, alpha)

    @classmethod
    def initialize(cls, model, args):
        n, m = args.encoder_layers, args.decoder_layers
        if args.deepnet_init == "paper":
            constants = rw.deepnet_constants(n, m)
            for side in ("encoder", "decoder"):
                for layer in getattr(model, side).layers:
                    rw.deepnet_init_(layer, constants[f"{side}_beta"])
        else:
            scales = rw.torchscale_init_scales(n, m)
            for side in ("encoder", "decoder"):
                for layer in getattr(model, side).layers:
                    rw.torchscale_init_(layer, scales[side])


@register_model_architecture("deepnet_transformer", "deepnet_transformer")
def deepnet_architecture(args):
    _defaults(args, {"deepnet_init": "paper", **POST_LN})
    base_architecture(args)


# ---------------------------------------------------------------------------------------------------
# T-Fixup

TFIXUP_DECODER_DEPTHS = ("encoder", "decoder")


@register_model("tfixup_transformer")
class TFixupTransformerModel(_WiredModel):
    """T-Fixup (Huang et al., ICML 2020): no LayerNorm, depth-scaled Xavier init, trained without warm-up."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--tfixup-decoder-depth", type=argparse_type(check_choice, "tfixup_decoder_depth", TFIXUP_DECODER_DEPTHS),
            metavar="STACK",
            help="the N of the decoder's (9N)^(-1/4): decoder (default: its own depth M, as the paper's "
            "derivation over the decoder's layers and the authors' code) or encoder (the encoder depth N, this "
            "plugin's default until issue 26); one of encoder, decoder",
        )  # fmt: skip

    @classmethod
    def architecture(cls, args):
        tfixup_architecture(args)

    @classmethod
    def check_args(cls, args):
        args.tfixup_decoder_depth = check_choice(
            "tfixup_decoder_depth", args.tfixup_decoder_depth, TFIXUP_DECODER_DEPTHS
        )
        require_layer_norm_position(args, "tfixup_transformer", pre_ln=False)
        if getattr(args, "layernorm_embedding", False):
            raise PluginOptionError("--layernorm-embedding cannot be used with tfixup_transformer: T-Fixup has no LayerNorm")

    @classmethod
    def encoder_layer(cls, cfg, args):
        return rw.TFixupEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return rw.TFixupDecoderLayer(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args):
        scales = rw.tfixup_scales(args.encoder_layers, args.decoder_layers, args.tfixup_decoder_depth)
        for side in ("encoder", "decoder"):
            for layer in getattr(model, side).layers:
                rw.tfixup_init_(layer, scales[side])
        encoder_embedding = model.encoder.embed_tokens.weight
        decoder_embedding = model.decoder.embed_tokens.weight
        rw.scale_weights_([model.encoder.embed_tokens], scales["encoder_embedding"])
        if decoder_embedding is not encoder_embedding:  # a shared table is scaled once, with N
            rw.scale_weights_([model.decoder.embed_tokens], scales["decoder_embedding"])


@register_model_architecture("tfixup_transformer", "tfixup_transformer")
def tfixup_architecture(args):
    _defaults(args, {"tfixup_decoder_depth": "decoder", **POST_LN})
    base_architecture(args)


# ---------------------------------------------------------------------------------------------------
# B2T

B2T_INITS = ("rescaled", "default")


@register_model("b2t_transformer")
class B2TTransformerModel(_WiredModel):
    """B2T connection (Takase et al. 2023): Post-LN plus the layer input added to the FFN's sum."""

    torchscript = False  # SiteResidual layers (_WiredModel)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--b2t-init", type=argparse_type(check_choice, "b2t_init", B2T_INITS), metavar="INIT",
            help="rescaled (default, the authors' code): every non-LayerNorm weight of a layer times L^(-1/2), "
            "L its stack's depth; default: fairseq's init",
        )  # fmt: skip

    @classmethod
    def architecture(cls, args):
        b2t_architecture(args)

    @classmethod
    def check_args(cls, args):
        args.b2t_init = check_choice("b2t_init", args.b2t_init, B2T_INITS)
        require_layer_norm_position(args, "b2t_transformer", pre_ln=False)

    @classmethod
    def encoder_layer(cls, cfg, args):
        return rw.B2TEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return rw.B2TDecoderLayer(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args):
        if args.b2t_init == "rescaled":
            for side in ("encoder", "decoder"):
                for layer in getattr(model, side).layers:
                    rw.b2t_rescale_(layer, getattr(args, f"{side}_layers"))


@register_model_architecture("b2t_transformer", "b2t_transformer")
def b2t_architecture(args):
    _defaults(args, {"b2t_init": "rescaled", **POST_LN})
    base_architecture(args)


# ---------------------------------------------------------------------------------------------------
# NormFormer

NORMFORMER_DEFAULTS = {"scale_attn": True, "scale_fc": True, "scale_heads": True, "scale_resids": False}
NORMFORMER_HELP = {
    "scale_attn": "LN_a after self-attention (NormFormer; default true)",
    "scale_fc": "LN_f after the FFN activation, width ffn_dim (default true)",
    "scale_heads": "learned per-head scale g of self-attention (default true)",
    "scale_resids": "learned lambda on the FFN residual (default false; the authors advise it for small "
    "models only)",
}


@register_model("normformer_transformer")
class NormFormerTransformerModel(_WiredModel):
    """NormFormer (arXiv:2110.09456): Pre-LN plus LN_a, head scale, LN_f and optional lambda."""

    @classmethod
    def scriptable(cls, args) -> bool:
        return args.normformer_impl == "fairseq"  # the paper's encoder layer is a SiteResidual (_WiredModel)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--normformer-impl", type=argparse_type(check_choice, "normformer_impl", normformer.IMPLEMENTATIONS),
            metavar="IMPL",
            help="paper (default): NormFormer in encoder and decoder, head scale before W_O; fairseq: fairseq's "
            "own decoder-only code (head scale after W_O), plain Pre-LN encoder",
        )  # fmt: skip
        for flag in normformer.FLAGS:
            parser.add_argument(
                "--" + flag.replace("_", "-"), type=argparse_type(check_bool, flag), nargs="?", const=True,
                metavar="BOOL", help=NORMFORMER_HELP[flag] + "; the flag alone means true",
            )  # fmt: skip

    @classmethod
    def architecture(cls, args):
        normformer_architecture(args)

    @classmethod
    def check_args(cls, args):
        args.normformer_impl = check_choice("normformer_impl", args.normformer_impl, normformer.IMPLEMENTATIONS)
        for flag in normformer.FLAGS:
            setattr(args, flag, check_bool(flag, getattr(args, flag)))
        require_layer_norm_position(args, "normformer_transformer", pre_ln=True)

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


@register_model_architecture("normformer_transformer", "normformer_transformer")
def normformer_architecture(args):
    _defaults(args, {"normformer_impl": "paper", **NORMFORMER_DEFAULTS, **PRE_LN})
    base_architecture(args)


# ---------------------------------------------------------------------------------------------------
# Admin


@register_model("admin_transformer")
class AdminTransformerModel(_WiredModel):
    """Admin (arXiv:2004.08249): Post-LN with profiled omega; profiles itself on its first training batch."""

    torchscript = False  # SiteResidual layers (_WiredModel)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.register_buffer("admin_profiled", torch.zeros((), dtype=torch.bool))

    @classmethod
    def architecture(cls, args):
        admin_architecture(args)

    @classmethod
    def check_args(cls, args):
        require_layer_norm_position(args, "admin_transformer", pre_ln=False)

    @classmethod
    def encoder_layer(cls, cfg, args):
        return admin.AdminEncoderLayer(cfg)

    @classmethod
    def decoder_layer(cls, cfg, args, no_encoder_attn):
        return admin.AdminDecoderLayer(cfg, no_encoder_attn)

    @classmethod
    def initialize(cls, model, args):
        for side in ("encoder", "decoder"):
            for layer in getattr(model, side).layers:
                rw.xavier_fc_(layer)

    def profile_admin(self, src_tokens, src_lengths, prev_output_tokens, **kwargs) -> None:
        """Set every omega from one forward pass on this batch (in the current train/eval mode)."""
        admin.profile_(
            self.encoder.layers, self.decoder.layers,
            lambda: super(AdminTransformerModel, self).forward(src_tokens, src_lengths, prev_output_tokens, **kwargs),
        )  # fmt: skip
        self.admin_profiled.fill_(True)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        if self.training and not bool(self.admin_profiled):
            self.profile_admin(src_tokens, src_lengths, prev_output_tokens, **kwargs)
        return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)


@register_model_architecture("admin_transformer", "admin_transformer")
def admin_architecture(args):
    _defaults(args, POST_LN)
    base_architecture(args)


register_family("deepnet", "deepnet_transformer", deepnet_architecture)
register_family("tfixup", "tfixup_transformer", tfixup_architecture)
register_family("b2t", "b2t_transformer", b2t_architecture)
register_family("normformer", "normformer_transformer", normformer_architecture)
register_family("admin", "admin_transformer", admin_architecture)
