"""``laurel_transformer``: a Pre-LN transformer with one LAuReL connection around every layer (encoder and
decoder), variants RW, LR and PA. Equations, sources and interpretations: ``modules/laurel.py``.

The layers are fairseq's own Pre-LN layers; only the layer loop changes (layer_stack.py). PA's history of the
last k streams is per position, so incremental decoding rebuilds it at every step and caches only attention's
keys and values, as for the baseline.

Named architectures (presets.py): ``laurel_rw_*``, ``laurel_lr_*``, ``laurel_pa_*`` at every depth and both
widths.
"""

from torch import nn

from ..modules.laurel import LaurelConnection
from ..modules.layer_stack import (
    LayerStackDecoder,
    LayerStackEncoder,
    add_format_version,
)

# r above the width is allowed (B A is then a full-rank D x D map with more parameters than it needs)


class _LaurelStack:
    """Every layer's output y_i becomes x_{i+1} = LAuReL_i(x_i, y_i, history); the carry is the history of
    streams x_0 .. x_i that PA reads (its last k entries)."""

    laurel: nn.ModuleList

    def _init_laurel(self, num_layers: int, embed_dim: int, options: dict) -> None:
        self.laurel = nn.ModuleList(LaurelConnection(embed_dim=embed_dim, **options) for _ in range(num_layers))
        self._keep = options["pa_k"] if options["variant"] == "pa" else 1
        add_format_version(self, "laurel")

    def begin_layers(self, x):
        return [x]

    def _connect(self, idx, x, y, history):
        x = self.laurel[idx](x, y, history)
        return x, [*history, x][-self._keep :]


class LaurelEncoder(_LaurelStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, options: dict):
        super().__init__(cfg, dictionary, embed_tokens)
        self._init_laurel(cfg.encoder.layers, cfg.encoder.embed_dim, options)

    def run_layer(self, idx, layer, x, history, padding_mask):
        return self._connect(idx, x, layer(x, encoder_padding_mask=padding_mask), history)


class LaurelDecoder(_LaurelStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, options: dict, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self._init_laurel(cfg.decoder.layers, cfg.decoder.embed_dim, options)

    def run_layer(self, idx, layer, x, history, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        y, attn, _ = layer(
            x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
    )  # fmt: skip
        return *self._connect(idx, x, y, history), attn


