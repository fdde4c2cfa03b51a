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
       residual choice builds (``make_layer``) unless the aggregation builds its own (DCA, hyper-connections),
       whose branches the residual choice's ``branch_change`` then changes (LayerScale, ReZero, ...);
    3. the norm choice replaces the LayerNorms; the residual choice re-initialises (DeepNet, T-Fixup, B2T,
       Admin); the tying choice ties adjacent layers.

The same modules in the same order as each family's model before issue 26, so every preset builds the same
parameters and, at a fixed seed, the same initial values (tests/test_golden_models.py).

An encoder- or decoder-wide wrapper (e.g. bf16 autocast around a stack's forward) belongs in
``AxesTransformerModel.build_encoder``/``build_decoder``, on the module they return: every configuration's
encoder and decoder pass through those two classmethods.
"""

from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    base_architecture,
)
from torch import Tensor

from .. import axes
from ..axes import norm as norm_axis
from ..axes import value_residual
from ..axes.tying import check_tying
from ..fairseq_hooks import check_choice_suggesting
from ..modules import admin
from ..modules.compiled import compile_ideas
from ..modules.cross_layer_guidance import (
    NORMS as GUIDANCE_NORMS,
)
from ..modules.cross_layer_guidance import (
    TiedLinear,
    check_guidance,
    guidance_loss,
    guidance_pairs,
    guided_blocks,
    materialise_tied_projections,
    tie_pairs,
)
from ..modules.layer_stack import TorchScriptUnsupportedError
from ..precision import AutocastModel, autocast_dtype, enable_autocast
from ..validation import (
    PluginOptionError,
    argparse_type,
    check_choice,
    check_model_shape,
)
from .crossformer import record_pruned_layer_ids, recorded_layer_ids
from .layer_pruning import SIDES, check_layers_to_keep

MODEL = "residual_axes"
AXIS_DEFAULTS = {"residual": "pre", "depth_aggregation": "none", "tying": "none", "norm": "layernorm"}


def check_soft_guidance(name: str, value) -> str:
    """``none``, ``all`` or a comma list of Crossformer's blocks (cross_layer_guidance.check_guidance)."""
    return "none" if value == "none" else check_guidance(name, value)


GUIDANCE = axes.Option(
    "guidance", check_soft_guidance, (), "none", "BLOCKS",
    "Crossformer soft guidance (eq. 1-2): which adjacent-layer pairs the criterion "
    "label_smoothed_cross_entropy_with_guidance pulls together: none (default) or 'all' or a comma-separated "
    "list of key-query, ffn, value; on every model, crossformer_hg* too (their checkpoints saved before issue 54, "
    "whose --guidance named the tied blocks, load as tied: --tying names those now)",
)  # fmt: skip
GUIDANCE_NORM = axes.Option(
    "guidance_norm", check_choice, (GUIDANCE_NORMS,), "l2", "NORM",
    "norm of each pair's difference in L_reg (Crossformer eq. 1): l1 or l2 (default, section 3.1); only with --guidance",
)  # fmt: skip
GUIDANCE_OPTIONS = (GUIDANCE, GUIDANCE_NORM)
# the model's options beside the axes' choices: a switch (its option, its off value) -> the options only a model
# with the switch on reads (refused when it is off). The axes' choices declare theirs (``Choice.options``).
SWITCHED_OPTIONS: dict[str, tuple[axes.Option, str, tuple[axes.Option, ...]]] = {
    "value_residual": (value_residual.OPTIONS[0], "none", value_residual.OPTIONS[1:]),
    "guidance": (GUIDANCE, "none", (GUIDANCE_NORM,)),
}


def soft_guidance(args, plan) -> bool:
    """Whether the model has a regularizer to train: --guidance names blocks and they are not the tied ones (whose
    soft guidance is identically 0: refused on a command line, cleared from a checkpoint's args by build_model)."""
    return args.guidance != "none" and (plan is None or args.guidance != plan.tying.name)


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
        check, more = argparse_type(check_choice_suggesting, axis, tuple(table)), ""
        if axis == "tying":  # a comma list of blocks too, as resolve() and --guidance take it
            check, more = argparse_type(check_tying, axis), ", or a comma list of blocks (key-query,ffn)"
        parser.add_argument(
            "--" + axis.replace("_", "-"), type=check, metavar="CHOICE",
            help=f"{helps[axis]}; one of {', '.join(table)}{more} ({sources}). Axes: docs/axes.md",
        )  # fmt: skip
    added = set()  # choices share options (the LAuReL and HC variants, dca-k): each is added once, by name
    for table in axes.tables().values():
        for choice in table.values():
            for option in choice.options:
                if option.name not in added:
                    added.add(option.name)
                    option.add(parser)
    value_residual.add_args(parser)
    for option in GUIDANCE_OPTIONS:
        option.add(parser)


def axes_architecture(args) -> None:
    """Fill every axis (defaults of ``residual_axes``) and each chosen idea's options, then fairseq's."""
    axes.set_defaults(args, AXIS_DEFAULTS)
    axes.set_defaults(args, {"guidance": "none"})
    value_residual.defaults(args)
    try:
        plan = plan_of(args)
    except PluginOptionError:
        plan = None  # build_model reports it
    if soft_guidance(args, plan):  # only guidance_loss's pairs read it: not filled where nothing reads it
        axes.set_defaults(args, {"guidance_norm": "l2"})
    if plan is not None:
        for choice in plan.choices():
            choice.defaults(args)
    base_architecture(args)


def branch_change(plan, args):
    """The residual choice's change of each branch of the aggregation's own layers (axes/residual.py's
    ``branch_change``), for an aggregation that builds them; None otherwise (the residual choice's layers)."""
    return plan.residual.branch_change(args) if plan.aggregation.own_layers else None


COMPILE_BACKENDS = ("none", "inductor", "aot_eager", "eager")


@register_model(MODEL)
class AxesTransformerModel(AutocastModel, TransformerModel):
    """fairseq's transformer assembled from the four axis choices (module docstring)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_axis_args(parser)
        parser.add_argument(
            "--compile-ideas", type=argparse_type(check_choice, "compile_ideas", COMPILE_BACKENDS), metavar="BACKEND",
            help="none (default), inductor, aot_eager or eager: torch.compile the encoder's and decoder's layers and "
            "the layer-loop hooks of the idea modules with this backend (fairseq_plugins/modules/compiled.py; every "
            "choice traces without graph breaks, tests/test_compile.py). inductor emits Triton kernels on a GPU; on "
            "the CPU the default, eager PyTorch with the fused C kernels, is faster (whole-model compile ran at 0.78 "
            "of eager, issue 58). Not with --store-ema, whose copy of the model would run the original's compiled code",
        )  # fmt: skip

    @classmethod
    def architecture(cls, args) -> None:
        axes_architecture(args)

    @classmethod
    def build_model(cls, args, task):
        cls.architecture(args)
        check_model_shape(args)  # fairseq's depths, widths, heads and drop rates, each naming its option
        plan = plan_of(args)
        axes.check_compatible(plan)  # first: a refused pair is named as such, not by one choice's own checks
        for choice in plan.choices():
            choice.check(args)
        axes.check_unused_options(args, plan)
        branch_change(plan, args)  # refuses, naming it, an option of the residual choice the carry cannot run
        value_residual.check(args, plan)
        args.guidance = check_soft_guidance("guidance", args.guidance)
        if args.guidance != "none" and args.guidance == plan.tying.name:
            if not axes.drop_if_stored(args, "guidance"):
                raise PluginOptionError(
                    f"--guidance {args.guidance} names only the blocks that {plan.tying.label()} ties, whose soft "
                    "guidance (L_reg) is identically 0: it would be ignored; drop --guidance or name other blocks "
                    "(before issue 54 the crossformer_hg presets' --guidance named their tied blocks: --tying now)"
                )
            args.guidance = "none"  # the older code stored the tied blocks in it and built no regularizer
        if soft_guidance(args, plan):
            args.guidance_norm = check_choice("guidance_norm", args.guidance_norm, GUIDANCE_NORMS)
        elif axes.is_set(args, "guidance_norm") and not axes.drop_if_stored(args, "guidance_norm"):
            raise PluginOptionError(
                "--guidance-norm applies only with soft guidance, --guidance BLOCKS other than the tied ones (the "
                f"pairs whose differences it measures), and the model has --guidance {args.guidance}: it would be "
                "ignored; drop it"
            )
        if plan.tying.blocks and getattr(args, "ddp_backend", None) == "fully_sharded":
            raise PluginOptionError(
                f"--ddp-backend fully_sharded cannot be used with {plan.tying.label()}: FSDP flattens and shards "
                "each layer's parameters apart, and tying shares them between adjacent layers; use c10d, "
                "legacy_ddp or no_c10d"
            )
        if check_choice("compile_ideas", getattr(args, "compile_ideas", None) or "none", COMPILE_BACKENDS) != "none" \
                and getattr(args, "store_ema", False):  # fmt: skip
            raise PluginOptionError(
                "--compile-ideas cannot be used with --store-ema: the EMA model is a deep copy, whose compiled layers "
                "would still run the original model's code; drop one of them"
            )
        check_layers_to_keep(args)  # fairseq's list-vs-string and one-sided pruning bugs (layer_pruning.py)
        record_pruned_layer_ids(args)
        model = super().build_model(args, task)
        norm_axis.replace_norms_(model.encoder, plan.norm, args)
        norm_axis.replace_norms_(model.decoder, plan.norm, args)
        plan.residual.initialize(model, args)
        value_residual.attach(model, args)
        for side in SIDES:
            tie_pairs(getattr(model, side).layers, model.tied_pairs[side])
        # again after the norm axis replaced the LayerNorms: the new norms run in float32 too
        model = enable_autocast(model, autocast_dtype(args))
        backend = check_choice("compile_ideas", getattr(args, "compile_ideas", None) or "none", COMPILE_BACKENDS)
        return model if backend == "none" else compile_ideas(model, backend=backend)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg, plan = TransformerConfig.from_namespace(args), plan_of(args)
        own = plan.residual.build_stack("encoder", cfg, src_dict, embed_tokens, args)
        if own is not None:
            return own
        return plan.aggregation.encoder(cfg, src_dict, embed_tokens, args, lambda c: plan.residual.encoder_layer(c, args),
                                        branch_change(plan, args))  # fmt: skip

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg, plan = TransformerConfig.from_namespace(args), plan_of(args)
        no_attn = cfg.no_cross_attention
        own = plan.residual.build_stack("decoder", cfg, tgt_dict, embed_tokens, args, no_attn)
        if own is not None:
            return own
        make_layer = lambda c, no_encoder_attn: plan.residual.decoder_layer(c, args, no_encoder_attn)
        return plan.aggregation.decoder(cfg, tgt_dict, embed_tokens, args, make_layer, no_attn,
                                        branch_change(plan, args))  # fmt: skip

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        plan = plan_of(args)
        self.plan = plan
        self.torchscript = plan.residual.scriptable(args)
        def pairs(blocks):
            return {
                side: guidance_pairs(len(getattr(self, side).layers), blocks, recorded_layer_ids(args, side))
                for side in SIDES
            }  # fmt: skip

        # pairs join layers that were adjacent before any pruning (cross_layer_guidance.guidance_pairs)
        self.tied_pairs = pairs(plan.tying.blocks)
        self.guidance_pairs = pairs(guided_blocks(args.guidance) if args.guidance != "none" else ())
        # soft guidance of tied pairs is identically 0 (build_model refuses --guidance naming only the tied blocks)
        self.soft_guidance = soft_guidance(args, plan)
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
        admin.profile_(
            self.encoder.layers, self.decoder.layers,
            lambda: super(AxesTransformerModel, self).forward(src_tokens, src_lengths, prev_output_tokens, **kwargs),
        )  # fmt: skip
        self.admin_profiled.fill_(True)

    def guidance_loss(self) -> Tensor:
        """Crossformer's L_reg = sum over the ``--guidance`` pairs of ||A(t) - sg(B(t+1))||_n: a scalar.

        The interface ``label_smoothed_cross_entropy_with_guidance`` reads (0 without ``--guidance``).
        """
        norm = getattr(self.args, "guidance_norm", None) or "l2"  # unset without soft guidance: no pairs or tied ones
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
        ``upgrade_state_dict_named``, modules/cross_layer_guidance.py)."""
        super().upgrade_state_dict_named(state_dict, name)
        if self.plan.tying.blocks:
            for side in SIDES:
                materialise_tied_projections(state_dict, f"{name}.{side}" if name else side, self.plan.tying.blocks)
