"""``hc_transformer``: a Pre-LN transformer whose residual connections are hyper-connections (static or
dynamic, expansion rate n) in encoder and decoder. Equations, sources, init and interpretations:
``modules/hyper_connections.py``.

The layers keep fairseq's Pre-LN sublayers (their modules and parameter names are the baseline's); each layer
maps the n streams H `(seq_len, batch, n, embed_dim)` to new streams, one hyper-connection per sublayer. The
layer loop (layer_stack.py) carries H; the value it passes on as a layer's output (fairseq's ``inner_states``)
is the read-out, the sum of the streams, whose final LayerNorm is the encoder or decoder output.

Streams are an explicit dimension next to the features, not folded into the batch, so attention, its incremental cache and
beam search's reordering see the batch only. H is per position: incremental decoding rebuilds it from the
current position's embedding at every step and caches only attention's keys and values.

Named architectures (presets.py): ``hc_static_*`` and ``hc_dynamic_*`` (n = 4, the paper's main setting) at
every depth and both widths.
"""

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ..modules.hyper_connections import HyperConnection
from .layer_stack import LayerStackDecoder, LayerStackEncoder, wrap_layer
from .pre_ln_stack import add_format_version

MAX_RATE = 64


class _HyperConnected:
    """A layer whose sublayers are wrapped by hyper-connections built for sites ``first_site`` onwards."""

    hc: nn.ModuleList

    def _build_hc(self, cfg_side, sites: int, first_site: int, rate: int, dynamic: bool, export: bool) -> None:
        self.hc = nn.ModuleList(
            HyperConnection(cfg_side.embed_dim, rate, first_site + j, dynamic, export=export) for j in range(sites)
        )

    def _ffn(self, h: Tensor) -> Tensor:
        h = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(h))))
        return self.dropout_module(self.fc2(h))


class HCEncoderLayer(_HyperConnected, TransformerEncoderLayerBase):
    """fairseq's Pre-LN encoder layer on n streams: `(seq_len, batch, n, embed_dim)` in and out."""

    SITES = 2

    def __init__(self, cfg, first_site: int, rate: int, dynamic: bool):
        super().__init__(cfg)
        self._build_hc(cfg.encoder, self.SITES, first_site, rate, dynamic, cfg.export)

    # The sublayers of fairseq 0.12.3 TransformerEncoderLayerBase.forward, Pre-LN branch (no hook gives a
    # sublayer its own input); changed: each is wrapped by a hyper-connection instead of x + T(x).
    def forward(self, streams: Tensor, encoder_padding_mask: Tensor | None, attn_mask: Tensor | None = None):
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(attn_mask.to(bool), -1e8 if streams.dtype == torch.float32 else -1e4)

        def self_attention(h):
            h = self.self_attn_layer_norm(h)
            h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=encoder_padding_mask,
                                  need_weights=False, attn_mask=attn_mask)  # fmt: skip
            return self.dropout_module(h)

        streams = self.hc[0](streams, self_attention)
        return self.hc[1](streams, self._ffn)


class HCDecoderLayer(_HyperConnected, TransformerDecoderLayerBase):
    """fairseq's Pre-LN decoder layer on n streams; returns (streams, cross-attention weights or None, None)."""

    def __init__(self, cfg, first_site: int, rate: int, dynamic: bool, no_encoder_attn: bool = False):
        super().__init__(cfg, no_encoder_attn)
        self._build_hc(cfg.decoder, 2 if no_encoder_attn else 3, first_site, rate, dynamic, cfg.export)

    # The sublayers of fairseq 0.12.3 TransformerDecoderLayerBase.forward, Pre-LN branch without
    # cross-self-attention (rejected by axes/aggregation.py) and the NormFormer scalings (not options of the
    # translation transformer); changed: each is wrapped by a hyper-connection instead of x + T(x).
    def forward(
        self,
        streams: Tensor,
        encoder_out: Tensor | None = None,
        encoder_padding_mask: Tensor | None = None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None = None,
        self_attn_mask: Tensor | None = None,
        self_attn_padding_mask: Tensor | None = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        need_attn = need_attn or need_head_weights
        attn: list[Tensor | None] = [None]

        def self_attention(h):
            h = self.self_attn_layer_norm(h)
            h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                                  incremental_state=incremental_state, need_weights=False,
                                  attn_mask=self_attn_mask)  # fmt: skip
            return self.dropout_module(h)

        def cross_attention(h):
            h, attn[0] = self.encoder_attn(
                query=self.encoder_attn_layer_norm(h), key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )  # fmt: skip
            return self.dropout_module(h)

        streams = self.hc[0](streams, self_attention)
        if self.encoder_attn is not None and encoder_out is not None:
            streams = self.hc[1](streams, cross_attention)
        return self.hc[-1](streams, self._ffn), attn[0], None


class _HCStack:
    """H^0 = n copies of the embedding output; each layer maps H to H; a layer's output is sum_j H[j]."""

    def _init_hc(self, rate: int, dynamic: bool) -> None:
        self.hc_rate, self.hc_dynamic, self._hc_sites_built = rate, dynamic, 0

    def _next_sites(self, sites: int) -> int:
        first, self._hc_sites_built = self._hc_sites_built, self._hc_sites_built + sites
        return first

    def begin_layers(self, x):
        return x.unsqueeze(2).expand(x.size(0), x.size(1), self.hc_rate, x.size(2))


class HCEncoder(_HCStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, rate: int, dynamic: bool):
        self._init_hc(rate, dynamic)
        super().__init__(cfg, dictionary, embed_tokens)
        add_format_version(self, "hc")

    def build_encoder_layer(self, cfg):
        first = self._next_sites(HCEncoderLayer.SITES)
        return wrap_layer(HCEncoderLayer(cfg, first, self.hc_rate, self.hc_dynamic), cfg)

    def run_layer(self, idx, layer, x, streams, padding_mask):
        streams = layer(streams, encoder_padding_mask=padding_mask)
        return streams.sum(2), streams


class HCDecoder(_HCStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, rate: int, dynamic: bool, no_encoder_attn=False):
        self._init_hc(rate, dynamic)
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        add_format_version(self, "hc")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        sites = 2 if no_encoder_attn else 3
        layer = HCDecoderLayer(cfg, self._next_sites(sites), self.hc_rate, self.hc_dynamic, no_encoder_attn)
        return wrap_layer(layer, cfg)

    def run_layer(self, idx, layer, x, streams, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        streams, attn, _ = layer(
            streams, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
        )  # fmt: skip
        return streams.sum(2), streams, attn


