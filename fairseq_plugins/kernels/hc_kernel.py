"""Dynamic hyper-connections' coefficient kernels (kernels/hc_coef.c, in the mHC library ``mhc_cpu``, loaded and
switched by kernels/mhc_kernel.py: ``FAIRSEQ_PLUGINS_MHC_KERNEL=0`` turns them off too).

modules/hyper_connections.py computes its dynamic coefficients, row o n + j = static + scale tanh(LN(H_j) .
w[o]) of stream j, laid out as mHC's (n (n + 2), tokens), with ``hc_coefficients`` (and, in training, its
backward ``hc_coefficients_backward``) for float32 CPU streams and a LayerNorm site norm; with its PyTorch code
otherwise. The mixing and depth connection then run in mHC's kernels.
"""

import torch
from torch import Tensor

from . import mhc_kernel
from .arguments import dense, first, ok, tensor

HC_BUFFERS = ("x", "norm weight", "norm bias", "dynamic weight", "static", "scale", "out", "z")
HC_BACKWARD_BUFFERS = ("x", "norm weight", "norm bias", "dynamic weight", "scale", "z", "grad", "grad x",
                       "grad norm weight", "grad norm bias", "grad dynamic weight", "grad static", "grad scale")


def check_hc_coefficients(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, static: Tensor | None,
                          scale: Tensor, n: int) -> str | None:  # fmt: skip
    """Why ``hc_coefficients`` cannot take these inputs, or None: streams x (tokens, n, C), the LayerNorm's weight
    and bias (C), the dynamic weight w (n + 2, C), static and scale (n (n + 2)), float32 strided CPU tensors,
    1 <= n <= MAX_N, 1 to MAX_TOKENS tokens, 1 <= C <= MAX_WIDTH (static None: not checked, for the backward)."""
    if mhc_kernel._streams_fit(x, n) and ok(weight) and ok(bias) and ok(w) and ok(scale) and (static is None or ok(static)):
        width, k = x.shape[2], n * (n + 2)
        if (weight.shape == (width,) and bias.shape == (width,) and w.shape == (n + 2, width) and scale.shape == (k,)
                and (static is None or static.shape == (k,))):  # fmt: skip
            return None  # the common case in the fewest tests (decoding checks these in every unit)
    reason = mhc_kernel.check_mix(x, None, n)
    if reason is not None:
        return reason
    width, k, what = x.size(2), n * (n + 2), f" for C = {x.size(2)} and n = {n}"
    return first(tensor("weight", weight, (width,), what), tensor("bias", bias, (width,), what),
                 tensor("w", w, (n + 2, width), what), None if static is None else tensor("static", static, (k,), what),
                 tensor("scale", scale, (k,), what))  # fmt: skip


def check_hc_coefficients_backward(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, scale: Tensor, z: Tensor,
                                   grad: Tensor, n: int) -> str | None:  # fmt: skip
    """Why ``hc_coefficients_backward`` cannot take these inputs, or None: those of ``check_hc_coefficients``
    (but static), and z and grad (n (n + 2), tokens), float32 strided CPU tensors."""
    reason = check_hc_coefficients(x, weight, bias, w, None, scale, n)  # the backward takes no static
    if reason is not None:
        return reason
    shape, what = (n * (n + 2), x.size(0)), f" as the coefficients of {x.size(0)} tokens, n = {n}"
    return first(tensor("z", z, shape, what), tensor("grad", grad, shape, what))


def usable_hc_coefficients(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, static: Tensor, scale: Tensor,
                           n: int) -> bool:  # fmt: skip
    """Whether the kernel is on, can be had, and ``hc_coefficients`` takes these inputs."""
    return mhc_kernel._enabled and check_hc_coefficients(x, weight, bias, w, static, scale, n) is None and mhc_kernel._available()


def hc_coefficients(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, static: Tensor, scale: Tensor, n: int,
                    eps: float, keep_z: bool = False, checked: bool = False) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """Dynamic hyper-connections' coefficients (n (n + 2), tokens), row o n + j = static + scale tanh(LN(x_j) .
    w[o]) for stream j (kernels/hc_coef.c); with ``keep_z`` also z, the tanh values (for
    ``hc_coefficients_backward``); ``checked``: the caller has just run ``check_hc_coefficients`` on them."""
    reason = None if checked else check_hc_coefficients(x, weight, bias, w, static, scale, n)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    buffers = [dense(t.detach()) for t in (x, weight, bias, w, static, scale)]
    out = x.new_empty(n * (n + 2), x.size(0))
    z = torch.empty_like(out) if keep_z else out  # decoding: z written first, then out over it
    mhc_kernel._call(mhc_kernel._library_or_raise().hc_coefficients, n, 0, [*buffers, out, z], HC_BUFFERS,
          dims=(n, x.size(0), x.size(2)), extra=(eps,))  # fmt: skip
    return (out, z) if keep_z else out


def hc_coefficients_backward(x: Tensor, weight: Tensor, bias: Tensor, w: Tensor, scale: Tensor, z: Tensor,
                             grad: Tensor, n: int, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The gradients (x, weight, bias, w, static, scale) of ``hc_coefficients`` for grad (n (n + 2), tokens) of
    its result, from the inputs and z."""
    reason = check_hc_coefficients_backward(x, weight, bias, w, scale, z, grad, n)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    buffers = [dense(t.detach()) for t in (x, weight, bias, w, scale, z)]
    grad = dense(grad)
    grads = [torch.empty_like(t) for t in (*buffers[:5], buffers[4])]  # contiguous, as the C code writes them
    mhc_kernel._call(mhc_kernel._library_or_raise().hc_coefficients_backward, n, 0, [*buffers, grad, *grads], HC_BACKWARD_BUFFERS,
          dims=(n, x.size(0), x.size(2)), extra=(eps,))  # fmt: skip
    return tuple(grads)
