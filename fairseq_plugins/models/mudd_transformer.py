"""MUDDFormer stacks (modules/muddformer.py) for ``--depth-aggregation mudd``.

After each layer a MultiwayDenseConnection makes four inputs for the next layer from all earlier layer outputs
(Q, K, V ways into self-attention, each with its own LayerNorm, the code's ``sepln``; R its residual). The
layers are fairseq's Pre-LN layers (their parameter names stay) plus ``key_layer_norm``/``value_layer_norm``;
self_attn_layer_norm is LN_Q. Decoder cross-attention is an ordinary Pre-LN sublayer on X'_A (the module's
default ``ways=4``). The stack output is Xbar_L^R, then the final LayerNorm.

fairseq's MultiheadAttention with ``self_attention=True`` projects K and V from the query argument, so the
layers switch that flag off: K and V are projected from their own ways; the incremental cache appends the new
position's K/V as for self-attention (static_kv off), so incremental decoding equals full decoding.
"""

from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ..modules.layer_stack import LayerStackDecoder, LayerStackEncoder, wrap_layer
from ..modules.muddformer import MultiwayDenseConnections


class _MUDDLayer:
    def _add_way_norms(self, embed_dim: int, export: bool) -> None:
        self.key_layer_norm = LayerNorm(embed_dim, export=export)
        self.value_layer_norm = LayerNorm(embed_dim, export=export)
        self.self_attn.self_attention = False  # K, V from their own ways (module docstring)

    def _ffn(self, x):
        h = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x))))
        return x + self.dropout_module(self.fc2(h))


class MUDDEncoderLayer(_MUDDLayer, TransformerEncoderLayerBase):
    def __init__(self, cfg):
        super().__init__(cfg)
        self._add_way_norms(cfg.encoder.embed_dim, cfg.export)

    def forward(self, ways, encoder_padding_mask, attn_mask=None):
        q, k, v, r = ways
        h, _ = self.self_attn(query=self.self_attn_layer_norm(q), key=self.key_layer_norm(k),
                              value=self.value_layer_norm(v), key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)  # fmt: skip
        return self._ffn(r + self.dropout_module(h))


class MUDDDecoderLayer(_MUDDLayer, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn)
        self._add_way_norms(cfg.decoder.embed_dim, cfg.export)

    def forward(self, ways, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                self_attn_mask=None, self_attn_padding_mask=None, need_attn=False, need_head_weights=False):  # fmt: skip
        q, k, v, r = ways
        h, _ = self.self_attn(query=self.self_attn_layer_norm(q), key=self.key_layer_norm(k),
                              value=self.value_layer_norm(v), key_padding_mask=self_attn_padding_mask,
                              incremental_state=incremental_state, need_weights=False,
                              attn_mask=self_attn_mask)  # fmt: skip
        x = r + self.dropout_module(h)
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            need_attn = need_attn or need_head_weights
            h, attn = self.encoder_attn(
                query=self.encoder_attn_layer_norm(x), key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights,
            )  # fmt: skip
            x = x + self.dropout_module(h)
        return self._ffn(x), attn, None


class _MUDDStack:
    def begin_layers(self, x):
        state, ways = self.mudd.start(x)
        return state, ways

    def end_layers(self, x, carry):
        out = carry[1][0]  # Xbar_L^R
        return self.layer_norm(out) if self.layer_norm is not None else out


class MUDDEncoder(_MUDDStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.mudd = MultiwayDenseConnections(cfg.encoder.embed_dim, len(self.layers))

    def build_encoder_layer(self, cfg):
        return wrap_layer(MUDDEncoderLayer(cfg), cfg)

    def run_layer(self, idx, layer, x, carry, padding_mask):
        state, ways = carry
        out = layer(ways, encoder_padding_mask=padding_mask)
        return out, (state, self.mudd(idx + 1, state, out))


class MUDDDecoder(_MUDDStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.mudd = MultiwayDenseConnections(cfg.decoder.embed_dim, len(self.layers))

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(MUDDDecoderLayer(cfg, no_encoder_attn), cfg)

    def run_layer(self, idx, layer, x, carry, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        state, ways = carry
        out, attn, _ = layer(
            ways, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
        )  # fmt: skip
        return out, (state, self.mudd(idx + 1, state, out)), attn
