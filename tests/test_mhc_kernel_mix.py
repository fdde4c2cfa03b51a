"""The fused mHC mixing kernel (kernels/mhc_mix.c: u = H_pre x and H_res x per token, and backward) against
float64 maths and the PyTorch code: results and gradients within float32 rounding, the operator's backward by
gradcheck, malformed inputs refused in Python, the C entry points' own checks, NaN propagation, tracing."""

import os
import shutil
import warnings
from array import array

import pytest
import torch

from fairseq_plugins.kernels import mhc_kernel, mhc_ops

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def kernel_loaded():
    assert mhc_kernel.loaded() is not None, mhc_kernel.failure


def inputs(tokens, n, width, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n, width, generator=g, dtype=torch.float64).to(dtype)
    coef = torch.rand(2 * n + n * n, tokens, generator=g, dtype=torch.float64).to(dtype)
    return x, coef


def mix_reference(x, coef, n):
    """The formulas: u_t = sum_j pre[j, t] x[t, j], mixed[t, i] = sum_j res[i, j, t] x[t, j]."""
    pre, res = coef[:n], coef[2 * n :].view(n, n, -1)
    u = torch.einsum("jt,tjc->tc", pre, x)
    mixed = torch.einsum("ijt,tjc->tic", res, x)
    return u, mixed


@pytest.mark.parametrize(("tokens", "n", "width"), [(1, 4, 256), (7, 4, 16), (33, 4, 13), (5, 1, 8), (9, 3, 1),
                                                    (4, 8, 40), (300, 4, 64)])  # fmt: skip
def test_mixing_and_gradients_equal_float64_maths(tokens, n, width):
    x, coef = inputs(tokens, n, width, seed=tokens + n)
    x.requires_grad_()
    coef.requires_grad_()
    u, mixed = mhc_ops.mix(x, coef, n)
    x64, coef64 = x.detach().double().requires_grad_(), coef.detach().double().requires_grad_()
    u64, mixed64 = mix_reference(x64, coef64, n)
    torch.testing.assert_close(u.double(), u64.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed.double(), mixed64.detach(), rtol=1e-5, atol=1e-5)
    gu, gm = torch.randn_like(u), torch.randn_like(mixed)
    got = torch.autograd.grad((u, mixed), (x, coef), (gu, gm))
    want = torch.autograd.grad((u64, mixed64), (x64, coef64), (gu.double(), gm.double()))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
    assert not got[1][n : 2 * n].any()  # H_post is not read: its rows get no gradient


def test_one_gradient_missing():
    x, coef = inputs(6, 4, 16)
    x.requires_grad_()
    u, _ = mhc_ops.mix(x, coef, 4)  # mixed unused: its gradient arrives as None
    (got,) = torch.autograd.grad(u.sum(), x)
    (want,) = torch.autograd.grad(mix_reference(x, coef, 4)[0].sum(), x)
    torch.testing.assert_close(got, want)


def test_gradcheck_of_the_operator_backward():
    x, coef = inputs(3, 2, 5)
    x.requires_grad_()
    coef.requires_grad_()
    warnings.filterwarnings("ignore", "Input #. requires gradient and is not a double")
    torch.autograd.gradcheck(lambda a, b: mhc_ops.mhc_mix(a, b, 2), (x, coef), eps=1e-2, atol=2e-3, rtol=2e-2)


def test_the_operator_and_the_function_agree():
    x, coef = inputs(10, 4, 24)
    x.requires_grad_()
    a = mhc_ops.mhc_mix(x, coef, 4)
    b = mhc_ops.MixFunction.apply(x, coef, 4)
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_nan_propagates():
    x, coef = inputs(4, 4, 8)
    x[1, 2, 3] = float("nan")
    coef[2 * 4 + 5, 2] = float("inf")
    u, mixed = mhc_ops.mix(x, coef, 4)
    want_u, want_mixed = mix_reference(x, coef, 4)
    torch.testing.assert_close(u, want_u, equal_nan=True)
    torch.testing.assert_close(mixed, want_mixed, equal_nan=True)


@pytest.mark.parametrize("case", ["float64", "float16", "2-d streams", "n mismatch", "n = 9", "no tokens",
                                  "no width", "coef tokens", "coef rows", "coef float64"])  # fmt: skip
def test_malformed_inputs_are_refused_in_python(case):
    n, (x, coef) = 4, inputs(5, 4, 8)
    if case in ("float64", "float16"):
        x = x.to(getattr(torch, case))
    elif case == "2-d streams":
        x = x.flatten(1)
    elif case == "n mismatch":
        n = 3
    elif case == "n = 9":
        x, coef = inputs(5, 9, 8)
        n = 9
    elif case == "no tokens":
        x, coef = x[:0], coef[:, :0]
    elif case == "no width":
        x = x[..., :0]
    elif case == "coef tokens":
        coef = coef[:, :-1]
    elif case == "coef rows":
        coef = coef[:-1]
    else:
        coef = coef.double()
    assert mhc_kernel.check_mix(x, coef, n) is not None
    with pytest.raises(ValueError, match="the mHC kernel cannot take"):
        mhc_kernel.mix_forward(x, coef, n)


def test_non_contiguous_streams_are_copied():
    x, coef = inputs(6, 4, 16)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    for a, b in zip(mhc_ops.mix(xt, coef, 4), mix_reference(x, coef, 4), strict=True):
        torch.testing.assert_close(a, b)


def test_the_c_entry_points_check_their_arguments():
    lib = mhc_kernel.loaded()
    x, coef = inputs(5, 4, 8)
    u, mixed = torch.empty(5, 8), torch.empty_like(x)

    def call(dims, tensors, sizes=None, count=None, fn=lib.mhc_mix_forward):
        d = array("q", dims)
        p = array("q", [t.data_ptr() if t is not None else 0 for t in tensors])
        s = array("q", sizes if sizes is not None else [t.numel() if t is not None else 0 for t in tensors])
        return fn(d.buffer_info()[0], p.buffer_info()[0], s.buffer_info()[0], len(tensors) if count is None else count)

    assert call([4, 5, 8, 1], [x, coef, u, mixed]) == 0
    for k in range(4):
        dims = [4, 5, 8, 1]
        dims[k] = 0
        assert call(dims, [x, coef, u, mixed]) == 10 + k
    assert call([4, 5, 1 << 25, 1], [x, coef, u, mixed]) == 12
    assert call([4, 6, 8, 1], [x, coef, u, mixed]) == 100
    assert call([4, 5, 8, 1], [x, coef, u, None]) == 103
    assert call([4, 5, 8, 1], [x, coef, u, mixed], sizes=[x.numel(), coef.numel(), u.numel() - 1, mixed.numel()]) == 102
    assert call([4, 5, 8, 1], [x, coef, u, mixed], count=5) == 104
    gx, gc = torch.empty_like(x), torch.empty_like(coef)
    assert call([4, 5, 8, 1], [x, coef, u, mixed, gx, gc], fn=lib.mhc_mix_backward) == 0
    assert call([4, 5, 8, 1], [x, coef, u, mixed, gx, coef[:-1]], fn=lib.mhc_mix_backward) == 105


def test_traces_as_an_operator():
    x, coef = inputs(4, 4, 8)
    traced = torch.jit.trace(lambda a, b: mhc_ops.mix(a, b, 4), (x, coef))
    assert "fairseq_plugins::mhc_mix" in str(traced.graph)
