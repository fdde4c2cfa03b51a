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
are one product when the block completes (one logits table per forward pass); only the partial sum of Block
AttnRes is scored at each read. Logits, rms and softmax run in float32 (at least); the weighted sum in the
sources' dtype, as an in-place running sum over the sources in training (no stacked copy kept for backward) and
one batched product over a side-by-side copy of the blocks when decoding. Backward accumulates each block's
gradient in place across its reads and hands it back once (_Store, _Read; docs/speed.md).

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
norm. ``sublayer`` maps h `(seq_len, batch, embed_dim)` to dropout(F(LN(h))). In the model: ``AttnResCarry``
(modules/carry.py's interface; modules/carry_stack.py runs it), one ``AttnResSite`` per sublayer.
"""

import contextlib
import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..kernels.grn_ops import once_differentiable
from .carry import Carry

RMS_EPS = 1e-6
# the backwards accumulate into buffers shared by the pass, outside autograd: a second derivative would be wrong
NO_DOUBLE_BACKWARD = (
    "AttnRes (fairseq_plugins/modules/attn_res.py) has no second derivative: a double backward (create_graph=True, "
    "e.g. a gradient penalty) cannot go through it"
)


def autocast_off(device_type: str):
    """``torch.autocast(enabled=False)`` where autocast is on, else nothing (the context costs a few
    microseconds to enter and leave, which decoding pays at every sublayer of every step)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class _NoGrad:
    """The ctx of an autograd function's forward called directly, without autograd (decoding): Function.apply
    costs several microseconds a call."""

    def save_for_backward(self, *tensors):
        pass


def call(function, *args):
    """``function.apply(*args)``, or its forward alone where autograd is off."""
    if torch.is_grad_enabled():
        return function.apply(*args)
    return function.forward(_NoGrad(), *args)


class _Sources:
    """The completed blocks of one forward pass: the tensors (as (tokens, C) views), their logits for every
    query side by side (tokens, slots, queries; float32 at least; slot s holds queries first_s onwards); in
    backward each block's gradient, accumulated in place by the reads. Without autograd (decoding) the blocks
    are also copied side by side, ``bank`` (slots, tokens, C), so that a read is one batched product."""

    def __init__(self, tokens: int, slots: int, queries: int, like: Tensor, acc: torch.dtype, bank: bool):
        self.values: list[Tensor] = []
        self.logits = like.new_empty(tokens, slots, queries, dtype=acc)
        self.bank = like.new_empty(slots, tokens, like.shape[-1]) if bank else None
        self.grad_values: list[Tensor | None] = [None] * slots
        self.grad_logits: Tensor | None = None
        self.scratch: Tensor | None = None

    def grad_logits_(self) -> Tensor:
        if self.grad_logits is None:
            self.grad_logits = torch.zeros_like(self.logits)
        return self.grad_logits


class _Store(torch.autograd.Function):
    """Records a completed block v and scores it against queries first..: w_q^T RMSNorm_q(v) = (v . k_q) /
    rms(v), k = w * g. Returns a handle (an empty tensor) that every later read takes as input, so that
    autograd runs this backward after all of theirs: the block's gradient is then complete, accumulated in place
    by the reads (autograd would make one tensor per read, and a zero-filled logits gradient per read, and sum
    them)."""

    @staticmethod
    def forward(ctx, v: Tensor, keys: Tensor, src: _Sources, first: int, eps: float) -> Tensor:
        slot = len(src.values)
        # detached: a view of v would keep v's grad_fn alive through src, which every read's ctx holds, a cycle
        # through the autograd graph that Python's collector cannot see (each step's graph would leak)
        rows = v.detach().reshape(-1, v.shape[-1])
        src.values.append(rows)
        if src.bank is not None:
            src.bank[slot].copy_(rows)
        vv = rows.to(keys.dtype)
        # the mean square in one pass (square().mean() writes and re-reads a temporary of v's size)
        inv = torch.rsqrt(torch.linalg.vector_norm(vv, dim=-1, keepdim=True).square() / vv.shape[-1] + eps)
        # thin operand first (modules/skinny.py: v @ k^T with few keys is several times slower on the CPU)
        torch.mul((keys[first:] @ vv.t()).t(), inv, out=src.logits[:, slot, first:])
        ctx.src, ctx.slot, ctx.first, ctx.shape = src, slot, first, v.shape
        ctx.save_for_backward(keys, inv, v)  # v only ties a double backward's error to it (once_differentiable)
        return v.new_empty(0)

    @staticmethod
    @functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD)
    def backward(ctx, _):
        keys, inv, _ = ctx.saved_tensors
        src, s, f = ctx.src, ctx.slot, ctx.first
        v = src.values[s]
        grad, src.grad_values[s] = src.grad_values[s], None
        vv = v.to(keys.dtype)
        glg = src.grad_logits_()[:, s, f:]
        scaled = glg * inv  # d / d (v . k_q)
        # d(1/rms)/dv = -v / (C rms^3): a per-token multiple of v, added to the key product's gradient
        coef = (glg * src.logits[:, s, f:]).sum(-1, keepdim=True) * inv.square() / -v.shape[-1]
        if grad is not None and grad.dtype == vv.dtype:  # in place: a fresh (tokens, C) tensor faults its pages
            grad_v = grad.addcmul_(vv, coef).addmm_(scaled, keys[f:])
        else:
            grad_v = (vv * coef).addmm_(scaled, keys[f:]).to(v.dtype)
            grad_v = grad_v if grad is None else grad.add_(grad_v)
        grad_keys = None
        if ctx.needs_input_grad[1]:
            grad_keys = keys.new_zeros(keys.shape)
            torch.mm(scaled.t(), vv, out=grad_keys[f:])
        glg.zero_()  # consumed: a second backward through the same graph (retain_graph) starts from zero
        return grad_v.view(ctx.shape), grad_keys, None, None, None


class _Read(torch.autograd.Function):
    """h = sum_s softmax_s(logits[:, s, q]) v_s over the first ``slots`` completed blocks (and the partial sum p
    with its logit, if given), as one running multiply-add in place (or one batched product over the bank);
    backward accumulates each block's gradient in place (see _Store)."""

    @staticmethod
    def forward(ctx, src: _Sources, query: int, slots: int, partial, partial_logit, *handles):
        logits = src.logits[:, :slots, query]
        if partial is not None:
            logits = torch.cat([logits, partial_logit.unsqueeze(-1)], 1)
        weights = logits.softmax(-1)
        values = src.values
        if src.bank is not None:
            out = torch.bmm(weights[:, None, :slots].to(values[0].dtype), src.bank[:slots].transpose(0, 1))[:, 0]
            wt = weights.t().to(values[0].dtype).unsqueeze(-1) if partial is not None else None
        else:
            wt = weights.t().to(values[0].dtype).unsqueeze(-1)  # (sources, tokens, 1)
            out = values[0] * wt[0]
            for i in range(1, slots):  # in place where the dtypes allow (a fresh tensor per source is slower)
                same = torch.promote_types(out.dtype, values[i].dtype) == out.dtype
                out = out.addcmul_(values[i], wt[i]) if same else out.addcmul(values[i], wt[i])
        if partial is not None:
            out = torch.addcmul(out, partial, wt[slots])
        ctx.src, ctx.query, ctx.slots, ctx.handles = src, query, slots, len(handles)
        # partial_logit and the handles only tie a double backward's error to them (once_differentiable)
        ctx.save_for_backward(weights, wt, partial, partial_logit, *handles)
        return out

    @staticmethod
    @functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD)
    def backward(ctx, grad: Tensor):
        weights, wt, partial, *_ = ctx.saved_tensors
        src, q, k = ctx.src, ctx.query, ctx.slots
        grad = grad.contiguous()
        sources = src.values[:k] + ([partial] if partial is not None else [])
        # g . v_s per token through one reused product buffer: a fresh (tokens, C) temporary per source costs
        # more than the product (first-touch page faults of the allocation, measured 0.6 ms at 1024 x 256)
        if src.scratch is None or src.scratch.shape != grad.shape or src.scratch.dtype != grad.dtype:
            src.scratch = torch.empty_like(grad)  # one per forward pass, reused by every read's backward
        tmp, gw = src.scratch, grad.new_empty(len(sources), grad.shape[0])
        for s, v in enumerate(sources):
            if v.dtype == grad.dtype:
                torch.sum(torch.mul(grad, v, out=tmp), -1, out=gw[s])
            else:
                gw[s] = torch.linalg.vecdot(grad, v.to(grad.dtype))
        gw = gw.t().to(weights.dtype)
        glg = weights * (gw - (weights * gw).sum(-1, keepdim=True))  # softmax backward
        src.grad_logits_()[:, :k, q] += glg[:, :k]
        for s in range(k):
            acc = src.grad_values[s]
            if acc is None:
                src.grad_values[s] = grad * wt[s]
            else:
                acc.addcmul_(grad, wt[s])
        grad_partial = grad_partial_logit = None
        if partial is not None:
            grad_partial, grad_partial_logit = grad * wt[k], glg[:, k]
        return (None, None, None, grad_partial, grad_partial_logit) + (None,) * ctx.handles


def _plain(state: "AttnResState") -> bool:
    """Whether this pass takes the plain path: autograd's own backward over the stacked sources, no shared
    buffers. torch.compile cannot trace _Store's and _Read's state shared outside autograd (in-place writes into
    ``_Sources``); under it the pass turns plain from here on, and the compiler fuses the plain operators."""
    if torch.compiler.is_compiling():
        state.sources = None
    return state.sources is None


@dataclass
class AttnResState:
    """The sources of one stack for one forward pass: completed blocks (b_0 = embedding first), the current
    block's partial sum and how many outputs it holds; ``written``: the outputs recorded so far. The completed
    blocks are also copied side by side into ``bank`` with their logits for every later query (see _Store);
    ``handles`` ties each read to the blocks it reads (autograd order); ``keys`` = w * g for every query."""

    blocks: list = field(default_factory=list)
    partial: Tensor | None = None
    count: int = 0
    written: int = 0
    sources: _Sources | None = None
    handles: list = field(default_factory=list)
    keys: Tensor | None = None


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

    def _add_block(self, state: AttnResState, block: Tensor) -> None:
        if _plain(state):
            state.blocks.append(block)
            return
        # a completed block is a source of every later query, and its values never change: its logits for
        # all of them in one product (read once, one GEMM) instead of one matrix-vector product per read
        # (autocast, the plugin's --autocast-dtype, would run the logits in half precision)
        with autocast_off(block.device.type):
            handle = call(_Store, block, state.keys, state.sources, state.written, self.eps)
        state.blocks.append(block)
        state.handles.append(handle)

    def start(self, embedding: Tensor) -> AttnResState:
        acc = torch.promote_types(embedding.dtype, torch.float32)
        tokens = embedding.numel() // embedding.shape[-1]
        slots = 1 + self.num_sublayers // self.block_size
        with autocast_off(embedding.device.type):
            keys = (self.queries * self.key_gains).to(acc)
        sources = None  # under torch.compile: the plain path (``_plain``)
        if not torch.compiler.is_compiling():
            sources = _Sources(tokens, slots, self.num_sublayers + 1, embedding, acc, not torch.is_grad_enabled())
        state = AttnResState(sources=sources, keys=keys)
        self._add_block(state, embedding)
        return state

    def _partial(self, index: int, state: AttnResState):
        """The current block's partial sum as (tokens, C) rows and its logit for query ``index``, or Nones."""
        if state.partial is None:
            return None, None
        partial = state.partial.reshape(-1, state.partial.shape[-1])
        p = partial.to(state.keys.dtype)
        return partial, (p @ state.keys[index]) * torch.rsqrt(p.square().mean(-1) + self.eps)

    def read(self, index: int, state: AttnResState) -> Tensor:
        """sum_i alpha_{i->l} v_i over the current sources, with query ``index`` (L = the stack output's)."""
        shape = state.blocks[0].shape
        # autocast (the plugin's --autocast-dtype) would run the logits, softmax and products in half precision
        with autocast_off(state.blocks[0].device.type):
            if _plain(state):
                values, logits = self._plain_logits(index, state)
                weights = logits.softmax(-1).t().unsqueeze(-1).to(values.dtype)  # (sources, tokens, 1)
                return (weights * values).sum(0).view(shape)
            partial, partial_logit = self._partial(index, state)
            out = call(_Read, state.sources, index, len(state.blocks), partial, partial_logit, *state.handles)
        return out.view(shape)

    def _plain_logits(self, index: int, state: AttnResState) -> tuple[Tensor, Tensor]:
        """The sources (completed blocks, then the partial sum if any) stacked as (sources, tokens, C) and their
        logits for query ``index`` (tokens, sources): the formula _Store and _Read compute, by autograd."""
        rows = [v.reshape(-1, v.shape[-1]) for v in state.blocks]
        if state.partial is not None:
            rows.append(state.partial.reshape(-1, state.partial.shape[-1]))
        dtype = functools.reduce(torch.promote_types, [r.dtype for r in rows])
        values = torch.stack([r.to(dtype) for r in rows])
        vv = values.to(state.keys.dtype)
        logits = (vv @ state.keys[index]) * torch.rsqrt(vv.square().mean(-1) + self.eps)
        return values, logits.t()

    def weights(self, index: int, state: AttnResState) -> Tensor:
        """alpha_{i->l} of query ``index`` over the sources it would read now, (tokens, sources): the completed
        blocks in order (the embedding first), then the partial sum if any. For inspection
        (scripts/analysis/attnres_weights.py); ``read`` computes the same softmax inside its autograd function."""
        with torch.no_grad(), autocast_off(state.blocks[0].device.type):
            if state.sources is None:
                return self._plain_logits(index, state)[1].softmax(-1)
            _, partial_logit = self._partial(index, state)
            logits = state.sources.logits[:, : len(state.blocks), index]
            if partial_logit is not None:
                logits = torch.cat([logits, partial_logit.unsqueeze(-1)], 1)
            return logits.softmax(-1)

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


class AttnResSite(nn.Module):
    """Sublayer ``index`` of the stack as a site (modules/carry.py): h_l from the sources, run the sublayer,
    record its output. No weights: the pseudo-queries are the stack's ``attn_res``."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, state, sublayer):
        attn_res, sources = state
        attn_res(self.index, sources, sublayer)
        return state


class AttnResCarry(Carry):
    """AttnRes' carry (modules/carry.py): one ``AttentionResiduals`` per stack, registered as its ``attn_res``;
    the state is (that module, its AttnResState), which every site reads from and writes to. A layer's output
    (fairseq's ``inner_states``) is its last sublayer's output (the block's partial sum, or the block it
    completed); the stack output is ``finish``, the aggregate over all sources."""

    def __init__(self, block_size: int):
        self.block_size = block_size

    def site(self, embed_dim: int, index: int) -> nn.Module:
        return AttnResSite(index)

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        return {"attn_res": AttentionResiduals(embed_dim, sites, self.block_size)}

    def begin(self, stack: nn.Module, x: Tensor):
        return stack.attn_res, stack.attn_res.start(x)

    def layer_output(self, state) -> Tensor:
        sources = state[1]
        return sources.partial if sources.partial is not None else sources.blocks[-1]

    def end(self, stack: nn.Module, x: Tensor, state) -> Tensor:
        return stack.attn_res.finish(state[1])
