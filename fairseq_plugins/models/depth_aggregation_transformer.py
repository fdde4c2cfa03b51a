"""``denseformer_transformer`` and ``dlcl_transformer``: Pre-LN transformers whose layers read learned linear
combinations of the earlier layers' outputs (DenseFormer's depth-weighted averages, DLCL).

The equations, sources and interpretations are in ``fairseq_plugins/modules/depth_aggregation.py``. The layers
are fairseq's own Pre-LN layers; only the layer loop changes (layer_stack.py), and the outputs are kept in a
``DepthStack`` (modules/depth_stack.py: one preallocated buffer per forward pass, read as windows).

Incremental decoding: the combinations are per position, so the stack is rebuilt from the current position's
embedding at every step; beam search caches only attention's keys and values, as for the baseline.

Named architectures (presets.py): ``denseformer_*`` (1x1: every layer, every earlier
output; ``--denseformer-dilation``/``--denseformer-period`` give kxp) and ``dlcl_*``, at every depth and both
widths.
"""


from ..modules.depth_aggregation import (
    DepthWeightedAverages,
    DynamicLinearCombination,
)
from ..modules.depth_stack import DepthStack
from ..modules.layer_stack import (
    LayerStackDecoder,
    LayerStackEncoder,
    add_format_version,
)

# k or p beyond a stack's depth is allowed and degenerate: k > L gives every DWA only its own block (the
# baseline), p > L no DWA at all
MAX_PERIOD = 10_000


def _decoder_layer(layer, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                   self_attn_padding_mask, need_attn):  # fmt: skip
    return layer(
        x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
        self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- DenseFormer


class _DenseFormerStack:
    """Y_i = DWA_i(X_0 .. X_i) after the blocks i with i mod p = 0, else Y_i = X_i; the stack holds every X_j."""

    dwa: DepthWeightedAverages

    def begin_layers(self, x):
        return DepthStack(x, len(self.layers))

    def _after_block(self, i: int, stack: DepthStack):
        return self.dwa(i, stack.chunks()[0]) if self.dwa.has(i) else stack.last


class DenseFormerEncoder(_DenseFormerStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, dilation: int, period: int):
        super().__init__(cfg, dictionary, embed_tokens)
        self.dwa = DepthWeightedAverages(cfg.encoder.layers, dilation, period)
        add_format_version(self, "denseformer")

    def run_layer(self, idx, layer, x, stack, padding_mask):
        stack.push(layer(x, encoder_padding_mask=padding_mask))
        return self._after_block(idx + 1, stack), stack


class DenseFormerDecoder(_DenseFormerStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, dilation: int, period: int, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.dwa = DepthWeightedAverages(cfg.decoder.layers, dilation, period)
        add_format_version(self, "denseformer")

    def run_layer(self, idx, layer, x, stack, *args, **kwargs):
        x, attn, _ = _decoder_layer(layer, x, *args, **kwargs)
        stack.push(x)
        return self._after_block(idx + 1, stack), stack, attn


# ----------------------------------------------------------------------------------------------- DLCL


class _DLCLStack:
    """Layer l+1 reads x_{l+1} = sum_k W[l,k] LN_k(y_k); the stack holds LN_k(y_k) (y_0 = embedding)."""

    dlcl: DynamicLinearCombination

    def begin_layers(self, x):
        return DepthStack(x, len(self.layers))

    def _input(self, idx: int, stack: DepthStack):
        return self.dlcl(idx, stack.chunks()[0])

    def end_layers(self, x, stack: DepthStack):
        x = self.dlcl(len(self.layers), stack.chunks()[0])
        return self.layer_norm(x) if self.layer_norm is not None else x


class DLCLEncoder(_DLCLStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, init: str):
        super().__init__(cfg, dictionary, embed_tokens)
        self.dlcl = DynamicLinearCombination(cfg.encoder.layers, cfg.encoder.embed_dim, init, export=cfg.export)
        add_format_version(self, "dlcl")

    def run_layer(self, idx, layer, x, stack, padding_mask):
        y = layer(self._input(idx, stack), encoder_padding_mask=padding_mask)
        stack.push(self.dlcl.normalize(idx + 1, y))
        return y, stack


class DLCLDecoder(_DLCLStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, init: str, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.dlcl = DynamicLinearCombination(cfg.decoder.layers, cfg.decoder.embed_dim, init, export=cfg.export)
        add_format_version(self, "dlcl")

    def run_layer(self, idx, layer, x, stack, *args, **kwargs):
        y, attn, _ = _decoder_layer(layer, self._input(idx, stack), *args, **kwargs)
        stack.push(self.dlcl.normalize(idx + 1, y))
        return y, stack, attn


