"""Crossformer's pairs under layer pruning: which original layer each kept layer is, recorded in the model's args.

The idea itself (the pairs, soft guidance's L_reg, hard guidance's tying, the blocks ``--guidance`` and
``--tying`` name, the parameters tying saves) is ``fairseq_plugins/modules/cross_layer_guidance.py``; the
presets ``crossformer_sg_*``, ``crossformer_hg*`` and ``crossformer_all_e16d6`` are rows of models/families.py.
"""


from ..validation import PluginOptionError
from .layer_pruning import SIDES, kept_layers


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
