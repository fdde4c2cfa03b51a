"""The mHC gate kernel as PyTorch custom operators, ``torch.ops.fairseq_plugins.mhc_gates`` and
``mhc_gates_backward``, and ``gates``, the entry point modules/mhc.py calls.

As for the GRN (kernels/grn_ops.py): under tracing or compilation the kernel runs as the operators (with fake
implementations and a registered autograd formula, so torch.jit.trace records them and torch.compile compiles
them without graph breaks); in eager autograd as an autograd Function with the same forward and backward
(without the operator dispatch, about 0.2 ms a training call); without autograd (decoding) it is called
directly. The operators are total: logits the kernel sends to the log domain get the PyTorch code's result
(forward) and its autograd gradient (backward), so callers need not know.

Double backward through a kernel raises NO_DOUBLE_BACKWARD (the gates) or NO_DOUBLE_BACKWARD_STREAMS (the
hand-written backwards have no derivative).
"""

import functools

import torch
from torch import Tensor

from . import hc_kernel, mhc_kernel
from .grn_ops import once_differentiable
from .sinkhorn import gates_pytorch

NO_DOUBLE_BACKWARD = (
    "the mHC gate kernel (fairseq_plugins/kernels/mhc_cpu.c) has no second derivative: a double backward "
    "(create_graph=True, e.g. a gradient penalty) cannot go through it (nor through the PyTorch code, "
    "modules/mhc.py, whose Sinkhorn backward has none either)"
)
# the mixing, the depth connection and dynamic HC's coefficients have PyTorch code that is twice differentiable
NO_DOUBLE_BACKWARD_STREAMS = (
    "the multi-stream kernels (mixing, depth connection, dynamic hyper-connections' coefficients; "
    "fairseq_plugins/kernels/mhc_cpu.c) have no second derivative: a double backward (create_graph=True, e.g. a "
    "gradient penalty) cannot go through them; FAIRSEQ_PLUGINS_MHC_KERNEL=0 runs the PyTorch code, which has one "
    "for hyper-connections (mHC's Sinkhorn gates have none either way)"
)


def _refuse(reason: str | None) -> None:
    """A fake implementation's refusal: the real one's error, for the same check (the meta tensors of a mixed
    call like the tensors of torch.compile reach the fake implementation, not the kernel)."""
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")


def _pytorch(logits: Tensor, n: int, iters: int) -> Tensor:
    return gates_pytorch(logits, n, iters)


def _forward_kernel(logits: Tensor, n: int, iters: int) -> Tensor:
    out = mhc_kernel.forward(logits, n, iters)
    if out is None:  # the log domain
        with torch.no_grad():
            out = _pytorch(logits, n, iters)
    return out


def _log_domain_backward(logits: Tensor, grad: Tensor, n: int, iters: int) -> Tensor:
    """The gradient of _pytorch's log-domain path written out (an operator's implementation runs below
    autograd, so it cannot differentiate the PyTorch code): sigmoid' = y (1 - y), and for each normalisation
    l' = l - logsumexp(l) along an axis, dl = dl' - softmax(l) sum(dl') along it, in reverse."""
    pre_post = torch.sigmoid(logits[: 2 * n])
    grad_pre_post = torch.cat([grad[:n], 2.0 * grad[n : 2 * n]]) * pre_post * (1.0 - pre_post)
    steps = [logits[2 * n :].reshape(n, n, -1)]
    for k in range(2 * iters - 1):
        steps.append(steps[-1] - torch.logsumexp(steps[-1], dim=k % 2, keepdim=True))
    last = steps[-1] - torch.logsumexp(steps[-1], dim=1, keepdim=True)
    g = grad[2 * n :].reshape(n, n, -1) * last.exp()
    for k in range(2 * iters - 1, -1, -1):
        g = g - torch.softmax(steps[k], dim=k % 2) * g.sum(k % 2, keepdim=True)
    return torch.cat([grad_pre_post, g.flatten(0, 1)])


def _backward_kernel(logits: Tensor, grad: Tensor, n: int, iters: int) -> Tensor:
    grad_logits = mhc_kernel.backward(logits, grad, n, iters)
    if grad_logits is None:  # the log domain
        grad_logits = _log_domain_backward(logits, grad.to(logits.dtype), n, iters)
    return grad_logits


mhc_gates = torch.library.custom_op("fairseq_plugins::mhc_gates", mutates_args=(), device_types="cpu")(
    _forward_kernel
)


@mhc_gates.register_fake
def _(logits, n, iters):
    _refuse(mhc_kernel.check(logits, n, iters))
    return torch.empty_like(logits)


mhc_gates_backward = torch.library.custom_op("fairseq_plugins::mhc_gates_backward", mutates_args=(),
                                             device_types="cpu")(_backward_kernel)  # fmt: skip


@mhc_gates_backward.register_fake
def _(logits, grad, n, iters):
    _refuse(mhc_kernel.check_backward(logits, grad, n, iters))
    return torch.empty_like(logits)


def _setup_context(ctx, inputs, output):
    logits, n, iters = inputs
    ctx.n, ctx.iters = n, iters
    ctx.save_for_backward(logits)  # the only thing saved: backward recomputes the Sinkhorn iterates


@functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD)
def _backward(ctx, grad):
    (logits,) = ctx.saved_tensors
    kernel = _backward_kernel if getattr(ctx, "eager", False) else mhc_gates_backward  # the operator for tracing
    return kernel(logits, grad, ctx.n, ctx.iters), None, None


mhc_gates.register_autograd(_backward, setup_context=_setup_context)


class KernelFunction(torch.autograd.Function):
    """The operators' forward and backward in eager autograd, without the operator dispatch."""

    @staticmethod
    def forward(ctx, logits, n, iters):
        out = _forward_kernel(logits, n, iters)
        _setup_context(ctx, (logits, n, iters), out)
        ctx.eager = True
        return out

    @staticmethod
    def backward(ctx, grad):
        return _backward(ctx, grad)


def gates(logits: Tensor, n: int, iters: int) -> Tensor:
    """[sigmoid(logits[:n]); 2 sigmoid(logits[n:2n]); Sinkhorn(exp(logits[2n:]))] (2n + n^2, tokens) by the
    kernel, for logits that ``mhc_kernel.usable`` accepts."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return mhc_gates(logits, n, iters)
    if torch.is_grad_enabled() and logits.requires_grad:
        return KernelFunction.apply(logits, n, iters)
    return _forward_kernel(logits, n, iters)


# the mixing u = H_pre x, mixed = H_res x (kernels/mhc_mix.c), the same way
mhc_mix = torch.library.custom_op("fairseq_plugins::mhc_mix", mutates_args=(), device_types="cpu")(
    mhc_kernel.mix_forward
)


@mhc_mix.register_fake
def _(x, coef, n):
    _refuse(mhc_kernel.check_mix(x, coef, n))
    return x.new_empty(x.size(0), x.size(2)), torch.empty_like(x)


mhc_mix_backward = torch.library.custom_op("fairseq_plugins::mhc_mix_backward", mutates_args=(),
                                           device_types="cpu")(mhc_kernel.mix_backward)  # fmt: skip


@mhc_mix_backward.register_fake
def _(x, coef, grad_u, grad_mixed, n):
    _refuse(mhc_kernel.check_mix_backward(x, coef, grad_u, grad_mixed, n))
    return torch.empty_like(x), torch.empty_like(coef)


def _mix_setup_context(ctx, inputs, output):
    x, coef, n = inputs
    ctx.n = n
    ctx.save_for_backward(x, coef)


@functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD_STREAMS)
def _mix_backward(ctx, grad_u, grad_mixed):
    x, coef = ctx.saved_tensors
    if grad_u is None:
        grad_u = x.new_zeros(x.size(0), x.size(2))
    if grad_mixed is None:
        grad_mixed = torch.zeros_like(x)
    kernel = mhc_kernel.mix_backward if getattr(ctx, "eager", False) else mhc_mix_backward
    grad_x, grad_coef = kernel(x, coef, grad_u, grad_mixed, ctx.n)
    return grad_x, grad_coef, None


mhc_mix.register_autograd(_mix_backward, setup_context=_mix_setup_context)


class MixFunction(torch.autograd.Function):
    """mhc_mix's forward and backward in eager autograd, without the operator dispatch."""

    @staticmethod
    def forward(ctx, x, coef, n):
        out = mhc_kernel.mix_forward(x, coef, n)
        _mix_setup_context(ctx, (x, coef, n), out)
        ctx.eager = True
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, grad_u, grad_mixed):
        return _mix_backward(ctx, grad_u, grad_mixed)


def mix(x: Tensor, coef: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(H_pre x (tokens, C), H_res x (tokens, n, C)) by the kernel, for streams that ``usable_mix`` accepts
    and float32 coefficients [H_pre; H_post; H_res] (2n + n^2, tokens)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return mhc_mix(x, coef, n)
    if torch.is_grad_enabled() and (x.requires_grad or coef.requires_grad):
        return MixFunction.apply(x, coef, n)
    return mhc_kernel.mix_forward(x, coef, n)


# the depth connection new = mixed + H_post^T out (kernels/mhc_post.c), the same way
mhc_post = torch.library.custom_op("fairseq_plugins::mhc_post", mutates_args=(), device_types="cpu")(
    mhc_kernel.post_forward
)


@mhc_post.register_fake
def _(mixed, post, out, n):
    _refuse(mhc_kernel.check_post(mixed, post, out, n))
    return torch.empty_like(mixed)


mhc_post_backward = torch.library.custom_op("fairseq_plugins::mhc_post_backward", mutates_args=(),
                                            device_types="cpu")(mhc_kernel.post_backward)  # fmt: skip


@mhc_post_backward.register_fake
def _(grad, post, out, n):
    _refuse(mhc_kernel.check_post(grad, post, out, n, "grad"))
    return torch.empty_like(post), torch.empty_like(out)


def _post_setup_context(ctx, inputs, output):
    ctx.n = inputs[3]
    ctx.save_for_backward(*inputs[1:3])  # post, out: mixed is not needed


@functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD_STREAMS)
def _post_backward(ctx, grad):
    post, out = ctx.saved_tensors
    kernel = mhc_kernel.post_backward if getattr(ctx, "eager", False) else mhc_post_backward
    grad_post, grad_out = kernel(grad, post, out, ctx.n)
    return grad, grad_post, grad_out, None


mhc_post.register_autograd(_post_backward, setup_context=_post_setup_context)


class PostFunction(torch.autograd.Function):
    """mhc_post's forward and backward in eager autograd, without the operator dispatch."""

    @staticmethod
    def forward(ctx, mixed, post, out, n):
        new = mhc_kernel.post_forward(mixed, post, out, n)
        _post_setup_context(ctx, (mixed, post, out, n), new)
        ctx.eager = True
        return new

    @staticmethod
    def backward(ctx, grad):
        return _post_backward(ctx, grad)


def post_add(mixed: Tensor, post: Tensor, out: Tensor, n: int) -> Tensor:
    """mixed + H_post^T out (tokens, n, C) by the kernel, for inputs that ``usable_post`` accepts: mixed (tokens,
    n, C), post (n, tokens), out (tokens, C)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return mhc_post(mixed, post, out, n)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (mixed, post, out)):
        return PostFunction.apply(mixed, post, out, n)
    return mhc_kernel.post_forward(mixed, post, out, n)


# dynamic hyper-connections' coefficients (kernels/hc_coef.c) in training, the same way
def _hc_coef_forward(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, static: Tensor, scale: Tensor, n: int,
                     eps: float) -> tuple[Tensor, Tensor]:  # fmt: skip
    return hc_kernel.hc_coefficients(x, weight, bias, w, static, scale, n, eps, keep_z=True)


hc_coef = torch.library.custom_op("fairseq_plugins::hc_coef", mutates_args=(), device_types="cpu")(_hc_coef_forward)


@hc_coef.register_fake
def _(x, weight, bias, w, static, scale, n, eps):
    _refuse(hc_kernel.check_hc_coefficients(x, weight, bias, w, static, scale, n))
    out = x.new_empty(n * (n + 2), x.size(0))
    return out, torch.empty_like(out)


hc_coef_backward = torch.library.custom_op("fairseq_plugins::hc_coef_backward", mutates_args=(),
                                           device_types="cpu")(hc_kernel.hc_coefficients_backward)  # fmt: skip


@hc_coef_backward.register_fake
def _(x, weight, bias, w, scale, z, grad, n, eps):
    _refuse(hc_kernel.check_hc_coefficients_backward(x, weight, bias, w, scale, z, grad, n))
    return (torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias), torch.empty_like(w),
            torch.empty_like(scale), torch.empty_like(scale))  # fmt: skip


def _hc_setup_context(ctx, inputs, output):
    x, weight, bias, w, _static, scale, n, eps = inputs
    ctx.n, ctx.eps = n, eps
    ctx.save_for_backward(x, weight, bias, w, scale, output[1])


@functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD_STREAMS)
def _hc_backward(ctx, grad, grad_z):
    x, weight, bias, w, scale, z = ctx.saved_tensors
    kernel = hc_kernel.hc_coefficients_backward if getattr(ctx, "eager", False) else hc_coef_backward
    return (*kernel(x, weight, bias, w, scale, z, grad, ctx.n, ctx.eps), None, None)


hc_coef.register_autograd(_hc_backward, setup_context=_hc_setup_context)


class HCCoefFunction(torch.autograd.Function):
    """hc_coef's forward and backward in eager autograd, without the operator dispatch."""

    @staticmethod
    def forward(ctx, x, weight, bias, w, static, scale, n, eps):
        out = hc_kernel.hc_coefficients(x, weight, bias, w, static, scale, n, eps, keep_z=True)
        _hc_setup_context(ctx, (x, weight, bias, w, static, scale, n, eps), out)
        ctx.eager = True
        ctx.mark_non_differentiable(out[1])
        return out

    @staticmethod
    def backward(ctx, grad, grad_z):
        return _hc_backward(ctx, grad, grad_z)


def hc_coefficients(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, static: Tensor, scale: Tensor, n: int,
                    eps: float) -> Tensor:  # fmt: skip
    """Dynamic hyper-connections' coefficients (n (n + 2), tokens) by the kernel, differentiable in every input
    (x (tokens, n, C), the LayerNorm's weight and bias (C), w (n + 2, C), static and scale (n (n + 2)))."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return hc_coef(x, weight, bias, w, static, scale, n, eps)[0]
    if torch.is_grad_enabled():
        return HCCoefFunction.apply(x, weight, bias, w, static, scale, n, eps)[0]
    return hc_kernel.hc_coefficients(x, weight, bias, w, static, scale, n, eps)
