"""ResiDual: the Pre-Post-LN dual residual (Xie et al., "ResiDual: Transformer with Dual Residual
Connections", arXiv:2304.14802, section 2.2 and appendix H.3).

Every sub-block k (self-attention, cross-attention, FFN) with output f_k = dropout(f_k(x_k)) updates

    x_{k+1}   = LN(x_k + f_k)          the Post-LN stream: fairseq's Post-LN layer, unchanged
    x^d_{k+1} = x^d_k + s * f_k        the dual (Pre-LN-like) stream
    y         = x_{N+1} + LN(x^d_{N+1})

Choices the paper leaves open, taken from the authors' released fairseq code (microsoft/ResiDual):
- the dual stream starts from the (scaled, position-embedded, dropped-out) embedding: x^d_1 = s * x_1;
- the sub-block outputs added to it are taken after dropout, as the Post-LN stream sees them;
- the final dual LayerNorm (eps 1e-7) replaces fairseq's final LayerNorm; Post-LN layers have none;
- the Post-LN stream enters the output unscaled (the authors' ``alpha`` is fixed at 1).

FP16 (appendix H.3): x^d grows with depth and can overflow half precision. The scale s (0 < s <= 1,
``--dual-residual-scale``) multiplies the whole dual stream, so LN(s * x^d) = LN(x^d) up to the LayerNorm
epsilon and the model output does not change, while x^d stays s times smaller. The authors used s = 0.05 for
their fp16 OPUS-100 runs.
"""

import types

import torch
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from .layer_stack import LayerStackDecoder, LayerStackEncoder, wrap_layer

DUAL_LAYER_NORM_EPS = 1e-7


class DualResidualStream(nn.Module):
    """The dual stream x^d: where it starts, how it grows, and how it joins the output.

    Args:
        embed_dim: model width.
        scale: s in x^d_1 = s * x_1, x^d_{k+1} = x^d_k + s * f_k.
        export: build a LayerNorm that can be exported (fairseq's ``--export``).
    """

    def __init__(self, embed_dim: int, scale: float = 1.0, export: bool = False):
        super().__init__()
        self.scale = scale
        self.layer_norm = LayerNorm(embed_dim, eps=DUAL_LAYER_NORM_EPS, export=export)

    def start(self, x: Tensor) -> Tensor:
        """x^d_1 from the embedding output x: (seq_len, batch, embed_dim)."""
        return x if self.scale == 1.0 else x * self.scale

    def add(self, dual: Tensor, branch_sum: Tensor) -> Tensor:
        """Add one layer's sub-block outputs (already summed) to the dual stream."""
        return dual + (branch_sum if self.scale == 1.0 else branch_sum * self.scale)

    def merge(self, x: Tensor, dual: Tensor) -> Tensor:
        """y = x_{N+1} + LN(x^d_{N+1})."""
        return x + self.layer_norm(dual)


def _alias(function, name: str):
    """A copy of ``function`` named ``name``: TorchScript compiles a method by its function's ``__name__``, so
    a plain alias of fairseq's ``forward`` would clash with the subclass's own ``forward``."""
    alias = types.FunctionType(
        function.__code__, function.__globals__, name, function.__defaults__, function.__closure__
    )
    alias.__kwdefaults__, alias.__annotations__ = function.__kwdefaults__, dict(function.__annotations__)
    alias.__qualname__ = function.__qualname__.rpartition(".")[0] + "." + name
    return alias


class _BranchSum:
    """Collect the sub-block outputs that fairseq's layer passes to ``residual_connection``.

    fairseq calls ``residual_connection(dropout(f_k(x)), x)`` once per sub-block, so overriding that hook
    gives every f_k without copying the layer's forward. The sum lives only for one forward call and is
    returned from it, so activation checkpointing recomputes it like any other output.

    TorchScript: the sum is a typed module attribute set in ``__init__`` (a scripted method can only assign
    attributes that exist), and fairseq's forward is reached as ``self.post_ln_forward``, an alias of the
    base class's ``forward`` (TorchScript cannot compile ``super()``).
    """

    _branch_sum: Tensor | None

    def _init_branch_sum(self) -> None:
        self._branch_sum = None

    def residual_connection(self, x, residual):
        branch_sum = self._branch_sum
        self._branch_sum = x if branch_sum is None else branch_sum + x
        return residual + x

    def _take_branch_sum(self) -> Tensor:
        branch_sum = self._branch_sum
        self._branch_sum = None
        assert branch_sum is not None
        return branch_sum


class ResiDualEncoderLayer(_BranchSum, TransformerEncoderLayerBase):
    """fairseq's Post-LN encoder layer that also returns the sum of its sub-block outputs.

    Returns:
        (x, branch_sum), both of shape `(seq_len, batch, embed_dim)`.
    """

    _branch_sum: Tensor | None  # TorchScript reads attribute types from the class's own annotations
    post_ln_forward = _alias(TransformerEncoderLayerBase.forward, "post_ln_forward")

    def __init__(self, cfg, return_fc: bool = False):
        super().__init__(cfg, return_fc)
        self._init_branch_sum()

    def forward(self, x, encoder_padding_mask: Tensor | None, attn_mask: Tensor | None = None):
        self._branch_sum = None
        x = self.post_ln_forward(x, encoder_padding_mask, attn_mask)
        return x, self._take_branch_sum()


class ResiDualDecoderLayer(_BranchSum, TransformerDecoderLayerBase):
    """fairseq's Post-LN decoder layer that also returns the sum of its sub-block outputs.

    Returns:
        (x, branch_sum, attn, self_attn_state): fairseq's outputs with branch_sum second.
    """

    _branch_sum: Tensor | None
    post_ln_forward = _alias(TransformerDecoderLayerBase.forward, "post_ln_forward")

    def __init__(self, cfg, no_encoder_attn: bool = False, add_bias_kv: bool = False, add_zero_attn: bool = False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        self._init_branch_sum()

    # fairseq 0.12.3 TransformerDecoderLayerBase.forward's signature, spelled out for TorchScript
    def forward(
        self,
        x,
        encoder_out: Tensor | None = None,
        encoder_padding_mask: Tensor | None = None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None = None,
        prev_self_attn_state: list[Tensor] | None = None,
        prev_attn_state: list[Tensor] | None = None,
        self_attn_mask: Tensor | None = None,
        self_attn_padding_mask: Tensor | None = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        self._branch_sum = None
        x, attn, self_attn_state = self.post_ln_forward(
            x, encoder_out, encoder_padding_mask, incremental_state, prev_self_attn_state, prev_attn_state,
            self_attn_mask, self_attn_padding_mask, need_attn, need_head_weights,
        )  # fmt: skip
        return x, self._take_branch_sum(), attn, self_attn_state


# ResiDual's encoder and decoder: its own stack pair on layer_stack.py's loop rather than carry_stack.py's, which
# TorchScript cannot compile (its hooks call a Python carry object); ResiDual scripts and prunes like the baseline.
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
