"""Orthogonal residual update (arXiv:2505.11881), per token as the authors' code: the equation in float64,
orthogonality of the update, per-position independence, and a 36-layer stack in half precision."""

import pytest
import torch

from fairseq_plugins.modules.orthogonal_residual import OrthogonalResidual

from .new_ideas_common import (
    DIM,
    HALF,
    assert_finite,
    branch,
    branch_weights,
    random_input,
)


def direct(x, f, eps=1e-6):
    out = torch.empty_like(x)
    for idx in torch.cartesian_prod(*(torch.arange(s) for s in x.shape[:-1])):
        xi, fi = x[tuple(idx)], f[tuple(idx)]
        out[tuple(idx)] = xi + fi - (xi @ fi) / (xi @ xi + eps) * xi
    return out


def test_equation_and_orthogonality():
    x, f = random_input(5, 3, DIM, seed=1), random_input(5, 3, DIM, seed=2)
    out = OrthogonalResidual()(f, x)
    torch.testing.assert_close(out, direct(x, f), rtol=0, atol=1e-12)
    torch.testing.assert_close(((out - x) * x).sum(-1), torch.zeros(5, 3, dtype=torch.float64), rtol=0, atol=1e-5)


def test_per_position_and_zero_stream():
    x, f = random_input(6, 2, DIM, seed=1), random_input(6, 2, DIM, seed=2)
    x[2, 1] = 0.0
    ortho = OrthogonalResidual()
    full = ortho(f, x)
    torch.testing.assert_close(full[2, 1], f[2, 1], rtol=0, atol=0)  # x = 0: the plain residual add
    for t in range(6):  # position t alone gives row t: nothing mixes positions
        torch.testing.assert_close(ortho(f[t : t + 1], x[t : t + 1]), full[t : t + 1], rtol=0, atol=0)


def test_rejects_negative_eps():
    with pytest.raises(ValueError, match="eps"):
        OrthogonalResidual(-1.0)


@pytest.mark.parametrize("dtype", HALF)
def test_deep_stack_half_precision(dtype):
    ortho = OrthogonalResidual()
    weights = branch_weights(72, gain=2.0)
    x = (random_input(6, 2, DIM) * 20).to(dtype).requires_grad_()
    h = x
    for w in weights:
        h = ortho(branch(h, w), h)
    assert h.dtype == dtype
    h.float().square().mean().backward()
    assert_finite(h, x.grad)


def test_projection_in_float32_under_float16():
    """||x||^2 = 8 * 300^2 overflows float16; the float32 projection still removes the parallel part."""
    x = torch.full((1, 1, DIM), 300.0, dtype=torch.float16)
    f = torch.linspace(-1, 1, DIM, dtype=torch.float16).view(1, 1, DIM) + 0.5
    out = OrthogonalResidual()(f, x)
    assert torch.isfinite(out).all()
    assert abs(((out - x).float() * x.float()).sum()) < 1e-2 * 300 * DIM
