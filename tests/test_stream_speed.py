"""The fast paths of the stream-carry families (issue 27 item 3) against direct float64 re-implementations:
mHC's exp-then-divide Sinkhorn with its written-out backward, and the thin-operand matrix product of HC, mHC and
frac-connections (values and gradients), and mHC's tokens-last coefficient path (its RMSNorm product with the
hand-written backward, the tokens-last Sinkhorn)."""

import pytest
import torch

from fairseq_plugins.modules.mhc import MAX_EXP_LOGIT, sinkhorn, sinkhorn_tokens_last
from fairseq_plugins.modules.skinny import post_add, rms_project_t, skinny_matmul


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


def rms_project_direct(v, w, eps):
    return (v / torch.sqrt(v.square().mean(-1, keepdim=True) + eps)) @ w


@pytest.mark.parametrize("eps", [1e-20, 1e-3])
def test_rms_project_t_matches_direct_values_and_gradients(eps):
    """mHC's tokens-last RMSNorm product (one autograd node, hand-written backward) against the plain formula
    in float64: values, gradients of v and w, and gradcheck; float32 within rounding."""
    g = torch.Generator().manual_seed(2)
    v = torch.randn(300, 32, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, 6, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(6, 300, generator=g, dtype=torch.float64)
    fast, direct = rms_project_t(v, w, eps), rms_project_direct(v, w, eps).t()
    assert fast.shape == (6, 300)
    torch.testing.assert_close(fast, direct, rtol=1e-12, atol=1e-12)
    want = torch.autograd.grad(direct, (v, w), up)
    for a, b in zip(torch.autograd.grad(fast, (v, w), up), want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch.autograd.gradcheck(lambda a, b: rms_project_t(a, b, eps), (v[:5].detach().requires_grad_(), w))
    v32, w32 = v.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    torch.testing.assert_close(rms_project_t(v32, w32, eps), direct.detach().float(), rtol=1e-5, atol=1e-5)
    grads32 = torch.autograd.grad(rms_project_t(v32, w32, eps), (v32, w32), up.float())
    for a, b in zip(grads32, want):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-5)


def test_rms_project_t_zero_rows_and_only_one_gradient():
    """An all-zero row (scale 1/sqrt(eps)) stays finite, as the plain formula; a frozen w or v is no problem."""
    v = torch.zeros(3, 8, requires_grad=True)
    w = torch.randn(8, 2)
    out = rms_project_t(v, w, 1e-20)
    assert torch.isfinite(out).all()
    (grad_v,) = torch.autograd.grad(out.sum(), v)
    assert torch.isfinite(grad_v).all()
    w.requires_grad_()
    (grad_w,) = torch.autograd.grad(rms_project_t(v.detach() + 1, w, 1e-20).sum(), w)
    torch.testing.assert_close(grad_w, torch.autograd.grad(rms_project_direct(v.detach() + 1, w, 1e-20).sum(), w)[0])


def test_sinkhorn_tokens_last_is_sinkhorn_transposed():
    """The tokens-last Sinkhorn the module runs equals ``sinkhorn`` on token-first matrices (both paths: the
    exp-then-divide one and the log domain), values and gradients."""
    g = torch.Generator().manual_seed(3)
    for scale in (2.0, 40.0):
        x = (torch.randn(50, 4, 4, generator=g, dtype=torch.float64) * scale).requires_grad_()
        up = torch.randn(50, 4, 4, generator=g, dtype=torch.float64)
        tokens_last = sinkhorn_tokens_last(x.permute(1, 2, 0)).permute(2, 0, 1)
        direct = sinkhorn_direct(x)
        torch.testing.assert_close(tokens_last, direct, rtol=1e-10, atol=1e-12)
        if scale < MAX_EXP_LOGIT:
            torch.testing.assert_close(*(torch.autograd.grad(y, x, up)[0] for y in (tokens_last, direct)),
                                       rtol=1e-10, atol=1e-12)  # fmt: skip
    empty = sinkhorn_tokens_last(torch.zeros(4, 4, 0))
    assert empty.shape == (4, 4, 0)


@pytest.mark.parametrize("static", [False, True])
def test_post_add_matches_addcmul(static):
    """The depth connection's mixed + post out (hand-written backward) against addcmul in float64, with a
    per-token post (mHC, dynamic HC) and an expanded static one (static HC); no autograd node without grad."""
    g = torch.Generator().manual_seed(4)
    mixed = torch.randn(30, 4, 16, generator=g, dtype=torch.float64, requires_grad=True)
    post = torch.randn(4, 1, generator=g, dtype=torch.float64) if static else torch.randn(30, 4, 1, generator=g,
                                                                                            dtype=torch.float64)  # fmt: skip
    post.requires_grad_()
    out = torch.randn(30, 1, 16, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(30, 4, 16, generator=g, dtype=torch.float64)
    fast, direct = post_add(mixed, post.expand(30, 4, 1), out), torch.addcmul(mixed, post, out)
    torch.testing.assert_close(fast, direct, rtol=0, atol=0)
    inputs = (mixed, post, out)
    for a, b in zip(torch.autograd.grad(fast, inputs, up), torch.autograd.grad(direct, inputs, up)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.autograd.gradcheck(lambda m, p, o: post_add(m, p.expand(30, 4, 1), o), inputs)
    with torch.no_grad():
        assert post_add(mixed, post.expand(30, 4, 1), out).grad_fn is None
