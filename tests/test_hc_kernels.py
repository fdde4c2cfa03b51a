"""Hyper-connections (static and dynamic) through mHC's fused CPU kernels (the width connection as mHC's mixing,
kernels/mhc_mix.c; the depth connection as kernels/mhc_post.c), for float32 CPU streams: the unit and a whole
model against the paper's equations in float64 (tests/test_agg_baselines.py's reference), outputs and every
gradient against the PyTorch code within float32 rounding, decoding without autograd, the switch, the
fallbacks (float64, n > 8) and tracing as the custom operators; the decoding coefficients (kernels/hc_coef.c)
against float64 maths, with malformed inputs refused in Python and by the C entry point."""

import ctypes
import os
import shutil
import warnings
from array import array

import pytest
import torch

from fairseq_plugins.kernels import hc_kernel, mhc_kernel, mhc_ops
from fairseq_plugins.modules.hyper_connections import HyperConnection

from .helpers import build_model, random_batch
from .test_agg_baselines import (
    DEPTH,
    hc_reference_forward,
    hyper_connection_reference,
    randomize_new_weights,
)

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def kernel_loaded():
    assert mhc_kernel.loaded() is not None, mhc_kernel.failure


def unit_and_input(dynamic, rate, dim=16, seed=0):
    torch.manual_seed(seed)
    hc = HyperConnection(dim, rate, site=2, dynamic=dynamic)
    with torch.no_grad():
        for p in hc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    streams = torch.randn(5, 3, rate, dim)
    return hc, streams, torch.nn.Linear(dim, dim)


def gradients(hc, streams, branch, grad):
    streams = streams.detach().requires_grad_()
    out = hc(streams, branch)
    params = [streams, *hc.parameters(), *branch.parameters()]
    return [out, *torch.autograd.grad(out, params, grad)]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("rate", [1, 2, 4, 8])
def test_unit_equals_float64_maths_and_the_pytorch_code(dynamic, rate):
    hc, streams, branch = unit_and_input(dynamic, rate)
    grad = torch.randn(*streams.shape)
    calls = []
    real = mhc_ops.mix
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mhc_ops, "mix", lambda *a: calls.append(1) or real(*a))
        got = gradients(hc, streams, branch, grad)
    assert calls, "the kernel did not run"
    with mhc_kernel.enabled(False):
        want = gradients(hc, streams, branch, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the paper's equations, float64, stream by stream
    hc64, branch64 = hc.double(), branch.double()
    x64 = streams.double().requires_grad_()
    ref = torch.stack(hyper_connection_reference(hc64, list(x64.unbind(-2)), branch64), -2)
    params = [x64, *hc64.parameters(), *branch64.parameters()]
    want64 = [ref, *torch.autograd.grad(ref, params, grad.double())]
    for a, b in zip(got, want64, strict=True):
        torch.testing.assert_close(a.double(), b.detach(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_decoding_without_autograd_equals_the_pytorch_code(dynamic):
    hc, streams, branch = unit_and_input(dynamic, 4)
    with torch.no_grad():
        got = hc(streams, branch)
        with mhc_kernel.enabled(False):
            want = hc(streams, branch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_switch_float64_and_nine_streams_run_the_pytorch_code():
    def refuse(*args):
        raise AssertionError("the kernel ran")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mhc_ops, "mix", refuse)
        mp.setattr(mhc_ops, "post_add", refuse)
        hc, streams, branch = unit_and_input(True, 4)
        with mhc_kernel.enabled(False):
            hc(streams, branch)
        hc.double()(streams.double(), branch.double())
        hc, streams, branch = unit_and_input(True, 9)
        hc(streams, branch)


@pytest.mark.parametrize("arch", ["hc_static_e6d6", "hc_dynamic_e6d6"])
def test_a_float32_model_with_the_kernels_equals_the_equations(arch):
    model = randomize_new_weights(build_model(arch, DEPTH))
    src, lengths, prev = random_batch(model, batch=3, src_len=6, tgt_len=5)
    model.eval()
    with torch.no_grad():
        features, _ = model(src, lengths, prev, features_only=True)
        expected = hc_reference_forward(model.double(), src, prev)
    torch.testing.assert_close(features.double(), expected, rtol=1e-4, atol=1e-4)


def test_traces_as_the_custom_operators():
    hc, streams, branch = unit_and_input(True, 4)
    warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated")
    class Unit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hc, self.branch = hc, branch

        def forward(self, x):
            return self.hc(x, self.branch)

    traced = torch.jit.trace(Unit(), (streams,), check_trace=False)
    graph = str(traced.inlined_graph)
    assert "fairseq_plugins::mhc_mix" in graph and "fairseq_plugins::mhc_post" in graph
    torch.testing.assert_close(traced(streams), hc(streams, branch))


def coefficient_inputs(tokens, n, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n, width, generator=g) * 2 + 0.5
    weight, bias = torch.randn(width, generator=g), torch.randn(width, generator=g)
    w = torch.randn(n + 2, width, generator=g) / 4
    static, scale = torch.randn(n * (n + 2), generator=g), torch.rand(n * (n + 2), generator=g)
    return x, weight, bias, w, static, scale


@pytest.mark.parametrize(("tokens", "n", "width"), [(1, 4, 256), (80, 4, 16), (7, 1, 9), (5, 3, 1), (3, 8, 40)])
def test_decoding_coefficients_equal_float64_maths(tokens, n, width):
    x, weight, bias, w, static, scale = coefficient_inputs(tokens, n, width, seed=tokens + n)
    got = hc_kernel.hc_coefficients(x, weight, bias, w, static, scale, n, 1e-5)
    d = [t.double() for t in (x, weight, bias, w, static, scale)]
    hbar = torch.nn.functional.layer_norm(d[0], (width,), d[1], d[2], 1e-5)  # (tokens, n, C)
    z = torch.einsum("tjc,oc->ojt", hbar, d[3])  # row o n + j
    want = d[4].view(n + 2, n, 1) + d[5].view(n + 2, n, 1) * torch.tanh(z)
    torch.testing.assert_close(got.double(), want.reshape(n * (n + 2), tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["float64", "2-d streams", "n = 9", "no tokens", "weight width", "bias width",
                                  "w rows", "w width", "static size", "scale size", "scale float64"])  # fmt: skip
def test_decoding_coefficients_refuse_malformed_inputs(case):
    n, args = 4, list(coefficient_inputs(5, 4, 8))
    if case == "float64":
        args[0] = args[0].double()
    elif case == "2-d streams":
        args[0] = args[0].flatten(1)
    elif case == "n = 9":
        n, args = 9, list(coefficient_inputs(5, 9, 8))  # nine streams: more than MAX_N
    elif case == "no tokens":
        args[0] = args[0][:0]
    else:
        index = {"weight": 1, "bias": 2, "w": 3, "static": 4, "scale": 5}[case.split()[0]]
        if case.endswith("float64"):
            args[index] = args[index].double()
        elif case == "w rows":
            args[3] = args[3][:-1]
        else:
            args[index] = args[index][..., :-1]
    assert hc_kernel.check_hc_coefficients(*args, n) is not None
    assert not hc_kernel.usable_hc_coefficients(*args, n)
    with pytest.raises(ValueError, match="the mHC kernel cannot take"):
        hc_kernel.hc_coefficients(*args, n, 1e-5)


def test_the_c_entry_points_check_their_arguments():
    lib = mhc_kernel.loaded()
    x, weight, bias, w, static, scale = coefficient_inputs(5, 4, 8)
    tensors = [x, weight, bias, w, static, scale, torch.empty(24, 5), torch.empty(24, 5)]

    def call(dims, tensors, sizes=None, count=None, fn=lib.hc_coefficients):
        d = array("q", dims)
        p = array("q", [t.data_ptr() if t is not None else 0 for t in tensors])
        s = array("q", sizes if sizes is not None else [t.numel() if t is not None else 0 for t in tensors])
        return fn(d.buffer_info()[0], ctypes.c_float(1e-5), p.buffer_info()[0], s.buffer_info()[0],
                  len(tensors) if count is None else count)  # fmt: skip

    assert call([4, 5, 8, 1], tensors) == 0
    for k in range(4):
        dims = [4, 5, 8, 1]
        dims[k] = 0
        assert call(dims, tensors) == 10 + k
    assert call([4, 5, 8, 1], tensors, count=7) == 108
    for k in range(8):
        sizes = [t.numel() for t in tensors]
        sizes[k] -= 1
        assert call([4, 5, 8, 1], tensors, sizes=sizes) == 100 + k
        assert call([4, 5, 8, 1], [None if j == k else t for j, t in enumerate(tensors)]) == 100 + k
    assert call([8, 1 << 36, 1 << 24, 1], tensors) >= 100  # T n C overflows: fits no buffer
    backward = [x, weight, bias, w, scale, tensors[6], torch.randn(24, 5), torch.empty_like(x), torch.empty(8),
                torch.empty(8), torch.empty_like(w), torch.empty(24), torch.empty(24)]
    assert call([4, 5, 8, 1], backward, fn=lib.hc_coefficients_backward) == 0
    for k in range(13):
        sizes = [t.numel() for t in backward]
        sizes[k] += 1
        assert call([4, 5, 8, 1], backward, sizes=sizes, fn=lib.hc_coefficients_backward) == 100 + k
    assert call([4, 5, 8, 1], backward, count=12, fn=lib.hc_coefficients_backward) == 113


@pytest.mark.parametrize(("tokens", "n", "width"), [(1, 4, 256), (40, 4, 16), (7, 1, 9), (5, 3, 1), (3, 8, 40)])
def test_training_coefficients_and_gradients_equal_float64_maths(tokens, n, width):
    """The fused training path (hc_coef.c forward and backward) against the same maths in float64 autograd."""
    args = [t.requires_grad_() for t in coefficient_inputs(tokens, n, width, seed=tokens)]
    got = mhc_ops.hc_coefficients(*args, n, 1e-5)
    d = [t.detach().double().requires_grad_() for t in args]
    hbar = torch.nn.functional.layer_norm(d[0], (width,), d[1], d[2], 1e-5)
    z = torch.einsum("tjc,oc->ojt", hbar, d[3])
    want = (d[4].view(n + 2, n, 1) + d[5].view(n + 2, n, 1) * torch.tanh(z)).reshape(n * (n + 2), tokens)
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad(got, args, grad), torch.autograd.grad(want, d, grad.double()), strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_training_coefficients_operator_gradcheck_and_trace():
    args = [t.requires_grad_() for t in coefficient_inputs(3, 2, 5)]
    warnings.filterwarnings("ignore", "Input #. requires gradient and is not a double")
    assert torch.autograd.gradcheck(lambda *a: mhc_ops.hc_coef(*a, 2, 1e-5)[0], args, eps=1e-2, atol=2e-2,
                                    rtol=2e-2)  # fmt: skip
    warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated")
    traced = torch.jit.trace(lambda *a: mhc_ops.hc_coefficients(*a, 2, 1e-5), tuple(t.detach() for t in args))
    assert "fairseq_plugins::hc_coef" in str(traced.graph)


def test_a_training_unit_uses_the_fused_coefficients():
    hc, streams, branch = unit_and_input(True, 4)
    calls, real = [], mhc_ops.hc_coefficients
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mhc_ops, "hc_coefficients", lambda *a: calls.append(1) or real(*a))
        hc(streams.requires_grad_(), branch).sum().backward()
    assert calls
