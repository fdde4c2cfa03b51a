"""``skinny_matmul(x, w)``: x @ w for a tall x (rows, d) and a thin w (d, k), k a few coefficients per row (the
gate and mixing coefficients of hyper-connections, mHC and frac-connections).

On the CPU, oneDNN/MKL run x @ w and its weight gradient x^T @ grad slowly when k is this small (measured at
rows 4000, d 256, k 6, one thread: 1.26 ms forward and 2.35 ms weight gradient), while the same products with
the thin operand first, (w^T x^T)^T and (grad^T x)^T, take 0.38 and 0.29 ms. The values are the same products
(float32 rounding aside). Under autocast the plain product is kept, so that its precision is autocast's.

``rms_project_t(v, w, eps)``: (RMSNorm(v) w)^T = ((v w) * rsqrt(mean(v^2) + eps))^T, mHC's coefficient product,
token-last (k, rows): the thin product's natural layout (no transposing copy), in which the coefficient maths
that follows runs over contiguous rows of tokens (vectorised; token-first, the n x n reductions ran over 4
contiguous floats). One autograd node: its backward returns the input gradient of the product and of the RMS
scale in one ``addmm`` (autograd's pow, mean, expand and sum took four passes over the nC-wide rows).
"""

import functools

import torch
from torch import Tensor

from ..kernels.grn_ops import once_differentiable

NO_DOUBLE_BACKWARD = (
    "the RMS-scaled coefficient product (fairseq_plugins/modules/skinny.py, rms_project_t) has no second "
    "derivative: a double backward (create_graph=True, e.g. a gradient penalty) cannot go through it"
)


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


class _RMSProjectT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: Tensor, w: Tensor, eps: float) -> Tensor:
        # one pass over v for the mean square (square().mean() writes and re-reads a v-sized temporary)
        scale = torch.rsqrt(torch.linalg.vector_norm(v, dim=-1).square() / v.shape[-1] + eps)  # (rows,)
        raw = w.t() @ v.t()  # (k, rows), contiguous
        ctx.save_for_backward(v, w, raw, scale)
        return raw * scale

    @staticmethod
    # its formula treats the saved forward intermediates (raw, scale) as constants: a second derivative would
    # miss their terms
    @functools.partial(once_differentiable, message=NO_DOUBLE_BACKWARD)
    def backward(ctx, grad: Tensor):
        v, w, raw, scale = ctx.saved_tensors
        g = grad * scale  # d/d raw
        grad_v = grad_w = None
        if ctx.needs_input_grad[0]:
            # d scale / d v = -scale^3 v / N, times sum_k grad raw: a per-row multiple of v, added by addmm
            coef = (grad * raw).sum(0) * scale.pow(3) / -v.shape[-1]
            grad_v = (v * coef.unsqueeze(-1)).addmm_(g.t(), w.t())  # in place: addmm would copy its input
        if ctx.needs_input_grad[1]:
            grad_w = (g @ v).t()
        return grad_v, grad_w, None


def rms_project_t(v: Tensor, w: Tensor, eps: float) -> Tensor:
    """(RMSNorm(v) @ w)^T for v (rows, d), w (d, k): (k, rows), RMSNorm without gain (fold it into w)."""
    if torch.is_autocast_enabled(v.device.type) or v.dtype != w.dtype or v.dim() != 2:
        return ((v @ w) * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)).t()
    return _RMSProjectT.apply(v, w, eps)


class _PostAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mixed: Tensor, post: Tensor, out: Tensor) -> Tensor:
        ctx.save_for_backward(post, out)
        return torch.addcmul(mixed, post, out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        post, out = ctx.saved_tensors
        grad = grad.contiguous()
        # two small products per token: what baddbmm's backward runs; addcmul's backward would multiply and
        # reduce over n x C twice (a temporary the size of the streams each time)
        grad_post = torch.bmm(grad, out.transpose(1, 2)) if ctx.needs_input_grad[1] else None
        grad_out = torch.bmm(post.transpose(1, 2).contiguous(), grad) if ctx.needs_input_grad[2] else None
        return grad, grad_post, grad_out


def post_add(mixed: Tensor, post: Tensor, out: Tensor) -> Tensor:
    """mixed + post out for mixed (tokens, n, d), post (tokens, n, 1) and the branch output out (tokens, 1, d):
    the depth connection of hyper-connections and mHC (H_post^T F(...) + H_res x). The forward's addcmul is half
    the time of the equivalent baddbmm (measured at 1000 tokens, n = 4, d = 256: 0.14 and 0.31 ms); the backward
    keeps baddbmm's two bmm. Without autograd (decoding), autocast and mixed dtypes: the plain addcmul."""
    # decoding: no autograd node (its overhead is most of a small call)
    if not torch.is_grad_enabled() or torch.is_autocast_enabled(mixed.device.type) or not mixed.dtype == post.dtype == out.dtype:
        return torch.addcmul(mixed, post, out)
    # an expanded post (static coefficients) made contiguous: bmm's backward runs a per-token loop over
    # zero-stride batches (measured 100x slower)
    return _PostAdd.apply(mixed, post.contiguous(), out)

