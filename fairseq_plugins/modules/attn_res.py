"""Attention Residuals, AttnRes (Kimi Team / Moonshot AI, "Attention Residuals", arXiv:2603.15031, sections
3.1-3.2, eq. 1-6, figure 2's pseudocode, section 5 "Architecture details"; the authors' repository
MoonshotAI/Attention-Residuals could not be read here).

The additive residual stream is removed: every sublayer's input is a softmax-weighted sum of the embedding
and the earlier sublayers' outputs, weighted by a learned, input-independent pseudo-query w_l in R^C:

    v_0 = h_1 (the embedding output),  v_i = f_i(h_i) (output of sublayer i, i >= 1)
    alpha_{i->l} = exp(w_l^T RMSNorm(v_i)) / sum_{j=0}^{l-1} exp(w_l^T RMSNorm(v_j))        (eq. 2-3)
    h_l = sum_{i=0}^{l-1} alpha_{i->l} v_i                                                  (eq. 4)

with no 1/sqrt(C) and no temperature; the values are the raw outputs; each sublayer keeps its own pre-norm,
f_l(h) = dropout(F(LN(h))) (figure 2: ``attn(attn_norm(h))``). Block AttnRes (eq. 5-6): the sublayers are
cut into blocks of S; b_0 = h_1, b_n = the sum of block n's outputs, b_n^i its partial sum after i outputs;
the i-th sublayer of block n reads V = [b_0 .. b_{n-1}] if i = 1, else [b_0 .. b_{n-1}, b_n^{i-1}]. S = 1 is
Full AttnRes. Figure 2 closes a block at the start of the next block's first sublayer, after that sublayer
has read its input; closing it after the block's last output, as here, gives the same sources.
Stack output (section 3.2: "the final output layer aggregates all N block representations"): one more
AttnRes with its own pseudo-query over all sources; the final norm after it is our reading.

Init and constants (section 5): every pseudo-query w_l = 0, so every sublayer starts from the uniform
average of its sources (the paper's stated requirement); one RMSNorm on the keys per sublayer (learned gain,
init 1; eps 1e-6 is ours, the paper gives none). Blocks: N ~ 8 in the paper (Kimi Linear 48B: 54
sublayers, S = 6); its ablation has S = 2, 4, 8 equally good and S >= 16 drifting to the baseline.

Computation: w_l^T RMSNorm_l(v) = (w_l * g_l)^T v / rms(v); a completed block's logits for every later query
are one product when the block completes (cached in the state); only the partial sum of Block AttnRes is
scored at each read. Logits, rms and softmax run in float32 (at
least); the weighted sum in the sources' dtype, as a running sum over the sources (no stacked copy).

Encoder-decoder decisions (ours; the paper is decoder-only):
- one AttnRes per stack, each with its own queries; decoder sources = target embedding + the outputs of
  self-attention, cross-attention and FFN sublayers (3 per layer), so ``block_size`` counts sublayers (a
  multiple of 3 aligns decoder blocks with layers, of 2 encoder blocks);
- the encoder output that cross-attention reads = the final aggregate + the final LayerNorm (cached by
  fairseq as today);
- dropout on f_l's output before it becomes a source (part of ``sublayer``);
- per position across depth: a decoding step needs only the current token's sources (O(N C) per hypothesis,
  alive for the step); nothing is cached across time steps and beam reordering has nothing extra to reorder.

Interface: ``AttentionResiduals(embed_dim, num_sublayers, block_size=1)``; per forward pass (or decoding
step) ``state = ar.start(embedding)``, then for each sublayer l = 0..L-1 ``ar(l, state, sublayer)`` (reads h_l,
runs ``sublayer`` on it, records the output), and ``ar.finish(state)`` for the stack output before the final
norm. ``sublayer`` maps h `(seq_len, batch, embed_dim)` to dropout(F(LN(h))).
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

RMS_EPS = 1e-6


@dataclass
class AttnResState:
    """The sources of one stack for one forward pass: completed blocks (b_0 = embedding first), the current
    block's partial sum and how many outputs it holds; per completed block its logits for every later query
    (float32, ``block_logits``) and the index of its first query (``block_first``); ``written``: the outputs
    recorded so far."""

    blocks: list = field(default_factory=list)
    block_logits: list = field(default_factory=list)
    block_first: list = field(default_factory=list)
    partial: Tensor | None = None
    count: int = 0
    written: int = 0


class AttentionResiduals(nn.Module):
    """AttnRes of one stack (Full for ``block_size`` 1, Block otherwise).

    Args:
        embed_dim: C.
        num_sublayers: L, the sublayers of the stack (encoder 2 per layer, decoder 3).
        block_size: S, sublayers per block.
    """

    def __init__(self, embed_dim: int, num_sublayers: int, block_size: int = 1, eps: float = RMS_EPS):
        super().__init__()
        if num_sublayers < 1 or block_size < 1:
            raise ValueError(f"AttnRes needs num_sublayers >= 1 and block_size >= 1, got {num_sublayers}, {block_size}")
        self.num_sublayers, self.block_size, self.eps = num_sublayers, block_size, eps
        self.queries = nn.Parameter(torch.zeros(num_sublayers + 1, embed_dim))  # w_1..w_L, then the output's
        self.key_gains = nn.Parameter(torch.ones(num_sublayers + 1, embed_dim))  # RMSNorm gains on the keys

    def _keys(self, first: int, last: int, acc: torch.dtype) -> Tensor:
        """w_l * g_l for queries first..last - 1, (queries, C)."""
        return (self.queries[first:last] * self.key_gains[first:last]).to(acc)

    def _logits(self, v: Tensor, first: int, last: int) -> Tensor:
        """w_l^T RMSNorm_l(v) for queries first..last - 1: (..., queries), float32 at least."""
        acc = torch.promote_types(v.dtype, torch.float32)
        # autocast (the plugin's --autocast-dtype) would run these products in half precision
        with torch.autocast(v.device.type, enabled=False):
            v = v.to(acc)
            return (v @ self._keys(first, last, acc).t()) / torch.sqrt(v.square().mean(-1, keepdim=True) + self.eps)

    def _add_block(self, state: AttnResState, block: Tensor) -> None:
        # a completed block is a source of every later query, and its values never change: its logits for
        # all of them in one product (read once, one GEMM) instead of one matrix-vector product per read
        state.blocks.append(block)
        state.block_logits.append(self._logits(block, state.written, self.num_sublayers + 1))
        state.block_first.append(state.written)

    def start(self, embedding: Tensor) -> AttnResState:
        state = AttnResState()
        self._add_block(state, embedding)
        return state

    def read(self, index: int, state: AttnResState) -> Tensor:
        """sum_i alpha_{i->l} v_i over the current sources, with query ``index`` (L = the stack output's)."""
        values = list(state.blocks)
        logits = [lg[..., index - first] for lg, first in zip(state.block_logits, state.block_first)]
        if state.partial is not None:
            values.append(state.partial)
            logits.append(self._logits(state.partial, index, index + 1)[..., 0])
        # autocast (the plugin's --autocast-dtype) would run the softmax in half precision
        with torch.autocast(values[0].device.type, enabled=False):
            weights = torch.stack(logits).softmax(0).to(values[0].dtype).unsqueeze(-1)  # (sources, seq, batch, 1)
        # a running sum instead of one product with the stacked sources: stacking would copy every source
        # at every read and keep the copy for backward (O(L^2) activations); addcmul keeps references only
        out = weights[0] * values[0]
        for w, v in zip(weights[1:], values[1:]):
            out = torch.addcmul(out, w, v)
        return out

    def write(self, state: AttnResState, out: Tensor) -> None:
        state.partial = out if state.partial is None else state.partial + out
        state.count += 1
        state.written += 1
        if state.count == self.block_size:
            self._add_block(state, state.partial)
            state.partial, state.count = None, 0

    def forward(self, index: int, state: AttnResState, sublayer) -> Tensor:
        """Runs sublayer ``index`` (0-based) on h_l and records its output; returns the output f_l(h_l)."""
        if not 0 <= index < self.num_sublayers:
            raise IndexError(f"AttnRes sublayer index {index} outside [0, {self.num_sublayers})")
        out = sublayer(self.read(index, state))
        self.write(state, out)
        return out

    def finish(self, state: AttnResState) -> Tensor:
        """The stack output: one more AttnRes over all sources (then the caller's final norm)."""
        return self.read(self.num_sublayers, state)
