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


from ..modules.cross_layer_guidance import (
    BLOCKS,
    guidance_pairs,
    tied_parameter_count,
)
from ..validation import (
    PluginOptionError,
    check_choice_list,
)
from .layer_pruning import SIDES, kept_layers

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


def expected_tied_parameter_saving(args) -> int:
    """Parameters a ``crossformer_hg`` model has fewer than fairseq's transformer of the same shape.

    Each tied pair removes its lower projection (weight and bias): key-query, W_V and W_F pairs
    d_model^2 + d_model each, W1 pairs d_model*d_ffn + d_ffn, W2 pairs d_ffn*d_model + d_model. A stack of
    T layers has T-1 pairs per guided block, so with d_ffn = 4 d_model its weights shrink by (T-1) times
    the paper's per-block saving (section 2.2, "Model proprieties": 1 d_m^2 key-query, 4 d_m^2 FFN,
    1 d_m^2 value, 6 d_m^2 all); the paper's count of T blocks ignores that the top layer has no partner.
    Returns 0 for a model that ties nothing (``--tying none``, e.g. ``crossformer_sg``). ``args`` as parsed for
    ``--arch``.
    """
    tying = getattr(args, "tying", None)
    if tying in (None, "none"):
        return 0
    blocks = guided_blocks(check_guidance("tying", tying))
    return sum(
        tied_parameter_count(
            guidance_pairs(getattr(args, f"{side}_layers"), blocks),
            getattr(args, f"{side}_embed_dim"),
            getattr(args, f"{side}_ffn_embed_dim"),
        )
        for side in ("encoder", "decoder")
    )
