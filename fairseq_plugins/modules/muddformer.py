"""MUDDFormer, multiway dynamic dense connections (Xiao et al., "MUDDFormer: Breaking Residual Bottlenecks in
Transformers via Multiway Dynamic Dense Connections", arXiv:2502.12170, eq. 5-8 and section 3 (equation
numbers via third-party notes); authors' code Caiyun-AI/MUDDFormer ``pytorch/muddformer/
modeling_muddformer.py`` (MultiwayDynamicDenseBlock, TransformerBlock) and ``jax/MaxText/layers/llama2.py``
(the training code's init), read at fc067b2).

After each block i (a whole Transformer layer, not a sublayer), a position-wise MLP on the block output X_i
generates, for each of C ways (Q, K, V, R), weights over all block outputs X_0 .. X_i (X_0 = embedding):

    A_i = GELU(RMSNorm(X_i) W1) W2 + a_i        W1 in R^{D x K_i}, W2 in R^{K_i x C(i+1)}, a_i in R^{C x (i+1)}
    Xbar_i^c[t] = sum_{j=0}^{i} A_i^c[t, j] X_j[t],   c in {Q, K, V, R}          unnormalised (eq. 5-6)

and the next block takes the four inputs separately (eq. 7): X'_A = MHA(LN_Q(Xbar^Q), LN_K(Xbar^K),
LN_V(Xbar^V)) + Xbar^R, then X' = X'_A + FFN(LN(X'_A)); one LN per stream (the code's ``sepln``; block 1 reads
X_0 for every way). The last connection (after block L) has C = 1 (R only) and the stack output is
Xbar_L^R -> final norm -> head (eq. 8).

Init (training code): W1 ~ N(0, 1/D) (fan-in normal), W2 = 0, no biases in the MLP, a_i = 1 at j = i and 0
elsewhere (``current_only``), so every way starts as X_i: each block reads the previous block's output and
the model is exactly its Pre-LN transformer at initialisation (the per-stream LNs start identical). The
RMSNorm has no learned scale (``RMSnormNoscale``, eps 1e-6 from the released config). K_i = C(i+1) as in the
paper; the code's extras are options: ``round64`` (K rounded up to (K // 64 + 1) * 64) and ``expand_last``
(the last connection's hidden size x4), both on in the released 2.8B config; ``mudd_prenorm/postnorm``
variants of the bias init are not offered. The MLP and the weights A run in float32 (at least); the
aggregation in the outputs' dtype.

Encoder-decoder decisions (ours; the paper is decoder-only):
- encoder: MUDD over the encoder blocks; Xbar_L^R + the final LN is the encoder output cross-attention reads;
- decoder: the Q/K/V ways feed self-attention and R is its residual. Cross-attention, minimal (default,
  ``ways=4``): an ordinary Pre-LN sublayer on X'_A; ``ways=5`` adds a fifth way for the cross-attention
  query (Xbar^C: cross-attention reads LN_C(Xbar^C), its residual stays X'_A); the layer loop decides which
  it wires; this module only produces the ways;
- per position across depth: the weights of token t depend on X_i[t] only. A decoding step keeps the
  current token's block outputs X_0 .. X_i (the code's ``LayerCache`` with T = 1, alive for the step); past
  positions' self-attention K/V stay in fairseq's cache, computed from their own K and V ways; beam
  reordering has nothing extra to reorder.

Interface: ``MultiwayDenseConnections(embed_dim, num_layers, ways=4)``; per forward pass (or decoding step)
``state, inputs = mudd.start(x0)`` (``inputs`` = the ways for block 1, all x0), then after block i (1-based)
``inputs = mudd(i, state, x_i)``: a tuple of ``ways`` tensors `(seq_len, batch, embed_dim)` for block i + 1,
or of one tensor (Xbar_L^R, before the final norm) after the last block.
"""

import functools
import math

import torch
import torch.nn.functional as F
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ..kernels.grn_ops import once_differentiable
from .attn_res import autocast_off, call
from .carry import Carry
from .site_layers import ChangedBranches
from .skinny import skinny_matmul

RMS_EPS = 1e-6
# the backwards accumulate into the pass's bank gradient, outside autograd: a second derivative would be wrong
NO_DOUBLE_BACKWARD = (
    "MUDD (fairseq_plugins/modules/muddformer.py) has no second derivative: a double backward (create_graph=True, "
    "e.g. a gradient penalty) cannot go through it"
)


class _Outputs:
    """X_0 .. X_i of one forward pass side by side, ``bank`` (slots, tokens, D), so that a connection's
    aggregation is one batched product (N, ways, i+1) x (N, i+1, D) instead of i + 1 multiply-adds over
    (N, ways, D); in backward the gradients of the slots, accumulated in place by the connections (``grad``,
    its first ``grad_rows`` slots written). The autograd functions' ctx keep it, so it holds no tensor with
    autograd history: the handles live on the forward pass's _State (a handle here would close a cycle through
    its grad_fn that Python's collector cannot see, leaking each step's graph)."""

    def __init__(self, slots: int, like: Tensor):
        self.bank = like.new_empty(slots, like.numel() // like.shape[-1], like.shape[-1])
        self.count = 0
        self.grad: Tensor | None = None
        self.grad_rows = 0
        self.consumed = 0  # slots whose gradient _Keep handed back in this backward


class _Keep(torch.autograd.Function):
    """Copies X_i into the bank; returns a handle (an empty tensor) that every later aggregation takes as
    input, so that autograd runs this backward after all of theirs, when the bank holds X_i's whole gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, outs: _Outputs) -> Tensor:
        ctx.outs, ctx.slot, ctx.shape = outs, outs.count, x.shape
        ctx.save_for_backward(x)  # only ties a double backward's error to x (once_differentiable)
        outs.bank[outs.count].copy_(x.reshape(outs.bank.shape[1:]))
        outs.count += 1
        return x.new_empty(0)

    @staticmethod
    @functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD)
    def backward(ctx, _):
        outs, s = ctx.outs, ctx.slot
        if outs.grad is None or s >= outs.grad_rows:
            grad = outs.bank.new_zeros(ctx.shape)
        else:
            # a copy: autograd may keep the tensor itself as a leaf's .grad, which must not alias the bank (a
            # second backward through the same graph, retain_graph, rewrites the bank)
            grad = outs.grad[s].clone().view(ctx.shape)
        outs.consumed += 1
        if outs.consumed == outs.count:  # every slot handed back: a second backward (retain_graph) writes anew
            outs.grad_rows, outs.consumed = 0, 0
        return grad, None


class _Aggregate(torch.autograd.Function):
    """Xbar (N, ways, D) = A (N, ways, k) X (N, k, D) over the bank's first k slots; backward accumulates
    A^T g into the bank's gradient in place (one tensor for all slots instead of one per slot and reader)."""

    @staticmethod
    def forward(ctx, a: Tensor, outs: _Outputs, *handles) -> Tensor:
        k = a.shape[-1]
        ctx.outs, ctx.handles = outs, len(handles)
        ctx.save_for_backward(a, *handles)  # the handles tie a double backward's error to the outputs read
        return torch.bmm(a, outs.bank[:k].transpose(0, 1))

    @staticmethod
    @functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD)
    def backward(ctx, grad: Tensor):
        a, *_ = ctx.saved_tensors
        outs, k = ctx.outs, a.shape[-1]
        grad = grad.contiguous()
        grad_a = torch.bmm(grad, outs.bank[:k].permute(1, 2, 0))
        if outs.grad is None:
            outs.grad = torch.empty_like(outs.bank)
        g = outs.grad[:k].transpose(0, 1)  # (N, k, D)
        at = a.transpose(1, 2)
        done = min(outs.grad_rows, k)
        if done:
            g[:, :done].baddbmm_(at[:, :done], grad)
        if done < k:  # slots no aggregation has reached yet: written (beta = 0 ignores the empty memory)
            g[:, done:].baddbmm_(at[:, done:], grad, beta=0)
            outs.grad_rows = k
        return (grad_a, None) + (None,) * ctx.handles


class DenseConnection(nn.Module):
    """The dynamic dense connection after block i: A_i and the aggregation over X_0 .. X_i."""

    def __init__(self, embed_dim: int, index: int, ways: int, hidden: int, eps: float = RMS_EPS):
        super().__init__()
        self.index, self.ways, self.eps = index, ways, eps
        self.w1 = nn.Parameter(torch.randn(embed_dim, hidden) / math.sqrt(embed_dim))  # N(0, 1/D)
        self.w2 = nn.Parameter(torch.zeros(hidden, ways * (index + 1)))
        static = torch.zeros(ways, index + 1)
        static[:, index] = 1.0  # current_only: every way starts as X_i
        self.static = nn.Parameter(static)

    def weights(self, x: Tensor) -> Tensor:
        """A_i (seq_len, batch, ways, i + 1), float32 at least."""
        acc = x.to(torch.promote_types(x.dtype, torch.float32))
        # autocast (the plugin's --autocast-dtype) would run these products in half precision
        with autocast_off(x.device.type):
            # the mean square in one pass (square().mean() writes and re-reads an x-sized temporary)
            scale = torch.rsqrt(torch.linalg.vector_norm(acc, dim=-1, keepdim=True).square() / acc.shape[-1] + self.eps)
            w1 = self.w1.to(acc.dtype)
            # RMSNorm(x) W1 with the thin W1 first (modules/skinny.py; without autograd the product alone)
            if torch.is_grad_enabled():
                hidden = skinny_matmul(acc, w1)
            else:
                hidden = (w1.t() @ acc.reshape(-1, acc.shape[-1]).t()).t().reshape(*acc.shape[:-1], -1)
            hidden = hidden * scale
            dynamic = F.gelu(hidden) @ self.w2.to(acc.dtype)
        return dynamic.view(*x.shape[:-1], self.ways, self.index + 1) + self.static.to(acc.dtype)

    def forward(self, outputs: list) -> tuple:
        last = outputs[-1]
        a = self.weights(last).to(last.dtype)  # (seq_len, batch, ways, i + 1)
        outs = getattr(outputs, "outs", None)
        if outs is None:  # a plain list of the block outputs: a running sum (no stacked copy kept for backward)
            a = a.unsqueeze(-1)
            mixed = a[..., 0, :] * outputs[0].unsqueeze(-2)  # (seq_len, batch, ways, D)
            for j in range(1, self.index + 1):
                mixed = torch.addcmul(mixed, a[..., j, :], outputs[j].unsqueeze(-2))
            return tuple(mixed.unbind(-2))
        with autocast_off(last.device.type):  # in the outputs' dtype, as the running sum
            mixed = call(_Aggregate, a.reshape(-1, self.ways, self.index + 1).to(outs.bank.dtype), outs, *outputs.handles)
        return tuple(mixed.view(*last.shape[:-1], self.ways, last.shape[-1]).unbind(-2))


class _State(list):
    """The block outputs X_0 .. X_i recorded so far (a list), with their bank (``outs``) and the handles that
    order every aggregation's backward before the _Keep backward of the slots it reads."""

    outs: _Outputs
    handles: list


class MultiwayDenseConnections(nn.Module):
    """MUDD connections of one stack of ``num_layers`` blocks.

    Args:
        embed_dim: D.
        num_layers: L.
        ways: C of the connections after blocks 1 .. L-1 (4 = Q, K, V, R; 5 adds a cross-attention query way).
        round64: K_i rounded up to (K_i // 64 + 1) * 64 (code).
        expand_last: the last connection's hidden size x4 (code).
    """

    def __init__(self, embed_dim: int, num_layers: int, ways: int = 4, round64: bool = False,
                 expand_last: bool = False, eps: float = RMS_EPS):
        super().__init__()
        if ways not in (4, 5):
            raise ValueError(f"MUDD ways must be 4 (Q, K, V, R) or 5 (+ cross-attention query), got {ways}")
        if num_layers < 1:
            raise ValueError(f"MUDD needs num_layers >= 1, got {num_layers}")
        self.ways, self.num_layers = ways, num_layers
        connections = []
        for i in range(1, num_layers + 1):
            c = 1 if i == num_layers else ways
            hidden = c * (i + 1) * (4 if expand_last and i == num_layers else 1)
            if round64:
                hidden = (hidden // 64 + 1) * 64
            connections.append(DenseConnection(embed_dim, i, c, hidden, eps))
        self.connections = nn.ModuleList(connections)

    def start(self, x0: Tensor) -> tuple[list, tuple]:
        if torch.compiler.is_compiling():
            # the bank's autograd functions share state outside autograd, which torch.compile cannot trace: a
            # plain list, whose running sums autograd differentiates (the compiler fuses them)
            return [x0], (x0,) * self.ways
        state = _State([x0])
        state.outs = _Outputs(self.num_layers + 1, x0)
        state.handles = [call(_Keep, x0, state.outs)]
        return state, (x0,) * self.ways

    def forward(self, index: int, state: list, output: Tensor) -> tuple:
        """Records X_index (1-based block index) and returns the ways for block index + 1 (or Xbar_L^R)."""
        if not 1 <= index <= self.num_layers or len(state) != index:
            raise IndexError(f"MUDD block index {index} out of order (have {len(state)} outputs)")
        state.append(output)
        if isinstance(state, _State) and torch.compiler.is_compiling():
            state.outs = None  # begun outside compiled code: from here on the plain list's path (start)
        if getattr(state, "outs", None) is not None:
            state.handles.append(call(_Keep, output, state.outs))
        return self.connections[index - 1](state)


# ------------------------------------------------------------------------------------------- the layers, the carry
# After each layer a MultiwayDenseConnection makes four inputs for the next layer from all earlier layer outputs
# (Q, K, V ways into self-attention, each with its own LayerNorm, the code's ``sepln``; R its residual). The
# layers are fairseq's Pre-LN layers (their parameter names stay) plus ``key_layer_norm``/``value_layer_norm``;
# self_attn_layer_norm is LN_Q. Decoder cross-attention is an ordinary Pre-LN sublayer on X'_A (the module's
# default ``ways=4``). The stack output is Xbar_L^R, then the final LayerNorm.
#
# fairseq's MultiheadAttention with ``self_attention=True`` projects K and V from the query argument, so the
# layers switch that flag off: K and V are projected from their own ways; the incremental cache appends the new
# position's K/V as for self-attention (static_kv off), so incremental decoding equals full decoding.


class _MUDDLayer(ChangedBranches):
    """A residual choice's change of each branch (``branch_output``, site_layers.BranchChange, which states the
    maths) applies to the attention, cross-attention and FFN outputs where they are added."""

    def _add_way_norms(self, embed_dim: int, export: bool) -> None:
        self.key_layer_norm = LayerNorm(embed_dim, export=export)
        self.value_layer_norm = LayerNorm(embed_dim, export=export)
        self.self_attn.self_attention = False  # K, V from their own ways (the comment above)

    def _ffn(self, x):
        h = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x))))
        return x + self.branch_output("ffn", self.dropout_module(self.fc2(h)))


class MUDDEncoderLayer(_MUDDLayer, TransformerEncoderLayerBase):
    def __init__(self, cfg):
        super().__init__(cfg)
        self._add_way_norms(cfg.encoder.embed_dim, cfg.export)

    def forward(self, ways, encoder_padding_mask, attn_mask=None):
        q, k, v, r = ways
        h, _ = self.self_attn(query=self.self_attn_layer_norm(q), key=self.key_layer_norm(k),
                              value=self.value_layer_norm(v), key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)  # fmt: skip
        return self._ffn(r + self.branch_output("self_attn", self.dropout_module(h)))


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
        x = r + self.branch_output("self_attn", self.dropout_module(h))
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            need_attn = need_attn or need_head_weights
            h, attn = self.encoder_attn(
                query=self.encoder_attn_layer_norm(x), key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights,
            )  # fmt: skip
            x = x + self.branch_output("encoder_attn", self.dropout_module(h))
        return self._ffn(x), attn, None


class MUDDCarry(Carry):
    """MUDDFormer's carry (modules/carry.py): the state is (the stack's _State of block outputs, the four ways
    for the next layer); the stack builds the MUDD layers above and its ``mudd`` (MultiwayDenseConnections);
    the stack output is Xbar_L^R, then the final LayerNorm. MUDD checkpoints record no format version."""

    version = None

    def encoder_layer(self, cfg, index: int) -> nn.Module:
        return MUDDEncoderLayer(cfg)

    def decoder_layer(self, cfg, index: int, no_encoder_attn: bool) -> nn.Module:
        return MUDDDecoderLayer(cfg, no_encoder_attn)

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        return {"mudd": MultiwayDenseConnections(embed_dim, layers)}

    def begin(self, stack: nn.Module, x: Tensor):
        return stack.mudd.start(x)

    def layer_input(self, stack: nn.Module, idx: int, x: Tensor, state):
        return state[1]

    def after_layer(self, stack: nn.Module, idx: int, x: Tensor, y: Tensor, state):
        outputs = state[0]
        return y, (outputs, stack.mudd(idx + 1, outputs, y))

    def end(self, stack: nn.Module, x: Tensor, state) -> Tensor:
        return state[1][0]  # Xbar_L^R
