"""Derf, Dynamic erf (Chen et al., "Stronger Normalization-Free Transformers", arXiv:2512.10938, the Derf
equation (eq. 10 per third-party notes, not checked); authors' code zlab-princeton/Derf ``DiT/dynamic_erf.py``,
read at 6e1d81c).

An element-wise replacement for every LayerNorm, like DyT with erf and a learned shift inside:

    Derf(x) = gamma * erf(alpha x + s) + beta     alpha, s learned scalars, gamma, beta in R^C

Init (authors' code): alpha = 0.5, s = 0, gamma = 1, beta = 0; alpha and s are one scalar each per norm (the
code's ``torch.ones(1)``). The authors' GPT-2 patch allows separate alpha_0 for attention/FFN/final norms; its
README does not give the values used, so 0.5 everywhere is the default here.

Interface, encoder-decoder decisions and half precision: as ``dyt.DynamicTanh`` (LayerNorm's constructor
and call; replace every LayerNorm including cross-attention's and the stack-final ones; stateless and
per-position; erf is bounded by 1 in float16 too).
"""

import torch
from torch import Tensor, nn

ALPHA_INIT = 0.5
SHIFT_INIT = 0.0


class DynamicErf(nn.Module):
    """gamma * erf(alpha x + s) + beta over the trailing ``normalized_shape`` dimensions."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
        export: bool = False,
        alpha_init: float = ALPHA_INIT,
        shift_init: float = SHIFT_INIT,
    ):
        super().__init__()
        del eps, export  # LayerNorm's signature; Derf divides by nothing and has no fused kernel to export
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.alpha_init, self.shift_init = alpha_init, shift_init
        factory = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init), **factory))
        self.shift = nn.Parameter(torch.full((1,), float(shift_init), **factory))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **factory)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.erf(self.alpha.to(x.dtype) * x + self.shift.to(x.dtype))
        if self.weight is not None:
            y = y * self.weight.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, alpha_init={self.alpha_init}, shift_init={self.shift_init}, "
            f"affine={self.weight is not None}"
        )
