"""What DyT (dyt.py) and Derf (derf.py) share: LayerNorm's interface around an element-wise function with learned
scalars, gamma * f(x) + beta over the trailing ``normalized_shape`` dimensions. ``weight`` and ``bias`` keep
LayerNorm's names, so a checkpoint's keys read the same; each scalar is a parameter of its own name."""

import torch
from torch import Tensor, nn


class PointwiseNorm(nn.Module):
    """gamma * ``squash(x)`` + beta; ``scalars`` (name -> initial value, in parameter order) are the learned
    scalars ``squash`` reads, each also kept as ``<name>_init`` for the repr."""

    def __init__(self, normalized_shape, elementwise_affine: bool, bias: bool, device, dtype, **scalars: float):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.scalar_names = tuple(scalars)
        factory = {"device": device, "dtype": dtype}
        for name, init in scalars.items():
            setattr(self, f"{name}_init", init)
            setattr(self, name, nn.Parameter(torch.full((1,), float(init), **factory)))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **factory)) if elementwise_affine and bias else None

    def squash(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        # element-wise maths keeps its input's strides, and fairseq's (time, batch, C) stream is a transposed view:
        # the linear layers after a norm would then take matmul's slower non-contiguous path (a copy, mm and a
        # separate bias add instead of one addmm). LayerNorm returns a contiguous tensor; so does this.
        y = self.squash(x.contiguous())
        if self.weight is not None:
            y = y * self.weight.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y

    def extra_repr(self) -> str:
        inits = "".join(f", {name}_init={getattr(self, f'{name}_init')}" for name in self.scalar_names)
        return f"{self.normalized_shape}{inits}, affine={self.weight is not None}"
