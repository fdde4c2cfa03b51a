"""``residual_axes``: one encoder-decoder model whose residual ideas are choices on four axes.

    --residual {pre,post,resi-dual,deepnet,admin,tfixup,b2t,normformer,layerscale,rezero,orthogonal,peri,mix,hybrid}
    --depth-aggregation {none,dca,dca-k,denseformer,dlcl,laurel-rw,laurel-lr,laurel-pa,hc-static,hc-dynamic}
    --tying {none,key-query,ffn,value,all}
    --norm {layernorm,rmsnorm,dyt,derf}
    --value-residual {none,decoder,both} (an option beside the axes: axes/value_residual.py)

The axes and their interfaces are in ``fairseq_plugins/axes/`` (docs/axes.md); every named architecture of the
plugin is a row of the preset table (presets.py) that sets axis choices for this model. The build, in order:

    1. each axis's defaults, then its checks; ``axes.check_compatible`` refuses a pair of choices that cannot
       run together, with one error naming both and the reason;
    2. fairseq's ``TransformerModel.build_model``: embeddings, then ``build_encoder``/``build_decoder``: the
       residual choice's own stream (ResiDual) or the aggregation choice's encoder/decoder, whose layers the
       residual choice builds (``make_layer``) unless the aggregation builds its own (DCA, hyper-connections);
    3. the norm choice replaces the LayerNorms; the residual choice re-initialises (DeepNet, T-Fixup, B2T,
       Admin); the tying choice ties adjacent layers.

The same modules in the same order as each family's model before issue 26, so every preset builds the same
parameters and, at a fixed seed, the same initial values (tests/test_golden_models.py).

An encoder- or decoder-wide wrapper (e.g. bf16 autocast around a stack's forward) belongs in
``AxesTransformerModel.build_encoder``/``build_decoder``, on the module they return: every configuration's
encoder and decoder pass through those two classmethods.
"""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, base_architecture
from torch import Tensor

from .. import axes
from ..axes import norm as norm_axis
from ..axes import value_residual
from ..axes.tying import check_tying
from ..modules.cross_layer_guidance import (
    NORMS as GUIDANCE_NORMS,
)
from ..modules.cross_layer_guidance import (
    TiedLinear,
    guidance_loss,
    guidance_pairs,
    materialise_tied_projections,
    tie_pairs,
)
from ..precision import AutocastModel, autocast_dtype, enable_autocast
from ..validation import PluginOptionError, argparse_type, check_choice
from .layer_pruning import SIDES, check_layers_to_keep
from .layer_stack import TorchScriptUnsupportedError

MODEL = "residual_axes"
AXIS_DEFAULTS = {"residual": "pre", "depth_aggregation": "none", "tying": "none", "norm": "layernorm"}


def check_soft_guidance(name: str, value) -> str:
    """``none``, ``all`` or a comma list of Crossformer's blocks (crossformer.check_guidance)."""
    from .crossformer import check_guidance

    return "none" if value == "none" else check_guidance(name, value)


def plan_of(args) -> axes.Plan:
    return axes.resolve(args)


def add_axis_args(parser) -> None:
    """The four axis options and every choice's own options."""
    helps = {
        "residual": "how a sublayer's output joins the residual stream (default pre)",
        "depth_aggregation": "how a layer reads the earlier layers (default none)",
        "tying": "which weights adjacent layers share, Crossformer's hard guidance (default none)",
        "norm": "the normalisation function (default layernorm)",
    }
    for axis, table in axes.tables().items():
        sources = "; ".join(f"{name}: {choice.source}" for name, choice in table.items())
        check, more = argparse_type(check_choice, axis, tuple(table)), ""
        if axis == "tying":  # a comma list of blocks too, as resolve() and crossformer_hg's --guidance take it
            check, more = argparse_type(check_tying, axis), ", or a comma list of blocks (key-query,ffn)"
        parser.add_argument(
            "--" + axis.replace("_", "-"), type=check, metavar="CHOICE",
            help=f"{helps[axis]}; one of {', '.join(table)}{more} ({sources}). Axes: docs/axes.md",
        )  # fmt: skip
    added = set()  # variants share their parent's options (the LAuReL and HC variants, dca-k): add them once
    for table in axes.tables().values():
        for choice in table.values():
            key = (choice.add_args.__func__, tuple(option.name for option in choice.options))
            if key not in added:
                added.add(key)
                choice.add_args(parser)
    value_residual.add_args(parser)
    parser.add_argument(
        "--guidance", type=argparse_type(check_soft_guidance, "guidance"), metavar="BLOCKS",
        help="Crossformer soft guidance (eq. 1-2): which adjacent-layer pairs the criterion "
        "label_smoothed_cross_entropy_with_guidance pulls together: none (default) or 'all' or a comma-separated "
        "list of key-query, ffn, value. The crossformer_hg* presets read it as their --tying (as before issue 26)",
    )  # fmt: skip
    parser.add_argument(
        "--guidance-norm", type=argparse_type(check_choice, "guidance_norm", GUIDANCE_NORMS), metavar="NORM",
        help="norm of each pair's difference in L_reg (Crossformer eq. 1): l1 or l2 (default, section 3.1)",
    )  # fmt: skip


def axes_architecture(args) -> None:
    """Fill every axis (defaults of ``residual_axes``) and each chosen idea's options, then fairseq's."""
    axes.set_defaults(args, AXIS_DEFAULTS)
    axes.set_defaults(args, {"guidance": "none", "guidance_norm": "l2"})
    value_residual.defaults(args)
    try:
        plan = plan_of(args)
    except PluginOptionError:
        plan = None  # build_model reports it
    if plan is not None:
        for choice in plan.choices():
            choice.defaults(args)
    base_architecture(args)


@register_model(MODEL)
class AxesTransformerModel(AutocastModel, TransformerModel):
    """fairseq's transformer assembled from the four axis choices (module docstring)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_axis_args(parser)

    @classmethod
    def architecture(cls, args) -> None:
        axes_architecture(args)

    @classmethod
    def build_model(cls, args, task):
        cls.architecture(args)
        plan = plan_of(args)
        axes.check_compatible(plan)  # first: a refused pair is named as such, not by one choice's own checks
        for choice in plan.choices():
            choice.check(args)
        axes.check_unused_options(args, plan)
        value_residual.check(args, plan)
        args.guidance = check_soft_guidance("guidance", args.guidance)
        args.guidance_norm = check_choice("guidance_norm", args.guidance_norm, GUIDANCE_NORMS)
        if plan.tying.blocks and getattr(args, "ddp_backend", None) == "fully_sharded":
            raise PluginOptionError(
                f"--ddp-backend fully_sharded cannot be used with {plan.tying.label()}: FSDP flattens and shards "
                "each layer's parameters apart, and tying shares them between adjacent layers; use c10d, "
                "legacy_ddp or no_c10d"
            )
        check_layers_to_keep(args)  # fairseq's list-vs-string and one-sided pruning bugs (layer_pruning.py)
        from .crossformer import record_pruned_layer_ids

        record_pruned_layer_ids(args)
        model = super().build_model(args, task)
        norm_axis.replace_norms_(model.encoder, plan.norm)
        norm_axis.replace_norms_(model.decoder, plan.norm)
        plan.residual.initialize(model, args)
        value_residual.attach(model, args)
        for side in SIDES:
            tie_pairs(getattr(model, side).layers, model.tied_pairs[side])
        # again after the norm axis replaced the LayerNorms: the new norms run in float32 too
        return enable_autocast(model, autocast_dtype(args))

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        from fairseq.models.transformer import TransformerConfig

        cfg, plan = TransformerConfig.from_namespace(args), plan_of(args)
        own = plan.residual.build_stack("encoder", cfg, src_dict, embed_tokens, args)
        if own is not None:
            return own
        return plan.aggregation.encoder(cfg, src_dict, embed_tokens, args, lambda c: plan.residual.encoder_layer(c, args))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        from fairseq.models.transformer import TransformerConfig

        cfg, plan = TransformerConfig.from_namespace(args), plan_of(args)
        no_attn = cfg.no_cross_attention
        own = plan.residual.build_stack("decoder", cfg, tgt_dict, embed_tokens, args, no_attn)
        if own is not None:
            return own
        make_layer = lambda c, no_encoder_attn: plan.residual.decoder_layer(c, args, no_encoder_attn)
        return plan.aggregation.decoder(cfg, tgt_dict, embed_tokens, args, make_layer, no_attn)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        plan = plan_of(args)
        self.plan = plan
        self.torchscript = plan.residual.scriptable(args)
        from .crossformer import guided_blocks, recorded_layer_ids

        def pairs(blocks):
            return {
                side: guidance_pairs(len(getattr(self, side).layers), blocks, recorded_layer_ids(args, side))
                for side in SIDES
            }  # fmt: skip

        # pairs join layers that were adjacent before any pruning (cross_layer_guidance.guidance_pairs)
        self.tied_pairs = pairs(plan.tying.blocks)
        self.guidance_pairs = pairs(guided_blocks(args.guidance) if args.guidance != "none" else ())
        # soft guidance of tied pairs is identically 0 (the crossformer_hg presets name their tied blocks in it)
        self.soft_guidance = args.guidance != "none" and args.guidance != plan.tying.name
        plan.residual.prepare(self)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module (also inside a SequenceGenerator) before compiling
        if not self.torchscript:
            raise TorchScriptUnsupportedError(
                f"{type(self).__name__} cannot be exported with TorchScript (torch.jit.script): the layers of "
                f"{self.plan.residual.label()} record the residual sites in forward with try/finally and **kwargs, "
                "which TorchScript cannot compile. Translate with the eager model (fairseq-generate, "
                "fairseq-interactive, from_pretrained); see docs/layer_pruning_torchscript.md"
            )
        return self

    def profile_admin(self, src_tokens, src_lengths, prev_output_tokens, **kwargs) -> None:
        """Admin: set every omega from one forward pass on this batch (in the current train/eval mode)."""
        from ..modules import admin

        admin.profile_(
            self.encoder.layers, self.decoder.layers,
            lambda: super(AxesTransformerModel, self).forward(src_tokens, src_lengths, prev_output_tokens, **kwargs),
        )  # fmt: skip
        self.admin_profiled.fill_(True)

    def guidance_loss(self) -> Tensor:
        """Crossformer's L_reg = sum over the ``--guidance`` pairs of ||A(t) - sg(B(t+1))||_n: a scalar.

        The interface ``label_smoothed_cross_entropy_with_guidance`` reads (0 without ``--guidance``).
        """
        norm = self.args.guidance_norm
        return sum(guidance_loss(getattr(self, s).layers, self.guidance_pairs[s], norm) for s in SIDES)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """fairseq's parameters, each tied one once under its owner's name and at its owner's place.

        ``TiedLinear`` registers the owner's Parameters too (for TorchScript), which would put a shared
        Parameter at the lower layer's place in ``parameters()``: a different order than checkpoints saved
        before, whose optimizer states (matched to parameters by position) would then be loaded onto other
        tensors. Skipping the aliases keeps the order and names.
        """
        aliases = {f"{prefix}.{n}" if prefix else n for n, m in self.named_modules() if isinstance(m, TiedLinear)}
        seen = set()
        for name, param in super().named_parameters(prefix, recurse, remove_duplicate=False):
            if name.rpartition(".")[0] in aliases or (remove_duplicate and id(param) in seen):
                continue
            seen.add(id(param))
            yield name, param

    def upgrade_state_dict_named(self, state_dict, name):
        """Give tied lower projections their own entries before fairseq prunes layers (Crossformer-HG's
        ``upgrade_state_dict_named``, crossformer.py)."""
        super().upgrade_state_dict_named(state_dict, name)
        if self.plan.tying.blocks:
            for side in SIDES:
                materialise_tied_projections(state_dict, f"{name}.{side}" if name else side, self.plan.tying.blocks)
