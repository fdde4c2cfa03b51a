"""Layer pruning (fairseq's ``--encoder-layers-to-keep`` / ``--decoder-layers-to-keep``) for the plugin's models.

fairseq prunes in two places: ``TransformerModel.build_model`` builds ``len(layers_to_keep)`` layers, and
``checkpoint_utils.prune_state_dict`` (called by ``load_state_dict`` after ``upgrade_state_dict``) keeps the
named layers of the loaded checkpoint and renumbers them ``0 .. k-1``; it then resets ``*_layers_to_keep`` in
the model's args, so checkpoints saved afterwards are plain k-layer models. This works for every family whose
layers own all their weights (ResiDual, Crossformer-SG, the baselines); Crossformer-HG re-materialises the
weights that pruning would separate from their layer (``modules/cross_layer_guidance.py``); DCA refuses.

fairseq 0.12.3 parses the training flag as ``List[int]`` (``TransformerConfig.layers_to_keep``) while its
``build_model`` and ``prune_state_dict`` split a comma string, so ``fairseq-train --encoder-layers-to-keep``
fails with ``AttributeError: 'list' object has no attribute 'split'`` for fairseq's own transformer. The
plugin's models accept both forms and store the comma string fairseq expects. And ``prune_state_dict`` keeps
only the layers some pruning pass names, so pruning one side alone drops every layer of the other side
(``Missing key(s) ... decoder.layers.0...``); the plugin's models then name all layers of the other side.
"""

from ..validation import PluginOptionError

SIDES = ("encoder", "decoder")


def check_layers_to_keep(args) -> None:
    """Validate ``args.{side}_layers_to_keep`` (list or comma string) and store it as a sorted comma string.

    Each item must be a distinct layer number in ``0 .. {side}_layers - 1`` (the model's depth before pruning).
    If only one side is pruned, the other keeps all its layers explicitly (fairseq's one-sided pruning bug).
    """
    pruned = [side for side in SIDES if getattr(args, f"{side}_layers_to_keep", None) not in (None, "", [])]
    for side in SIDES:
        if pruned and side not in pruned:
            setattr(args, f"{side}_layers_to_keep", ",".join(map(str, range(getattr(args, f"{side}_layers")))))
    for side in SIDES:
        name = f"{side}_layers_to_keep"
        value = getattr(args, name, None)
        if value is None or value == "" or value == []:
            continue
        layers = getattr(args, f"{side}_layers")
        flag = "--" + name.replace("_", "-")
        items = value.split(",") if isinstance(value, str) else list(value)
        try:
            keep = [int(str(item).strip()) for item in items]
        except ValueError:
            raise PluginOptionError(f"{flag} must be comma-separated layer numbers, got {value!r}") from None
        if len(set(keep)) != len(keep) or not all(0 <= k < layers for k in keep):
            raise PluginOptionError(
                f"{flag} must name distinct layers in 0..{layers - 1} (the model has {layers} {side} layers), "
                f"got {value!r}. A checkpoint trained with it from scratch still carries it in its args; "
                f"load such a checkpoint with --model-overrides \"{{'{name}': None}}\""
            )
        setattr(args, name, ",".join(str(k) for k in sorted(keep)))


def kept_layers(args, side: str) -> list[int] | None:
    """The sorted layer numbers ``args.{side}_layers_to_keep`` names (after ``check_layers_to_keep``), or None."""
    value = getattr(args, f"{side}_layers_to_keep", None)
    return [int(k) for k in value.split(",")] if value else None
