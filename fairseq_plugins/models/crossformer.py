"""Crossformer ("Crossformer: Transformer with Alternated Cross-Layer Guidance", sections 2.1-2.2, 3.1):
a Pre-LN transformer (eq. 7-8) whose adjacent self-attention/FFN layers are guided by the layer above.

- ``crossformer_sg`` (soft guidance, eq. 1-2): the model is fairseq's Pre-LN transformer, unchanged; it
  exposes the regularizer L_reg = sum_t ||A(t) - sg(B(t+1))||_n through ``guidance_loss()``, which the
  criterion ``label_smoothed_cross_entropy_with_guidance`` adds as L = L_nll + alpha * L_reg.
- ``crossformer_hg`` (hard guidance, eq. 3, 5, 6): the same pairs are tied, A(t) is B(t+1), one Parameter.

The pairs, and every interpretation of the paper they rest on, are in
``fairseq_plugins/modules/cross_layer_guidance.py``; both models use them, in encoder and decoder
self-attention and FFN (the decoder's cross-attention is neither guided nor tied).

Named architectures (presets.py): ``crossformer_sg_e6d6`` ... ``crossformer_sg_e36d6``,
``crossformer_hg_*`` and their ``*_iwslt_*`` widths, all with ``--guidance key-query`` unless given
(the paper's proof of concept and its deep-model setting, table 3); ``crossformer_hg_ffn_*`` and
``crossformer_hg_value_*``, table 1's other hard-guidance rows (``--guidance ffn`` / ``value``); and
``crossformer_all_e16d6``, the
paper's parameter-matched Crossformer-All (table 2: all three blocks hard-guided, base width, "16" layers).
"16" is read as 16 encoder and 6 decoder layers, like table 3's "36" (36 encoder, 6 decoder), the only
reading that matches the 6+6 Transformer-base: 60,546,560 vs 60,524,544 parameters for a 32K joint
vocabulary (the paper's 60M vs 61M comes from its per-block count, which drops biases and LayerNorms and
counts a partner for the top layer); 16+16 would have 87M, 8+8 53M.
"""

from fairseq.models import (
    ARCH_MODEL_NAME_REGISTRY,
    register_model,
    register_model_architecture,
)
from fairseq.models.transformer import TransformerModel, base_architecture
from torch import Tensor

from ..modules.cross_layer_guidance import (
    BLOCKS,
    NORMS,
    TiedLinear,
    guidance_loss,
    guidance_pairs,
    materialise_tied_projections,
    tie_pairs,
    tied_parameter_count,
)
from ..precision import AutocastModel
from ..validation import (
    PluginOptionError,
    argparse_type,
    check_choice,
    check_choice_list,
)
from .layer_pruning import SIDES, check_layers_to_keep, kept_layers
from .presets import WIDTHS, register_family, register_preset

ALL_BLOCKS = "all"


def check_guidance(name: str, value) -> str:
    """``all`` or a comma-separated list of distinct blocks from BLOCKS; returned as a canonical string."""
    items = check_choice_list(name, value, (*BLOCKS, ALL_BLOCKS))
    if ALL_BLOCKS in items and len(items) > 1:
        flag = "--" + name.replace("_", "-")
        raise PluginOptionError(f"{flag}: 'all' stands alone (it means {','.join(BLOCKS)}); got {value!r}")
    return ",".join(items)


def guided_blocks(guidance: str) -> tuple[str, ...]:
    return BLOCKS if guidance == ALL_BLOCKS else tuple(guidance.split(","))


def layer_ids_attr(side: str) -> str:
    return f"guidance_{side}_layer_ids"


def recorded_layer_ids(args, side: str) -> list[int] | None:
    """The original layer numbers of a pruned stack, as recorded in the model's args (None: not pruned)."""
    value = getattr(args, layer_ids_attr(side), None)
    return [int(i) for i in value.split(",")] if value else None


def record_pruned_layer_ids(args) -> None:
    """Before fairseq builds a pruned model: record which original layer each kept layer is.

    The record (``args.guidance_{side}_layer_ids``, e.g. ``"0,2"``) is saved with the model's args in every
    checkpoint, so a model trained or saved after pruning is rebuilt with the same pairs, and pruning it
    again composes (the kept layers of the kept layers). fairseq itself resets ``*_layers_to_keep`` once it
    has pruned a loaded checkpoint, so the layer numbers alone would be lost.
    """
    for side in SIDES:
        layers = getattr(args, f"{side}_layers")
        ids = recorded_layer_ids(args, side) or list(range(layers))
        if len(ids) != layers:
            raise PluginOptionError(
                f"{layer_ids_attr(side)} (set by layer pruning) lists {len(ids)} layers but the model has "
                f"{layers} {side} layers"
            )
        keep = kept_layers(args, side)
        if keep is not None:
            ids = [ids[k] for k in keep]
            setattr(args, layer_ids_attr(side), ",".join(map(str, ids)))


class _CrossformerModel(AutocastModel, TransformerModel):
    """fairseq's transformer plus the guidance pairs of its encoder and decoder layer stacks."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--guidance",
            type=argparse_type(check_guidance, "guidance"),
            metavar="BLOCKS",
            help="guided pairs of adjacent layers: 'all' or a comma-separated list of key-query "
            "(W_K(t) ~ W_Q(t+1), eq. 3), ffn (W2 at odd t, W1 at even t, eq. 5), value (W_F at odd t, "
            "W_V at even t, eq. 6); default key-query (all for crossformer_all_e16d6)",
        )

    @classmethod
    def check_args(cls, args) -> None:
        args.guidance = check_guidance("guidance", args.guidance)
        check_layers_to_keep(args)

    @classmethod
    def build_model(cls, args, task):
        cls.check_args(args)
        record_pruned_layer_ids(args)
        return super().build_model(args, task)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        blocks = guided_blocks(args.guidance)
        # pairs join layers that were adjacent before any pruning (cross_layer_guidance.guidance_pairs)
        self.guidance_pairs = {
            side: guidance_pairs(len(stack.layers), blocks, recorded_layer_ids(args, side))
            for side, stack in (("encoder", encoder), ("decoder", decoder))
        }


@register_model("crossformer_sg")
class CrossformerSGModel(_CrossformerModel):
    """Crossformer-SG: a Pre-LN transformer whose ``guidance_loss()`` is L_reg of eq. 1."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--guidance-norm",
            type=argparse_type(check_choice, "guidance_norm", NORMS),
            metavar="NORM",
            help="norm of each pair's difference in L_reg (eq. 1): l1 (sum of absolute values) or l2 "
            "(Euclidean norm, not squared); default l2 (section 3.1)",
        )

    @classmethod
    def check_args(cls, args) -> None:
        super().check_args(args)
        args.guidance_norm = check_choice("guidance_norm", args.guidance_norm, NORMS)

    @classmethod
    def build_model(cls, args, task):
        crossformer_sg_architecture(args)
        return super().build_model(args, task)

    def guidance_loss(self) -> Tensor:
        """L_reg = sum over encoder and decoder pairs of ||A(t) - sg(B(t+1))||_n: a scalar (float32 or wider).

        The interface ``label_smoothed_cross_entropy_with_guidance`` reads: any model can provide a
        ``guidance_loss()`` returning a scalar that is differentiable in the parameters it regularizes.
        """
        norm = self.args.guidance_norm
        return guidance_loss(self.encoder.layers, self.guidance_pairs["encoder"], norm) + guidance_loss(
            self.decoder.layers, self.guidance_pairs["decoder"], norm
        )


@register_model("crossformer_hg")
class CrossformerHGModel(_CrossformerModel):
    """Crossformer-HG: each pair's lower projection computes with the upper layer's ``nn.Linear``.

    Tied weights are one Parameter, owned by layer t+1, so it appears once in ``parameters()`` (hence in
    the optimizer, fp16 flat buffers and DDP's gradient reduction, which all start from it), once in
    ``state_dict()``, and loading a checkpoint fills it once: there is nothing to re-tie. It receives the
    sum of both layers' gradients.
    """

    @classmethod
    def check_args(cls, args) -> None:
        super().check_args(args)
        if getattr(args, "ddp_backend", None) == "fully_sharded":
            raise PluginOptionError(
                "--ddp-backend fully_sharded cannot be used with crossformer_hg: FSDP flattens and shards "
                "each layer's parameters apart, and hard guidance shares them between adjacent layers; "
                "use c10d, legacy_ddp or no_c10d"
            )

    @classmethod
    def build_model(cls, args, task):
        crossformer_hg_architecture(args)
        return super().build_model(args, task)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        # tied here, once both layers of every pair exist: fairseq's build_*_layer hooks build one layer
        # at a time and get no layer index
        tie_pairs(self.encoder.layers, self.guidance_pairs["encoder"])
        tie_pairs(self.decoder.layers, self.guidance_pairs["decoder"])

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """fairseq's parameters, each shared one once under its owner's name and at its owner's place.

        ``TiedLinear`` registers the owner's Parameters too (for TorchScript), which would put a shared
        Parameter at the lower layer's place in ``parameters()``: a different order than checkpoints saved
        before, whose optimizer states (Adam moments, matched to parameters by position) would then be
        loaded onto other tensors of the same shape. Skipping the aliases keeps the order and names.
        """
        aliases = {f"{prefix}.{n}" if prefix else n for n, m in self.named_modules() if isinstance(m, TiedLinear)}
        seen = set()
        for name, param in super().named_parameters(prefix, recurse, remove_duplicate=False):
            if name.rpartition(".")[0] in aliases or (remove_duplicate and id(param) in seen):
                continue
            seen.add(id(param))
            yield name, param

    def upgrade_state_dict_named(self, state_dict, name):
        """Give tied lower projections their own entries before fairseq prunes layers (``prune_state_dict``
        runs right after this): each kept layer then loads exactly the weights it was trained with, and
        ``TiedLinear`` drops the entries again wherever this model still ties them. Old checkpoints (each
        shared weight saved once, under its owner) and new ones have the same format.
        """
        super().upgrade_state_dict_named(state_dict, name)
        blocks = guided_blocks(self.args.guidance)
        for side in SIDES:
            materialise_tied_projections(state_dict, f"{name}.{side}" if name else side, blocks)


def expected_tied_parameter_saving(args) -> int:
    """Parameters a ``crossformer_hg`` model has fewer than fairseq's transformer of the same shape.

    Each tied pair removes its lower projection (weight and bias): key-query, W_V and W_F pairs
    d_model^2 + d_model each, W1 pairs d_model*d_ffn + d_ffn, W2 pairs d_ffn*d_model + d_model. A stack of
    T layers has T-1 pairs per guided block, so with d_ffn = 4 d_model its weights shrink by (T-1) times
    the paper's per-block saving (section 2.2, "Model proprieties": 1 d_m^2 key-query, 4 d_m^2 FFN,
    1 d_m^2 value, 6 d_m^2 all); the paper's count of T blocks ignores that the top layer has no partner.
    Returns 0 for other models (``crossformer_sg`` ties nothing). ``args`` as parsed for ``--arch``.
    """
    if ARCH_MODEL_NAME_REGISTRY.get(getattr(args, "arch", None), "crossformer_hg") != "crossformer_hg":
        return 0
    blocks = guided_blocks(check_guidance("guidance", args.guidance))
    return sum(
        tied_parameter_count(
            guidance_pairs(getattr(args, f"{side}_layers"), blocks),
            getattr(args, f"{side}_embed_dim"),
            getattr(args, f"{side}_ffn_embed_dim"),
        )
        for side in ("encoder", "decoder")
    )


def _crossformer_defaults(args) -> None:
    for name, value in {
        "guidance": "key-query",
        "encoder_normalize_before": True,  # Pre-LN, eq. 7-8
        "decoder_normalize_before": True,
    }.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


@register_model_architecture("crossformer_sg", "crossformer_sg")
def crossformer_sg_architecture(args):
    if getattr(args, "guidance_norm", None) is None:
        args.guidance_norm = "l2"
    _crossformer_defaults(args)
    base_architecture(args)


@register_model_architecture("crossformer_hg", "crossformer_hg")
def crossformer_hg_architecture(args):
    _crossformer_defaults(args)
    base_architecture(args)


register_family("crossformer_sg", "crossformer_sg", crossformer_sg_architecture)
register_family("crossformer_hg", "crossformer_hg", crossformer_hg_architecture)
# Crossformer table 1's other hard-guidance rows, one name each: a study compares them by --arch alone
register_family("crossformer_hg_ffn", "crossformer_hg", crossformer_hg_architecture, {"guidance": "ffn"})
register_family("crossformer_hg_value", "crossformer_hg", crossformer_hg_architecture, {"guidance": "value"})
register_preset(
    "crossformer_all_e16d6", "crossformer_hg", "crossformer_all", 16, 6, WIDTHS[""], crossformer_hg_architecture,
    {"guidance": ALL_BLOCKS},
)  # fmt: skip
