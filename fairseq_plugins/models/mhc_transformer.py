"""mHC and mHC-lite stacks (modules/mhc.py) for ``--depth-aggregation mhc``/``mhc-lite``.

mHC replaces hyper-connections' unit (H_pre, H_post, H_res per sublayer) and keeps HC's carry: n streams
`(seq_len, batch, n, embed_dim)`, the embedding replicated n times at the stack input, each layer's output
(fairseq's ``inner_states``) the sum of the streams, the stack's final LayerNorm on that sum. So the layers and
stacks are hc_transformer's with ``ManifoldHyperConnection`` in place of ``HyperConnection`` (same
``forward(streams, sublayer)`` interface); the layers keep fairseq's Pre-LN sublayers and their parameter names.
The coefficient maths runs with autocast off inside the module (not marked ``autocast_float32``: the sublayer
runs inside its forward).
"""

from torch import nn

from ..modules.attn_res import AttentionResiduals
from .hc_transformer import HCDecoder, HCDecoderLayer, HCEncoder, HCEncoderLayer
from .layer_stack import wrap_layer


class _Manifold:
    _mhc_options: dict

    def _build_hc(self, cfg_side, sites, first_site, rate, dynamic, export) -> None:
        from ..modules.mhc import ManifoldHyperConnection

        self.hc = nn.ModuleList(
            ManifoldHyperConnection(cfg_side.embed_dim, rate, first_site + j, **self._mhc_options) for j in range(sites)
        )


class MHCEncoderLayer(_Manifold, HCEncoderLayer):
    def __init__(self, cfg, first_site: int, rate: int, options: dict):
        self._mhc_options = options
        super().__init__(cfg, first_site, rate, True)


class MHCDecoderLayer(_Manifold, HCDecoderLayer):
    def __init__(self, cfg, first_site: int, rate: int, options: dict, no_encoder_attn: bool = False):
        self._mhc_options = options
        super().__init__(cfg, first_site, rate, True, no_encoder_attn)


class MHCEncoder(HCEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, rate: int, options: dict):
        self._mhc_options = options
        super().__init__(cfg, dictionary, embed_tokens, rate, True)

    def build_encoder_layer(self, cfg):
        first = self._next_sites(MHCEncoderLayer.SITES)
        return wrap_layer(MHCEncoderLayer(cfg, first, self.hc_rate, self._mhc_options), cfg)


class MHCDecoder(HCDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, rate: int, options: dict, no_encoder_attn=False):
        self._mhc_options = options
        super().__init__(cfg, dictionary, embed_tokens, rate, True, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        first = self._next_sites(2 if no_encoder_attn else 3)
        return wrap_layer(MHCDecoderLayer(cfg, first, self.hc_rate, self._mhc_options, no_encoder_attn), cfg)


# ---------------------------------------------------------------------------------------------------
# Frac-connections (modules/frac_connections.py): the same Pre-LN sublayers, one FracConnection per sublayer,
# on the ordinary C-wide stream: no streams to expand or collapse, the layer output is the state itself.


class _Fractional:
    _frac_options: dict

    def _build_hc(self, cfg_side, sites, first_site, rate, dynamic, export) -> None:
        from ..modules.frac_connections import FracConnection

        self.hc = nn.ModuleList(FracConnection(cfg_side.embed_dim, rate, dynamic) for _ in range(sites))


class FracEncoderLayer(_Fractional, HCEncoderLayer):
    pass


class FracDecoderLayer(_Fractional, HCDecoderLayer):
    pass


class FracEncoder(HCEncoder):
    def build_encoder_layer(self, cfg):
        first = self._next_sites(FracEncoderLayer.SITES)
        return wrap_layer(FracEncoderLayer(cfg, first, self.hc_rate, self.hc_dynamic), cfg)

    def begin_layers(self, x):
        return None

    def run_layer(self, idx, layer, x, carry, padding_mask):
        return layer(x, encoder_padding_mask=padding_mask), None


class FracDecoder(HCDecoder):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        first = self._next_sites(2 if no_encoder_attn else 3)
        return wrap_layer(FracDecoderLayer(cfg, first, self.hc_rate, self.hc_dynamic, no_encoder_attn), cfg)

    def begin_layers(self, x):
        return None

    def run_layer(self, idx, layer, x, carry, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        x, attn, _ = layer(
            x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
        )  # fmt: skip
        return x, None, attn


# ---------------------------------------------------------------------------------------------------
# Attention Residuals (modules/attn_res.py): one AttentionResiduals per stack; the carry between layers is
# (the stack's module, its AttnResState), and each sublayer site of a layer reads its input from it.


class AttnResSite(nn.Module):
    """Sublayer ``index`` of the stack: h_l from the sources, run the sublayer, record its output."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, carry, sublayer):
        attn_res, state = carry
        attn_res(self.index, state, sublayer)
        return carry


class _AttnResLayer:
    def _build_hc(self, cfg_side, sites, first_site, rate, dynamic, export) -> None:
        self.hc = nn.ModuleList(AttnResSite(first_site + j) for j in range(sites))


class AttnResEncoderLayer(_AttnResLayer, HCEncoderLayer):
    pass


class AttnResDecoderLayer(_AttnResLayer, HCDecoderLayer):
    pass


def _latest(carry):
    state = carry[1]
    return state.partial if state.partial is not None else state.blocks[-1]


class AttnResEncoder(HCEncoder):
    """``hc_rate`` is the block size S (sublayers per block)."""

    def __init__(self, cfg, dictionary, embed_tokens, block_size: int):
        super().__init__(cfg, dictionary, embed_tokens, block_size, False)
        self.attn_res = AttentionResiduals(cfg.encoder.embed_dim, 2 * len(self.layers), block_size)

    def build_encoder_layer(self, cfg):
        first = self._next_sites(AttnResEncoderLayer.SITES)
        return wrap_layer(AttnResEncoderLayer(cfg, first, 1, False), cfg)

    def begin_layers(self, x):
        return self.attn_res, self.attn_res.start(x)

    def run_layer(self, idx, layer, x, carry, padding_mask):
        carry = layer(carry, encoder_padding_mask=padding_mask)
        return _latest(carry), carry  # a layer's reported output (inner_states): its last sublayer's output

    def end_layers(self, x, carry):
        out = self.attn_res.finish(carry[1])
        return self.layer_norm(out) if self.layer_norm is not None else out


class AttnResDecoder(HCDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, block_size: int, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, block_size, False, no_encoder_attn=no_encoder_attn)
        per_layer = 2 if no_encoder_attn else 3
        self.attn_res = AttentionResiduals(cfg.decoder.embed_dim, per_layer * len(self.layers), block_size)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        first = self._next_sites(2 if no_encoder_attn else 3)
        return wrap_layer(AttnResDecoderLayer(cfg, first, 1, False, no_encoder_attn), cfg)

    def begin_layers(self, x):
        return self.attn_res, self.attn_res.start(x)

    def run_layer(self, idx, layer, x, carry, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        carry, attn, _ = layer(
            carry, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
        )  # fmt: skip
        return _latest(carry), carry, attn

    def end_layers(self, x, carry):
        out = self.attn_res.finish(carry[1])
        return self.layer_norm(out) if self.layer_norm is not None else out
