"""The fused mHC gate kernel (kernels/mhc_cpu.c) against the PyTorch code and float64 maths: forward and
gradients within float32 rounding, the custom operator's backward by gradcheck, the log domain, malformed inputs
(validated in Python, falling back or raising a clear error, never reaching C), the C entry points' own checks,
and the fallbacks (switch off, float64, no compiler). The mixing kernel: tests/test_mhc_kernel_mix.py."""

import ctypes
import os
import shutil
import warnings
from array import array

import pytest
import torch

from fairseq_plugins.kernels import mhc_kernel, mhc_ops
from fairseq_plugins.modules.mhc import (
    ManifoldHyperConnection,
    expand_streams,
    gates_pytorch,
)

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


def logits_for(n, tokens, scale=3.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2 * n + n * n, tokens, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.fixture(autouse=True)
def kernel_loaded():
    assert mhc_kernel.loaded() is not None, mhc_kernel.failure


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("tokens", [1, 7, 8, 9, 100])
@pytest.mark.parametrize("iters", [1, 20])
def test_forward_and_gradient_equal_float64_maths(n, tokens, iters):
    x = logits_for(n, tokens, seed=n * 1000 + tokens).requires_grad_()
    got = mhc_ops.gates(x, n, iters)
    ref64 = x.detach().double().requires_grad_()
    want = gates_pytorch(ref64, n, iters)
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(got)
    (got_grad,) = torch.autograd.grad(got, x, grad)
    (want_grad,) = torch.autograd.grad(want, ref64, grad.double())
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-4, atol=1e-5)


def test_equal_to_the_pytorch_float32_code():
    x = logits_for(4, 1000).requires_grad_()
    got = mhc_ops.gates(x, 4, 20)
    want = gates_pytorch(x, 4, 20)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    grad = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, x, grad)[0], torch.autograd.grad(want, x, grad)[0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_gradcheck_of_the_operator_backward():
    """The hand-written backward is the derivative of the kernel's forward: finite differences of the float32
    kernel (the kernel is float32-only) at a loose tolerance, and exact agreement with float64 autograd above."""
    x = logits_for(4, 5, scale=1.0).requires_grad_()
    warnings.filterwarnings("ignore", "Input #0 requires gradient and is not a double")
    torch.autograd.gradcheck(lambda t: mhc_ops.mhc_gates(t, 4, 3), (x,), eps=1e-2, atol=5e-3, rtol=5e-2)


def test_float64_gradcheck_of_the_fallbacks():
    """float64 takes the PyTorch code (gradcheck there), and the operator's log-domain backward formula
    (_log_domain_backward) equals float64 autograd of the PyTorch code."""
    x = logits_for(4, 3, scale=1.0, dtype=torch.float64).requires_grad_()
    assert not mhc_kernel.usable(x, 4, 3)
    torch.autograd.gradcheck(lambda t: gates_pytorch(t, 4, 3), (x,))
    big = logits_for(4, 6, scale=8.0, dtype=torch.float64)
    big[10, 2] = 30.0
    big.requires_grad_()
    grad = torch.randn_like(big)
    (want,) = torch.autograd.grad(gates_pytorch(big, 4, 20), big, grad)
    got = mhc_ops._log_domain_backward(big.detach(), grad, 4, 20)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_operator_and_the_function_agree():
    x = logits_for(4, 33).requires_grad_()
    a = mhc_ops.mhc_gates(x, 4, 20)
    b = mhc_ops.KernelFunction.apply(x, 4, 20)
    grad = torch.randn_like(a)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(a, x, grad)[0], torch.autograd.grad(b, x, grad)[0], rtol=0,
                               atol=0)  # fmt: skip


@pytest.mark.parametrize("via", ["function", "operator"])
def test_large_logits_take_the_log_domain(via):
    x = logits_for(4, 20, scale=1.0)
    x[2 * 4 + 1, 3] = 40.0  # |logit| > 15: exp-then-divide would lose the small entries
    x.requires_grad_()
    fn = mhc_ops.gates if via == "function" else mhc_ops.mhc_gates
    assert mhc_kernel.forward(x.detach(), 4, 20) is None
    got = fn(x, 4, 20)
    want = gates_pytorch(x, 4, 20)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    grad = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, x, grad)[0], torch.autograd.grad(want, x, grad)[0])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_as_in_the_pytorch_code(value):
    x = logits_for(4, 16)
    x[0, 2] = value  # a gate logit
    x[9, 5] = value  # a residual logit
    torch.testing.assert_close(mhc_ops.gates(x, 4, 20), gates_pytorch(x, 4, 20), equal_nan=True)


@pytest.mark.parametrize("case", ["float64", "float16", "wrong rows", "1-d", "3-d", "no tokens", "n = 0",
                                  "n = 9", "huge n", "iters = 0", "huge iters", "non-int n"])  # fmt: skip
def test_malformed_inputs_are_refused_in_python(case):
    n, iters, x = 4, 20, logits_for(4, 10)
    if case in ("float64", "float16"):
        x = x.to(getattr(torch, case))
    elif case == "wrong rows":
        x = x[:-1]
    elif case == "1-d":
        x = x.flatten()
    elif case == "3-d":
        x = x.unsqueeze(0)
    elif case == "no tokens":
        x = x[:, :0]
    elif case.startswith("n = "):
        n = int(case[4:])
    elif case == "huge n":
        n = 1 << 40
    elif case == "iters = 0":
        iters = 0
    elif case == "huge iters":
        iters = 1 << 31
    else:
        n = 4.0
    assert mhc_kernel.check(x, n, iters) is not None
    assert not mhc_kernel.usable(x, n, iters)
    with pytest.raises(ValueError, match="the mHC kernel cannot take"):
        mhc_kernel.forward(x, n, iters)


def test_non_contiguous_logits_are_copied():
    x = logits_for(4, 12).t().contiguous().t()  # a transposed view
    assert not x.is_contiguous()
    torch.testing.assert_close(mhc_ops.gates(x, 4, 20), gates_pytorch(x, 4, 20), rtol=2e-6, atol=2e-6)


def test_the_c_entry_points_check_their_arguments():
    """Dimensions and buffer sizes the Python side never sends come back as error codes, not memory errors."""
    lib = mhc_kernel.loaded()
    x = logits_for(4, 10)
    out = torch.empty_like(x)

    def call(dims, tensors, sizes=None, count=None):
        d = array("q", dims)
        p = array("q", [t.data_ptr() if t is not None else 0 for t in tensors])
        s = array("q", sizes if sizes is not None else [t.numel() if t is not None else 0 for t in tensors])
        return lib.mhc_forward(d.buffer_info()[0], p.buffer_info()[0], s.buffer_info()[0],
                               len(tensors) if count is None else count)  # fmt: skip

    assert call([4, 10, 20, 1], [x, out]) == 0
    for k, bad in enumerate([0, 0, 0, 0]):  # each dimension out of range
        dims = [4, 10, 20, 1]
        dims[k] = bad
        assert call(dims, [x, out]) == 10 + k
    assert call([9, 10, 20, 1], [x, out]) == 10
    assert call([4, 10, 1001, 1], [x, out]) == 12
    assert call([4, 11, 20, 1], [x, out]) == 100  # the logits one token short
    assert call([4, 10, 20, 1], [x, out], sizes=[x.numel(), x.numel() - 1]) == 101
    assert call([4, 10, 20, 1], [x, None]) == 101
    assert call([4, 10, 20, 1], [x, out], count=3) == 102
    assert isinstance(lib, ctypes.CDLL)


def test_float64_and_the_switch_run_the_pytorch_code(monkeypatch):
    unit = ManifoldHyperConnection(16, 4)
    x = expand_streams(torch.randn(3, 2, 16), 4)
    calls = []
    monkeypatch.setattr(mhc_ops, "gates", lambda *a: calls.append(a) or gates_pytorch(*a))
    unit.coefficients(x)
    assert len(calls) == 1
    unit.double().coefficients(x.double())
    with mhc_kernel.enabled(False):
        unit.float().coefficients(x)
    assert len(calls) == 1


@pytest.mark.parametrize("residual", ["sinkhorn", "permutations"])
def test_a_unit_with_and_without_the_kernel_agrees(residual):
    torch.manual_seed(0)
    unit = ManifoldHyperConnection(16, 4, site=1, residual=residual)
    with torch.no_grad():
        unit.phi.normal_(0.0, 0.5)
        unit.gates.fill_(1.0)
    x = expand_streams(torch.randn(5, 3, 16), 4) + 0.1 * torch.randn(5, 3, 4, 16)
    w = torch.randn(16, 16) / 4

    def run():
        unit.zero_grad()
        out = unit(x, lambda u: torch.tanh(u @ w))
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in (unit.phi, unit.gates, unit.bias, unit.gain)]

    with mhc_kernel.enabled(True):
        got, got_grads = run()
    with mhc_kernel.enabled(False):
        want, want_grads = run()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_double_backward_raises_a_clear_error():
    x = logits_for(4, 8).requires_grad_()
    (g,) = torch.autograd.grad(mhc_ops.gates(x, 4, 20).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        g.sum().backward()


def test_compiles_and_traces_as_an_operator():
    x = logits_for(4, 16)
    traced = torch.jit.trace(lambda t: mhc_ops.gates(t, 4, 20), (x,))
    assert "fairseq_plugins::mhc_gates" in str(traced.graph)
    torch.testing.assert_close(traced(x), gates_pytorch(x, 4, 20), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("residual", ["sinkhorn", "permutations"])
@pytest.mark.parametrize(("n", "dim", "tokens"), [(4, 16, 5), (4, 256, 80), (3, 7, 9), (1, 8, 1), (8, 4, 13),
                                                  (5, 6, 11)])  # fmt: skip
def test_decoding_coefficients_in_one_call_equal_the_pytorch_code(n, dim, tokens, residual):
    """Without autograd the whole coefficient maths runs in mhc_coefficients (RMSNorm, product, gates, bias,
    then the gates kernel) or, for mHC-lite, mhc_lite_coefficients (the same, then the softmax over the n!
    permutations); float64 maths of the same unit is the reference."""
    if residual == "permutations" and n > 5:
        pytest.skip("mHC-lite takes n <= 5")
    torch.manual_seed(n + dim)
    unit = ManifoldHyperConnection(dim, n, site=2, residual=residual)
    with torch.no_grad():
        unit.phi.normal_(0.0, 1.0 / dim**0.5)
        unit.gain.uniform_(0.5, 1.5)
        unit.gates.uniform_(0.5, 2.0)
    x = torch.randn(tokens, 1, n, dim)
    calls = []
    original = mhc_kernel.coefficients
    with torch.no_grad():
        mhc_kernel.coefficients = lambda *a: calls.append(1) or original(*a)
        try:
            got = unit.coefficients(x)
        finally:
            mhc_kernel.coefficients = original
        want = unit.double().coefficients(x.double())
    assert calls
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


def test_decoding_coefficients_take_the_log_domain():
    unit = ManifoldHyperConnection(8, 4)
    with torch.no_grad():
        unit.bias[2 * 4 + 1] = 40.0  # a residual logit beyond MAX_EXP_LOGIT for every token
        x = torch.randn(6, 1, 4, 8)
        v = x.reshape(6, -1)
        params = (unit.gain, unit.phi, unit.bias, unit.gates)
        assert not mhc_kernel.coefficients(v, *params, 4, 20, unit.rms_eps)[1]
        got = unit.coefficients(x)
        with mhc_kernel.enabled(False):
            want = unit.coefficients(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_decoding_coefficients_refuse_malformed_inputs():
    n, v = 4, torch.randn(3, 32)
    gain, phi, bias, gates = torch.ones(32), torch.zeros(32, 24), torch.zeros(24), torch.ones(3)
    assert mhc_kernel.check_coefficients(v, gain, phi, bias, gates, n, 20) is None
    bad = [(v[:, :30], gain, phi, bias, gates, n), (v, gain[:-1], phi, bias, gates, n),
           (v, gain, phi[:, :-1], bias, gates, n), (v, gain, phi, bias.double(), gates, n),
           (v[:0], gain, phi, bias, gates, n), (v, gain, phi, bias, gates[:2], n), (v, gain, phi, bias, gates, 9)]
    for args in bad:
        assert mhc_kernel.check_coefficients(*args, 20) is not None
        with pytest.raises(ValueError, match="the mHC kernel cannot take"):
            mhc_kernel.coefficients(*args, 20, 1e-20)
    # mHC-lite: 2n + n! coefficients, n <= 5
    lite_phi, lite_bias = torch.zeros(32, 32), torch.zeros(32)
    assert mhc_kernel.check_coefficients(v, gain, lite_phi, lite_bias, gates, n, 1, True) is None
    assert mhc_kernel.check_coefficients(v, gain, phi, bias, gates, n, 1, True) is not None
    v6 = torch.randn(3, 36)
    assert mhc_kernel.check_coefficients(v6, torch.ones(36), torch.zeros(36, 732), torch.zeros(732), gates, 6, 1,
                                         True) is not None  # fmt: skip
    with pytest.raises(ValueError, match="the mHC kernel cannot take"):
        mhc_kernel.coefficients(v, gain, phi, bias, gates, n, 1, 1e-20, True)


def test_the_lite_coefficients_entry_point_checks_its_arguments():
    lib = mhc_kernel.loaded()
    n, tokens, width = 4, 3, 8
    v = torch.randn(tokens, n * width)
    raw, bias, gates, out = torch.randn(32, tokens), torch.zeros(32), torch.ones(3), torch.empty(24, tokens)

    def call(dims, tensors, sizes=None, count=None):
        d = array("q", dims)
        p = array("q", [t.data_ptr() if t is not None else 0 for t in tensors])
        s = array("q", sizes if sizes is not None else [t.numel() if t is not None else 0 for t in tensors])
        return lib.mhc_lite_coefficients(d.buffer_info()[0], ctypes.c_float(1e-20), p.buffer_info()[0],
                                         s.buffer_info()[0], len(tensors) if count is None else count)  # fmt: skip

    good = [v, raw, bias, gates, out]
    assert call([n, tokens, width, 1, 1], good) == 0
    torch.testing.assert_close(out[2 * n :].view(n, n, tokens).sum(0), torch.ones(n, tokens))  # doubly stochastic
    assert call([6, tokens, width, 1, 1], good) == 10  # n > 5
    for k in range(5):
        dims = [n, tokens, width, 1, 1]
        dims[k] = 0
        assert call(dims, good) == 10 + k
    assert call([n, tokens, width, 1, 1], good, count=4) == 105
    for k in range(5):
        sizes = [t.numel() for t in good]
        sizes[k] += 1
        assert call([n, tokens, width, 1, 1], good, sizes=sizes) == 100 + k
    assert call([n, tokens, width, 1, 1], [v, raw[:24], bias[:24], gates, out]) == 101  # mHC's sizes


def test_a_unit_compiles_without_graph_breaks():
    """The kernels as operators under torch.compile(fullgraph=True) (eager backend: the fake implementations and
    the registered autograd formulas are what is checked), forward and backward, equal to eager."""
    torch.manual_seed(0)
    unit = ManifoldHyperConnection(8, 4, site=1)
    x = expand_streams(torch.randn(3, 2, 8), 4).requires_grad_()
    compiled = torch.compile(lambda s: unit(s, torch.tanh), backend="eager", fullgraph=True)
    got = compiled(x)
    (got_grad,) = torch.autograd.grad(got.square().sum(), x)
    want = unit(x, torch.tanh)
    (want_grad,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_without_the_library_the_pytorch_code_runs(monkeypatch):
    """No compiler or a refused cache leaves loaded() None (tests/test_grn_kernel_cache.py, for both libraries):
    then nothing is called and the unit gives the PyTorch code's results, training and decoding."""
    unit = ManifoldHyperConnection(8, 4, site=1)
    x = expand_streams(torch.randn(3, 2, 8), 4).requires_grad_()
    with mhc_kernel.enabled(False):
        want = unit(x, torch.tanh)
    monkeypatch.setattr(mhc_kernel, "_library", None)
    monkeypatch.setattr(mhc_kernel, "_tried", True)
    monkeypatch.setattr(mhc_kernel, "failure", "no C compiler (test)")
    assert not mhc_kernel.usable(logits_for(4, 6), 4, 20) and not mhc_kernel.usable_mix(x.reshape(-1, 4, 8), 4)
    torch.testing.assert_close(unit(x, torch.tanh), want, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(unit(x, torch.tanh), want, rtol=0, atol=0)


def test_other_devices_are_refused():
    for t in (torch.empty(24, 5, device="meta"), torch.empty(24, 5).to_sparse()):
        assert mhc_kernel.check(t, 4, 20) is not None
    assert mhc_kernel.check_mix(torch.empty(5, 4, 8, device="meta"), None, 4) is not None
