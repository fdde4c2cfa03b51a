"""The fast paths of the stream-carry families (issue 27 item 3) against direct float64 re-implementations:
mHC's exp-then-divide Sinkhorn with its written-out backward, and the thin-operand matrix product of HC, mHC and
frac-connections (values and gradients)."""

import pytest
import torch

from fairseq_plugins.modules.mhc import MAX_EXP_LOGIT, sinkhorn
from fairseq_plugins.modules.skinny import skinny_matmul


def sinkhorn_direct(logits, iters=20):
    """The paper's SK written out: exp, then iters x (columns, then rows), by plain autograd."""
    m = logits.exp()
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    return m


@pytest.mark.parametrize("scale", [0.5, 2.0, 5.0])
def test_sinkhorn_matches_direct_values_and_gradients(scale):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 4, 4, generator=g, dtype=torch.float64) * scale).clamp(-MAX_EXP_LOGIT, MAX_EXP_LOGIT)
    x.requires_grad_()
    up = torch.randn(64, 4, 4, generator=g, dtype=torch.float64)
    fast, direct = sinkhorn(x), sinkhorn_direct(x)
    torch.testing.assert_close(fast, direct, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(*(torch.autograd.grad(y, x, up)[0] for y in (fast, direct)), rtol=1e-10, atol=1e-12)
    torch.autograd.gradcheck(lambda z: sinkhorn(z, 3), (x[:4].detach().clone().requires_grad_(),))


def test_sinkhorn_large_logits_take_the_log_domain():
    """Logits beyond exp's safe range (here up to 60) give the direct iteration's result in float64, finite in
    float32 where exp-then-divide would divide 0 by 0."""
    x = torch.tensor([[[60.0, -60.0], [-60.0, 0.0]]], dtype=torch.float64)
    torch.testing.assert_close(sinkhorn(x), sinkhorn_direct(x))
    assert torch.isfinite(sinkhorn(x.float() * 2)).all()


@pytest.mark.parametrize("shape", [(300, 16), (5, 7, 16)])
def test_skinny_matmul_matches_matmul(shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, 6, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(*shape[:-1], 6, generator=g, dtype=torch.float64)
    fast, direct = skinny_matmul(x, w), x @ w
    assert fast.shape == direct.shape and fast.is_contiguous()
    torch.testing.assert_close(fast, direct, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(fast, (x, w), up), torch.autograd.grad(direct, (x, w), up)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_skinny_matmul_keeps_autocast_precision():
    x, w = torch.randn(8, 16), torch.randn(16, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert skinny_matmul(x, w).dtype == (x @ w).dtype == torch.bfloat16
