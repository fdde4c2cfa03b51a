"""Orthogonal residual update (Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and
Efficient Deep Networks", arXiv:2505.11881, NeurIPS 2025, section 3; authors' code
BootsofLagrangian/ortho-residual ``connect.py``, read at 24a7c57).

Only the part of a branch output orthogonal to the current stream enters the stream:

    f      = F(sigma(x_n))                                   (the Pre-LN branch, sigma its norm)
    f_par  = (<x_n, f> / (||x_n||^2 + eps)) x_n
    x_{n+1} = x_n + (f - f_par)

eps = 1e-6 (the code's default ``eps``), no parameters. The inner products run over the feature dimension of
each token: the authors' code uses this per-channel ("Orthogonal-F") form for every attention and MLP
branch (``tag`` attn/mlp -> ``orthogonal_method="channel"``, ``dim=-1``); its "global" form flattens
channels and space and is meant for convolutions, so it is not offered.

Departure from the code, on purpose: the code sums <x, f> in the input dtype and upcasts only ||x||^2; we
compute both in float32 (half-precision safety), then cast the scale back like the code does.

Not implemented: x-transformers' ``OrthogonalResidualUpdate`` flattens the whole (T x C) sequence per
example (and computes in float64 without eps): positions then leak into each other, future and padding
positions included, so a causal decoder's incremental decoding would no longer equal full decoding.

Encoder-decoder decisions (ours; the paper has ViTs/ResNets and a LLaMA variant): every sublayer including
cross-attention; the stream x_n is the residual stream before the branch (fairseq's ``residual``). At the
first sublayer x_0 is the scaled embedding plus positions, never zero in practice; a zero x_n (e.g. a zeroed
padding row) gives f_par = 0 and the plain residual update. Per token: incremental decoding needs nothing
cached and beam reordering nothing extra.

Interface: ``OrthogonalResidual(eps)``; ``forward(x, residual) = residual + x - proj_residual(x)`` in
fairseq's ``residual_connection(x, residual)`` argument order (x the dropped-out branch output).
"""

import torch
from torch import Tensor, nn

EPS = 1e-6


class OrthogonalResidual(nn.Module):
    """x_n + (f - f_par) per token over the last dimension."""

    def __init__(self, eps: float = EPS):
        super().__init__()
        if not eps >= 0:
            raise ValueError(f"orthogonal residual eps must be >= 0, got {eps}")
        self.eps = eps

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)  # float32 at least (float64 stays float64)
        r = residual.to(acc)
        dot = (r * x.to(acc)).sum(-1, keepdim=True)
        scale = (dot / (r.square().sum(-1, keepdim=True) + self.eps)).to(x.dtype)
        return residual + (x - scale * residual)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
