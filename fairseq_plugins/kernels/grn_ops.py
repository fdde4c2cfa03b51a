"""The GRN kernels as PyTorch custom operators: ``torch.ops.fairseq_plugins.grn_forward`` and ``grn_backward``.

Called through ctypes from Python, the kernels are invisible to torch: torch.jit.trace recorded the
uninitialised outputs as constants, torch.compile broke the graph at each call. As operators with fake
implementations (shapes only) and a registered autograd formula they are recorded, compiled (fullgraph=True),
recomputed by activation checkpointing and seen by DDP's hooks like any aten operator.

Double backward (``create_graph=True`` through a GRN) is not supported by either implementation; both raise
NO_DOUBLE_BACKWARD when the second backward reaches the GRN (``once_differentiable``), instead of silently
dropping the GRN's second-order term.
"""

import functools

import torch
from torch import Tensor

from . import grn_kernel
from .arguments import tensor

NO_DOUBLE_BACKWARD = (
    "the GRN (fairseq_plugins/modules/grn.py) has no second derivative: a double backward (create_graph=True, "
    "e.g. a gradient penalty) cannot go through it"
)


def _empty(t: Tensor | None, like: Tensor) -> Tensor:
    return like.new_empty(0) if t is None else t


def _none(t: Tensor, present: bool) -> Tensor | None:
    return t if present else None


def _forward_kernel(b: Tensor, w: Tensor | None, norm_weight: Tensor | None, norm_bias: Tensor | None, norm_eps: float,
                with_norm: bool, chunks: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(first, h, mean, rstd, rho, dot) of grn_kernel.forward with the statistics saved; first, mean and rstd
    are empty without the LayerNorm (h is then x), rho and dot without w."""
    first, h, stats = grn_kernel.forward(chunks, b, w, norm_weight, norm_bias, norm_eps, with_norm, save=True)
    if not with_norm:
        first, h = None, first
    return _empty(first, b), h, *(_empty(t, b) for t in stats)


grn_forward = torch.library.custom_op("fairseq_plugins::grn_forward", mutates_args=(), device_types="cpu")(
    _forward_kernel
)


@grn_forward.register_fake
def _(b, w, norm_weight, norm_bias, norm_eps, with_norm, chunks):
    reason = grn_kernel.check(chunks, b, w, norm_weight, norm_bias, with_norm)
    if reason is not None:
        raise ValueError(f"the GRN kernels cannot take {reason}")
    shape, outputs, entries = chunks[0].shape[1:], b.size(0), sum(c.size(0) for c in chunks)
    tokens, new = shape[:-1].numel(), chunks[0].new_empty
    norm = (outputs, tokens) if with_norm else (0,)
    gate = w is not None
    return (new(shape if with_norm else (0,)), new(outputs, *shape), new(norm), new(norm),
            new((entries, tokens) if gate else (0,)), new((outputs, entries, tokens) if gate else (0,)))  # fmt: skip


def _backward_kernel(b: Tensor, w: Tensor | None, norm_weight: Tensor | None, with_norm: bool, grad: Tensor,
                 grad_first: Tensor | None, mean: Tensor, rstd: Tensor, rho: Tensor, dot: Tensor,
                 norm_weight_grad: bool, norm_bias_grad: bool, chunks: list[Tensor],
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor]]:  # fmt: skip
    """(grad_b, grad_w, grad_norm_weight, grad_norm_bias, grads of the chunks) of grn_kernel.backward; the
    gradients that do not exist are empty."""
    stats = _statistics(w, with_norm, mean, rstd, rho, dot)
    *params, grad_chunks = grn_kernel.backward(chunks, b, w, norm_weight, with_norm, grad, grad_first, stats,
                                               (norm_weight_grad, norm_bias_grad))  # fmt: skip
    return *(_empty(t, b) for t in params), grad_chunks


def _statistics(w: Tensor | None, with_norm: bool, *stats: Tensor) -> list[Tensor | None]:
    """mean, rstd, rho and dot as grn_kernel.backward takes them, None where forward saved none; there the
    operator takes only the empty tensor _forward_kernel returns (float32, shape (0,)). Raises ValueError."""
    present = (with_norm, with_norm, w is not None, w is not None)
    for name, t, there in zip(("mean", "rstd", "rho", "dot"), stats, present, strict=True):
        reason = None if there else tensor(name, t, (0,), " with_norm False" if name in ("mean", "rstd") else
                                           " without w")  # fmt: skip
        if reason is not None:
            raise ValueError(f"the GRN kernels cannot take {reason}")
    return [t if there else None for t, there in zip(stats, present, strict=True)]


grn_backward = torch.library.custom_op("fairseq_plugins::grn_backward", mutates_args=(), device_types="cpu")(
    _backward_kernel
)


@grn_backward.register_fake
def _(b, w, norm_weight, with_norm, grad, grad_first, mean, rstd, rho, dot, norm_weight_grad, norm_bias_grad,
      chunks):  # fmt: skip
    stats = _statistics(w, with_norm, mean, rstd, rho, dot)  # the checks of the real one: nothing else raises
    reason = grn_kernel.check_backward(chunks, b, w, norm_weight, with_norm, grad, grad_first, stats)
    if reason is not None:
        raise ValueError(f"the GRN kernels cannot take {reason}")
    dim = chunks[0].size(-1)
    ln_grad = (dim,) if with_norm else (0,)
    return (torch.empty_like(b), b.new_empty(w.shape if w is not None else (0,)),
            b.new_empty(ln_grad if norm_weight_grad else (0,)), b.new_empty(ln_grad if norm_bias_grad else (0,)),
            [torch.empty_like(c, memory_format=torch.contiguous_format) for c in chunks])  # fmt: skip


class _Undifferentiable(torch.autograd.Function):
    """Copies of its tensors whose gradient raises ``message``; the first ``anchors`` tensors tie them into the
    graph (they are not copied)."""

    @staticmethod
    def forward(ctx, message, anchors, *tensors):
        ctx.message = message
        return tuple(t.clone() for t in tensors[anchors:])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(ctx.message)


def once_differentiable(backward, message: str = NO_DOUBLE_BACKWARD):
    """Run ``backward(ctx, *grads)`` without autograd; under create_graph=True its results (tensors, or lists of
    tensors) come out tied to the incoming gradients and the saved tensors through a node that raises ``message``
    if a second backward reaches it (torch's own once_differentiable takes no lists, and its message names no
    module). A Function whose saved tensors do not include its differentiable inputs saves them for this. Also
    used by the mHC kernel (mhc_ops.py) with its own message."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            results = backward(ctx, *grads)
        if not torch.is_grad_enabled():  # create_graph=False: nothing can differentiate the results
            return results
        single = not isinstance(results, tuple)  # one input's gradient, returned bare
        results = (results,) if single else results
        # the results depend on the incoming gradients and on the saved tensors (the inputs among them): tied to
        # every one that carries a graph, so that a second backward reaches the error whichever tensors it asks
        # about (torch.autograd.grad(penalty, params) runs only the nodes leading to params); to a leaf of their
        # own where none does (a loss that is a plain sum), rather than left as constants
        anchors = [g for g in grads if isinstance(g, Tensor) and g.requires_grad]
        anchors += [t for t in ctx.saved_tensors if isinstance(t, Tensor) and t.requires_grad]
        anchors = anchors or [torch.zeros((), requires_grad=True)]
        flat = [t for r in results for t in (r if isinstance(r, list | tuple) else [r]) if isinstance(t, Tensor)]
        tied = iter(_Undifferentiable.apply(message, len(anchors), *anchors, *flat))

        def swap(r):
            if isinstance(r, list | tuple):
                return type(r)(swap(t) for t in r)
            return next(tied) if isinstance(r, Tensor) else r

        out = tuple(swap(r) for r in results)
        return out[0] if single else out

    return wrapper


def _setup_context(ctx, inputs, output):
    b, w, norm_weight, norm_bias, _, with_norm, chunks = inputs
    _, _, mean, rstd, rho, dot = output
    ctx.with_norm, ctx.n_chunks = with_norm, len(chunks)
    ctx.norm_grads = (norm_weight is not None and norm_weight.requires_grad,
                      norm_bias is not None and norm_bias.requires_grad)  # fmt: skip
    ctx.save_for_backward(b, w, norm_weight, mean, rstd, rho, dot, *chunks)


@once_differentiable
def _backward(ctx, grad_first, grad_h, *_):
    b, w, norm_weight, mean, rstd, rho, dot, *chunks = ctx.saved_tensors
    if grad_h is None:  # only x[0] was used
        grad_h = torch.zeros(b.size(0), *chunks[0].shape[1:], dtype=chunks[0].dtype, device=chunks[0].device)
    kernel = _backward_kernel if getattr(ctx, "eager", False) else grn_backward  # the operator for tracing
    grad_b, grad_w, grad_ln_w, grad_ln_b, grad_chunks = kernel(
        b, w, norm_weight, ctx.with_norm, grad_h, grad_first if ctx.with_norm else None, mean, rstd, rho, dot,
        *ctx.norm_grads, chunks,
    )  # fmt: skip
    return (grad_b, _none(grad_w, w is not None), _none(grad_ln_w, ctx.norm_grads[0]),
            _none(grad_ln_b, ctx.norm_grads[1]), None, None, list(grad_chunks))  # fmt: skip


grn_forward.register_autograd(_backward, setup_context=_setup_context)


class KernelFunction(torch.autograd.Function):
    """The operators' forward and backward in eager autograd, without the operator dispatch (about 0.2 ms a
    training call, more than the kernels save on small batches); tracing and compilation use the operators."""

    @staticmethod
    def forward(ctx, b, w, norm_weight, norm_bias, norm_eps, with_norm, *chunks):
        inputs = (b, w, norm_weight, norm_bias, norm_eps, with_norm, list(chunks))
        outputs = _forward_kernel(*inputs)
        _setup_context(ctx, inputs, outputs)
        ctx.eager = True
        ctx.set_materialize_grads(False)  # an unused x[0] (the output GRN's) gets no tensor of zeros
        return outputs[0], outputs[1]

    @staticmethod
    def backward(ctx, grad_first, grad_h):
        *params, chunk_grads = _backward(ctx, grad_first, grad_h)
        return *params, *chunk_grads
