"""Generalized residual networks (GRN-v1/v2/v3): learned mixtures of the stack of earlier layer outputs.

Heddes et al., "DeepCrossAttention: Supercharging Transformer Residual Connections" (ICML 2025,
arXiv:2502.06785), section 3.1. A residual network feeds layer t the plain sum of the stack
G_t = [f_{t-1}, ..., f_1, f_0 = x] (d x t, one column per entry): g_t(x) = G_t 1. The GRNs replace the ones:

    GRN-v1  g_t(x) = G_t b_t                          b_t in R^t        one scalar per entry
    GRN-v2  g_t(x) = (G_t ⊙ b_t) 1                     b_t in R^{d x t}  one weight per entry and dimension
    GRN-v3  g_t(x) = (G_t ⊙ (b_t + w̄_t)) 1,            w̄_t = 1 σ(w_tᵀ Ĝ_t), w_t in R^d, σ = ReLU

b starts at ones and w at zeros, so every GRN starts as the plain sum G_t 1: a GRN transformer is its residual
(Pre-LN) transformer at initialisation. Stacks are per token: all shapes below carry ``*`` = (seq_len, batch).

Interpretations (the paper is silent on these):
- Ĝ_t: each entry is RMS-normalised (no gain) before the dot product with w_t, ĝ = g / sqrt(mean(g²) + 1e-6).
  Without it σ(wᵀg) grows with the entry's scale and σ(wᵀg) g is quadratic in the stack, while fairseq scales
  embeddings by sqrt(d) and the k-DCA middle sum grows with depth; the quadratic term also overflows half
  precision. Normalised, a GRN stays homogeneous of degree 1 in the stack, like the sum it generalises. The
  normalisation sits inside σ(wᵀ·), so w = 0 still gives the plain sum.
- σ'(0) = 1. With w = 0 every wᵀĝ is exactly 0, and ReLU's usual derivative there (0) would give w a zero
  gradient forever: GRN-v3 would silently train as GRN-v2. 1 is a valid subgradient of ReLU at 0 (it is
  what ``clamp(min=0)`` uses) and lets w leave 0; the forward value is unchanged.
- Several outputs: DCA's three instances (queries, keys, values) read the same stack, so one module holds
  ``num_outputs`` independent parameter sets and computes all outputs in one pass over the stack.

The stack arrives as a list of chunks (tensors of shape (entries, *, d) whose entries are concatenated in
order), so that a preallocated stack buffer and the k-DCA middle sum are read without copying them together.

Two implementations of the same function: for float32 on the CPU, fused C kernels (kernels/grn_cpu.c) that
walk the tokens once, forward and backward; everywhere else (other dtypes, CUDA, no C compiler,
FAIRSEQ_PLUGINS_GRN_KERNEL=0) the PyTorch code below. tests/test_grn_kernel.py holds them to each other.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels import grn_kernel, grn_ops

RMS_EPS = 1e-6
# the no-grad path (decoding) mixes the whole stack in one broadcast product while it stays under this many
# elements (4 MiB in fp32); larger stacks accumulate entry by entry like the training path
_VECTORISED_ELEMENTS = 1 << 20


def _gate(g: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For entries g (entries, tokens, d): ρ = 1/rms(g), dot = wᵀg (outputs, entries, tokens), r = σ(ρ dot).

    ρ is computed in (at least) float32: in half precision the mean square of an entry of rms > 256 overflows.
    """
    acc = torch.promote_types(g.dtype, torch.float32)
    rho = torch.linalg.vector_norm(g, dim=-1, dtype=acc).square_().mul_(1.0 / g.size(-1)).add_(RMS_EPS).rsqrt_()
    dot = (w @ g.flatten(0, 1).t()).view(w.size(0), *g.shape[:2])  # faster than (g @ wᵀ)ᵀ for few outputs
    return rho, dot, (dot.to(acc) * rho).clamp_(min=0).to(g.dtype)


def _entry_weights(b: Tensor, gates: list | None, c: int, i: int, j: int, out: Tensor | None = None) -> Tensor:
    """b[:, j] + r[:, j] for entry i of chunk c (stack entry j): (outputs, tokens, d), or b's broadcast view."""
    if gates is None:
        return b[:, j, None, :]
    return torch.add(b[:, j, None, :], gates[c][2][:, i, :, None], out=out)


def _mix(flat: list[Tensor], b: Tensor, gates: list | None, work: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """sum_j g_j ⊙ (b[:, j] + r[:, j]) accumulated in place, entry by entry: (outputs, tokens, d).

    b + r is materialised once per entry, in one reused buffer (``work``, returned for reuse): one pass over
    the output instead of two.
    """
    out, j = None, 0
    for c, chunk in enumerate(flat):
        for i, g in enumerate(chunk):
            weight = _entry_weights(b, gates, c, i, j, out=work)
            if gates is not None:
                work = weight
            if out is None:
                out = torch.mul(g, weight)
            else:
                out.addcmul_(g, weight)
            j += 1
    return out, work


def _mix_backward(grad: Tensor, flat: list[Tensor], b: Tensor, w: Tensor | None, gates: list | None, work=None):
    """Gradients of _mix (and of the gates, through ρ and σ) for the output gradient grad (outputs, tokens, d).
    ``work``: a free buffer of grad's shape, if there is one (large allocations are slow)."""
    dim = grad.size(-1)
    grad_b = torch.empty_like(b)
    grad_flat = [torch.empty_like(g) for g in flat]
    grad_rs = [torch.empty_like(gate[2]) for gate in gates] if gates is not None else None
    work, j = torch.empty_like(grad) if work is None else work, 0
    for c, chunk in enumerate(flat):
        for i, g in enumerate(chunk):
            prod = torch.mul(grad, g, out=work)  # grad ⊙ g_j, summed over tokens (b) and over d (r)
            if b.size(-1) == 1:  # GRN-v1: one weight for all dimensions
                grad_b[:, j, 0] = prod.sum((1, 2))
            else:
                grad_b[:, j] = prod.sum(1)
            if grad_rs is not None:
                grad_rs[c][:, i] = prod.sum(2)
            # grad_g = sum_o grad[o] ⊙ (b[o, j] + r[o, j])
            weight = _entry_weights(b, gates, c, i, j, out=work)
            grad_g = torch.mul(grad[0], weight[0], out=grad_flat[c][i])
            for o in range(1, grad.size(0)):
                grad_g.addcmul_(grad[o], weight[o])
            j += 1
    grad_w = None
    if w is not None:
        grad_w = torch.zeros_like(w)
        for g, (rho, dot, _), grad_r, grad_g in zip(flat, gates, grad_rs, grad_flat, strict=True):
            # σ'(0) = 1, see the module docstring; sign(ρ dot) = sign(dot). Scalars per token in ρ's dtype.
            grad_s = grad_r.to(rho.dtype) * (dot >= 0)
            grad_dot = (grad_s * rho).flatten(1).to(g.dtype)  # (outputs, entries * tokens)
            grad_w.addmm_(grad_dot, g.flatten(0, 1))
            grad_g.flatten(0, 1).addmm_(grad_dot.t(), w)
            # through ρ = (mean(g²) + eps)^-1/2: dρ/dg = -ρ³ g / d
            kappa = ((grad_s * dot.to(rho.dtype)).sum(0) * rho.pow(3) * (-1.0 / dim))[..., None]
            if g.dtype == kappa.dtype:
                grad_g.addcmul_(g, kappa)
            else:  # ρ³ of a small entry is far beyond half precision; the product is not
                grad_g += (g.to(kappa.dtype) * kappa).to(g.dtype)
    return grad_b, grad_w, grad_flat


class _GRNFunction(torch.autograd.Function):
    """x = sum_j G[j] ⊙ (b[:, j] + r[:, j]) (r = 0 for GRN-v1/v2), optionally followed by a LayerNorm h = LN(x).

    A hand-written backward. Autograd through the broadcast products would save and reduce
    outputs x entries full-size tensors per layer; this saves only the stack (views of the stack buffer, no
    copy) and per-token scalars. With a LayerNorm it returns (x[0], h) and saves neither x nor h: x is
    recomputed in backward (one more mixing pass), which keeps DCA's three GRN outputs out of memory.

    Both directions accumulate entry by entry with in-place ops into a few reused buffers. On the CPUs this
    was measured on, that beat one einsum or broadcast product over the whole stack (which allocates
    outputs x entries full-size temporaries, and large fresh allocations are slow) and batched matmuls over
    tokens (tiny per-token matrices); the work grows with the entries read, i.e. stays flat for k-DCA.
    """

    @staticmethod
    def forward(ctx, b, w, norm_weight, norm_bias, norm_eps, with_norm, *chunks):
        ctx.shape, ctx.n_chunks, ctx.with_norm = chunks[0].shape[1:], len(chunks), with_norm
        dim = chunks[0].size(-1)
        flat = [c.reshape(c.size(0), -1, dim) for c in chunks]  # (entries, tokens, d) views
        gates = [_gate(g, w) for g in flat] if w is not None else None
        x, _ = _mix(flat, b, gates)
        stats = [t for gate in gates for t in gate] if gates is not None else []
        # the chunks as given, not their views made here: those carry no autograd history, and once_differentiable
        # ties a double backward's error to the saved inputs
        if not with_norm:
            ctx.save_for_backward(b, w, None, None, None, None, *chunks, *stats)
            return x.view(x.shape[0], *ctx.shape)  # not -1: ambiguous for an empty batch
        h, mean, rstd = torch.native_layer_norm(x, (dim,), norm_weight, norm_bias, norm_eps)
        ctx.save_for_backward(b, w, norm_weight, norm_bias, mean, rstd, *chunks, *stats)
        return x[0].view(ctx.shape), h.view(h.shape[0], *ctx.shape)

    @staticmethod
    @grn_ops.once_differentiable  # no double backward, as in the kernels' operator (one error for both)
    def backward(ctx, *grads):
        b, w, norm_weight, norm_bias, mean, rstd, *rest = ctx.saved_tensors
        chunks, stats = rest[: ctx.n_chunks], rest[ctx.n_chunks :]
        dim = chunks[0].size(-1)
        flat = [c.reshape(c.size(0), -1, dim) for c in chunks]  # the forward's (entries, tokens, d) views
        gates = [stats[3 * c : 3 * c + 3] for c in range(ctx.n_chunks)] if w is not None else None
        grad_norm_weight = grad_norm_bias = None
        if ctx.with_norm:
            grad_first, grad_h = grads
            x, work = _mix(flat, b, gates)  # recomputed, not saved
            grad_x, grad_norm_weight, grad_norm_bias = torch.ops.aten.native_layer_norm_backward(
                grad_h.reshape(x.shape), x, (dim,), mean, rstd, norm_weight, norm_bias,
                [True, norm_weight is not None, norm_bias is not None],
            )  # fmt: skip
            grad_x[0] += grad_first.reshape(x.shape[1:])
            work = x if work is None else work  # x is done with: its memory is the next workspace
        else:
            grad_x, work = grads[0].reshape(grads[0].size(0), flat[0].size(1), dim), None
        grad_b, grad_w, grad_flat = _mix_backward(grad_x, list(flat), b, w, gates, work)
        chunk_grads = [g.view(g.shape[0], *ctx.shape) for g in grad_flat]
        return grad_b, grad_w, grad_norm_weight, grad_norm_bias, None, None, *chunk_grads


def _grn_no_grad(chunks: list[Tensor], b: Tensor, w: Tensor | None, norm: nn.Module | None):
    """The same function without autograd in PyTorch (decoding): few large ops on the concatenated stack when
    small."""
    stack = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    dim, shape = stack.size(-1), stack.shape[1:]
    flat = stack.reshape(stack.size(0), -1, dim)
    gates = [_gate(flat, w)] if w is not None else None
    if b.size(0) * flat.numel() <= _VECTORISED_ELEMENTS:
        if gates is None:
            x = (b[:, :, None, :] * flat).sum(1)
        else:
            x = (b[:, :, None, :] + gates[0][2][..., None]).mul_(flat).sum(1)
    else:
        x, _ = _mix([flat], b, gates)
    if norm is None:
        return x.view(x.shape[0], *shape)  # not -1: ambiguous for an empty batch
    return x[0].view(shape), F.layer_norm(x, (dim,), norm.weight, norm.bias, norm.eps).view(x.shape[0], *shape)


def _grn_kernel(chunks: list[Tensor], b: Tensor, w: Tensor | None, weight: Tensor | None, bias: Tensor | None,
                eps: float, with_norm: bool, out: tuple[Tensor, Tensor] | None):  # fmt: skip
    """The fused kernels: the custom operator where tracing or compilation must see them, the same forward and
    backward as an autograd Function in eager autograd, else (decoding) called directly, writing into ``out``
    if it fits."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        first, h, *_ = torch.ops.fairseq_plugins.grn_forward(b, w, weight, bias, eps, with_norm, list(chunks))
    elif torch.is_grad_enabled():
        first, h = grn_ops.KernelFunction.apply(b, w, weight, bias, eps, with_norm, *chunks)
    else:
        first, h, _ = grn_kernel.forward(chunks, b, w, weight, bias, eps, with_norm, save=False, out=out, checked=True)
    return (first, h) if with_norm else (h if h is not None else first)


NOT_SCRIPTABLE = (
    "DeepCrossAttention (--depth-aggregation dca, its GRN modules) cannot be compiled with torch.jit.script: its GRNs and "
    "depth stack run hand-written torch.autograd.Function subclasses (TorchScript cannot compile them), its "
    "layers take the stack as a variable number of chunks (*chunks) and its layer loop carries a Python "
    "DepthStack object. Use the eager model (fairseq-generate, fairseq-interactive and the hub interface all do)."
)


class GRN(nn.Module):
    """``num_outputs`` learned mixtures of a stack of ``num_entries`` entries of width ``embed_dim``.

    Subclasses set ``b`` of shape (outputs, entries, d) or (outputs, entries, 1) and ``w`` (outputs, d) or None.
    """

    version = ""
    b: nn.Parameter
    w: nn.Parameter | None

    def __init__(self, embed_dim: int, num_entries: int, num_outputs: int = 1):
        super().__init__()
        self.embed_dim, self.num_entries, self.num_outputs = embed_dim, num_entries, num_outputs
        self.register_parameter("w", None)  # GRN-v3's input-dependent weights

    def forward(self, chunks: list[Tensor], norm: nn.Module | None = None, out: tuple[Tensor, Tensor] | None = None):
        """Mix the stack, given as chunks of shape (entries_i, *, d) with sum(entries_i) = num_entries.

        Args:
            out: without autograd and with ``norm``, tensors (x[0], norm(x)) of the result's shapes that the
                kernel may write the result into (DepthStack.grn_out); the result is returned either way.
        Returns:
            (num_outputs, *, d); with ``norm`` (a LayerNorm over d) the pair (x[0], norm(x)) instead, where
            x is not kept for backward but recomputed.
        """
        entries = sum(c.size(0) for c in chunks)
        if entries != self.num_entries:
            raise ValueError(f"{type(self).__name__} expects a stack of {self.num_entries} entries, got {entries}")
        weight, bias, eps = (norm.weight, norm.bias, norm.eps) if norm is not None else (None, None, 0.0)
        if grn_kernel.usable(chunks, self.b, self.w, weight, bias, norm is not None):
            return _grn_kernel(chunks, self.b, self.w, weight, bias, eps, norm is not None, out)
        if not torch.is_grad_enabled():
            return _grn_no_grad(chunks, self.b, self.w, norm)
        return _GRNFunction.apply(self.b, self.w, weight, bias, eps, norm is not None, *chunks)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every submodule before compiling: a clear refusal instead of
        # TorchScript's "Unknown type annotation: GRN" (and the same for a scripted SequenceGenerator)
        raise RuntimeError(NOT_SCRIPTABLE)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_entries={self.num_entries}, num_outputs={self.num_outputs}"


class GRNv1(GRN):
    """GRN-v1 (DenseFormer's weights): g(x) = G b, b in R^{entries} per output, initialised to ones."""

    version = "grn-v1"

    def __init__(self, embed_dim: int, num_entries: int, num_outputs: int = 1):
        super().__init__(embed_dim, num_entries, num_outputs)
        self.b = nn.Parameter(torch.ones(num_outputs, num_entries, 1))


class GRNv2(GRN):
    """GRN-v2: g(x) = (G ⊙ b) 1, b in R^{d x entries} per output, initialised to ones."""

    version = "grn-v2"

    def __init__(self, embed_dim: int, num_entries: int, num_outputs: int = 1):
        super().__init__(embed_dim, num_entries, num_outputs)
        self.b = nn.Parameter(torch.ones(num_outputs, num_entries, embed_dim))


class GRNv3(GRNv2):
    """GRN-v3: g(x) = (G ⊙ (b + 1 σ(wᵀĜ))) 1, b in R^{d x entries} (ones), w in R^d (zeros) per output."""

    version = "grn-v3"

    def __init__(self, embed_dim: int, num_entries: int, num_outputs: int = 1):
        super().__init__(embed_dim, num_entries, num_outputs)
        self.w = nn.Parameter(torch.zeros(num_outputs, embed_dim))



# version name -> class (the --dca-mode names of the GRN ablation; modules/depth_stack.py adds "dca")
GRN_CLASSES: dict[str, type[GRN]] = {cls.version: cls for cls in (GRNv1, GRNv2, GRNv3)}


def count_grn_parameters(module: nn.Module) -> int:
    """Number of GRN parameters inside ``module`` (a model, an encoder, ...), shared ones counted once."""
    seen: set[int] = set()
    total = 0
    for sub in module.modules():
        if isinstance(sub, GRN):
            for p in sub.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
    return total
