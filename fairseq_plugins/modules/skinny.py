"""``skinny_matmul(x, w)``: x @ w for a tall x (rows, d) and a thin w (d, k), k a few coefficients per row (the
gate and mixing coefficients of hyper-connections, mHC and frac-connections).

On the CPU, oneDNN/MKL run x @ w and its weight gradient x^T @ grad slowly when k is this small (measured at
rows 4000, d 256, k 6, one thread: 1.26 ms forward and 2.35 ms weight gradient), while the same products with
the thin operand first, (w^T x^T)^T and (grad^T x)^T, take 0.38 and 0.29 ms. The values are the same products
(float32 rounding aside). Under autocast the plain product is kept, so that its precision is autocast's.
"""

import torch
from torch import Tensor


class _SkinnyMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return (w.t() @ x.t()).t().contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w = ctx.saved_tensors
        grad_x = grad @ w.t() if ctx.needs_input_grad[0] else None
        grad_w = (grad.t() @ x).t() if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def skinny_matmul(x: Tensor, w: Tensor) -> Tensor:
    """x (..., d) @ w (d, k)."""
    if torch.is_autocast_enabled(x.device.type) or x.dtype != w.dtype:
        return x @ w
    return _SkinnyMatmul.apply(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])
