"""mHC's gates in PyTorch (Xie et al., arXiv:2512.24880, eq. 8-9): H_pre = sigmoid, H_post = 2 sigmoid and H_res =
Sinkhorn(exp(.)) of the logits, the reference the C kernel (mhc_kernel.py, mhc_cpu.c) is tested against and the
code it falls back to (the log domain, and every device but the CPU). Here, below modules/mhc.py, because both
the module and the kernel's operators (mhc_ops.py) call it: imports run modules -> kernels.
"""

import functools

import torch
from torch import Tensor

from . import grn_ops

SINKHORN_ITERS = 20

NO_DOUBLE_BACKWARD = (
    "mHC's Sinkhorn normalisation (fairseq_plugins/kernels/sinkhorn.py) has no second derivative: a double "
    "backward (create_graph=True, e.g. a gradient penalty) cannot go through it"
)


def sinkhorn_tokens_last(logits: Tensor, iters: int = SINKHORN_ITERS) -> Tensor:
    """SK(logits) for logits (n, n, tokens): matrix entry (i, j) of token t at [i, j, t].

    Tokens last, every operator runs over contiguous rows of tokens (vectorised); tokens first, each column
    or row sum and division ran over 4 floats at a time (measured 5.4 -> 1.4 ms forward and backward at 1000
    tokens, n = 4). Always in the log domain, exact for logits of any size, so that nothing reads the logits to
    choose a path (choosing exp-then-divide for small logits read ``logits.abs().amax()`` on the host: a device
    sync per unit, 28 graph breaks of torch.compile per tiny training step, and no CUDA graphs); the same
    iterates as the paper's exp-then-divide up to rounding. One log_softmax per normalisation (and the exp kept
    for backward): as many operators as exp-then-divide's sum and division, so no more GPU launches; on the CPU
    each costs an exp per entry (1000 tokens: 1.5x forward and backward, 3-4x forward alone), where the C
    kernel runs."""
    return _LogNormalisations.apply(logits, iters)


def gates_pytorch(logits: Tensor, n: int, iters: int = SINKHORN_ITERS) -> Tensor:
    """[H_pre; H_post; H_res] (2n + n^2, tokens) of the logits (2n + n^2, tokens) in PyTorch: what the mHC
    kernel (kernels/mhc_cpu.c) computes, and what it falls back to in the log domain."""
    pre_post = torch.sigmoid(logits[: 2 * n])
    res = sinkhorn_tokens_last(logits[2 * n :].view(n, n, -1), iters)
    return torch.cat([pre_post[:n], 2.0 * pre_post[n:], res.flatten(0, 1)])


class _LogNormalisations(torch.autograd.Function):
    """``iters`` x (T_c, then T_r) in the log domain, l <- l - logsumexp(l) along columns, then rows, of logits
    (n, n, tokens); returns exp(l). Backward written out: for l' = l - logsumexp(l) along an axis,
    dl = dl' - y sum(dl') along it with y = softmax(l) = exp(l'), the iterate itself: 3 operators per
    normalisation and no autograd node per operator."""

    @staticmethod
    def forward(ctx, logits: Tensor, iters: int) -> Tensor:
        log_m, saved = logits, [logits]  # the input only ties a double backward's error to it (once_differentiable)
        grad = ctx.needs_input_grad[0]  # without it (decoding) nothing is saved: one operator per normalisation
        for _ in range(iters):
            for dim in (0, 1):  # T_c: every column sums to 1 (over rows i), then T_r: every row sums to 1
                log_m = torch.log_softmax(log_m, dim)  # l - logsumexp(l) in one operator
                if grad:
                    saved.append(log_m.exp())
        ctx.save_for_backward(*saved)
        return saved[-1] if grad else log_m.exp()

    @staticmethod
    # its formula treats the saved iterates as constants: a second derivative would miss their terms
    @functools.partial(grn_ops.once_differentiable, message=NO_DOUBLE_BACKWARD)
    def backward(ctx, grad: Tensor):
        saved = ctx.saved_tensors[1:]
        grad = grad.contiguous() * saved[-1]  # arrives as a transposed view: strided operators are 3-4x slower
        for k in range(len(saved) - 1, -1, -1):
            grad = grad - saved[k] * grad.sum(k % 2, keepdim=True)
        return grad, None
