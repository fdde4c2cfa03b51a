"""Shared pieces of the tests of the 2024-26 ideas (tests/test_new_*.py): a tiny random Pre-LN branch F and
a deep stack driver, so each test checks its module alone on a 36-layer stack in half precision."""

import torch
import torch.nn.functional as F

DIM = 8
HALF = [torch.float16, torch.bfloat16]


def branch_weights(layers: int, dim: int = DIM, seed: int = 0, gain: float = 1.0) -> list[torch.Tensor]:
    """One (dim, dim) weight per branch, N(0, gain^2 / dim), float64."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(dim, dim, generator=g, dtype=torch.float64) * gain / dim**0.5 for _ in range(layers)]


def branch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F(x) = gelu(LN(x) W): a stand-in for a Pre-LN attention or FFN branch (per position)."""
    return F.gelu(F.layer_norm(x, x.shape[-1:]) @ weight.to(x.dtype))


def random_input(*shape, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def assert_finite(*tensors):
    for t in tensors:
        assert torch.isfinite(t).all(), "non-finite values"


def randomize_(module, seed: int = 0, scale: float = 0.5):
    """Move every parameter off its initial value (N(0, scale^2) added), so a check does not pass by an
    identity at init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
