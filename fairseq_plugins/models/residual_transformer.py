"""``residual_transformer``: ResiDual (Pre-Post-LN) in encoder and decoder.

The equations, the authors' choices this follows and the FP16 scale are documented in
``fairseq_plugins/modules/dual_residual.py``. Named architectures: ``residual_e6d6`` ... ``residual_e36d6``
(base width) and ``residual_iwslt_*`` (the paper's IWSLT width), from the preset table.
"""

import torch
from torch import Tensor

from ..modules.dual_residual import (
    DualResidualStream,
    ResiDualDecoderLayer,
    ResiDualEncoderLayer,
)
from ..modules.layer_stack import LayerStackDecoder, LayerStackEncoder, wrap_layer


class ResiDualEncoder(LayerStackEncoder):
    torchscript = True

    def __init__(self, cfg, dictionary, embed_tokens, dual_residual_scale: float):
        super().__init__(cfg, dictionary, embed_tokens)
        self.dual_stream = DualResidualStream(
            embed_tokens.embedding_dim, dual_residual_scale, export=cfg.export
        )

    def build_encoder_layer(self, cfg):
        return wrap_layer(ResiDualEncoderLayer(cfg), cfg)

    def begin_layers(self, x):
        return self.dual_stream.start(x)

    def run_layer(self, idx: int, layer: ResiDualEncoderLayer, x, dual, padding_mask: Tensor | None):
        # TorchScript can pass a layer to a method only with its class named, and call it only by .forward
        if torch.jit.is_scripting():
            x, branch_sum = layer.forward(x, encoder_padding_mask=padding_mask)
        else:
            x, branch_sum = layer(x, encoder_padding_mask=padding_mask)
        return x, self.dual_stream.add(dual, branch_sum)

    def end_layers(self, x, dual):
        return self.dual_stream.merge(x, dual)


class ResiDualDecoder(LayerStackDecoder):
    torchscript = True

    def __init__(self, cfg, dictionary, embed_tokens, dual_residual_scale: float, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.dual_stream = DualResidualStream(
            embed_tokens.embedding_dim, dual_residual_scale, export=cfg.export
        )

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(ResiDualDecoderLayer(cfg, no_encoder_attn), cfg)

    def begin_layers(self, x):
        return self.dual_stream.start(x)

    def run_layer(
        self,
        idx: int,
        layer: ResiDualDecoderLayer,
        x,
        dual,
        encoder_out: Tensor | None,
        encoder_padding_mask: Tensor | None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None,
        self_attn_mask: Tensor | None,
        self_attn_padding_mask: Tensor | None,
        need_attn: bool,
    ):
        if torch.jit.is_scripting():  # see ResiDualEncoder.run_layer
            x, branch_sum, attn, _ = layer.forward(
                x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
            )  # fmt: skip
        else:
            x, branch_sum, attn, _ = layer(
                x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
            )  # fmt: skip
        return x, self.dual_stream.add(dual, branch_sum), attn

    def end_layers(self, x, dual):
        return self.dual_stream.merge(x, dual)


