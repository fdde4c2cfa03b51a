"""The fused depth-connection kernel (kernels/mhc_post.c: new = mixed + H_post^T F per token, and backward) of
mHC and hyper-connections, against float64 maths and the PyTorch code: results and gradients within float32
rounding, gradcheck of the operator's backward, malformed inputs refused in Python and by the C entry points,
NaN propagation, tracing, and the module helper's fallback."""

import os
import shutil
import warnings
from array import array

import pytest
import torch

from fairseq_plugins.kernels import mhc_kernel, mhc_ops
from fairseq_plugins.modules import mhc

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def kernel_loaded():
    assert mhc_kernel.loaded() is not None, mhc_kernel.failure


def inputs(tokens, n, width, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mixed = torch.randn(tokens, n, width, generator=g, dtype=torch.float64).to(dtype)
    post = torch.rand(n, tokens, generator=g, dtype=torch.float64).mul(2).to(dtype)
    out = torch.randn(tokens, width, generator=g, dtype=torch.float64).to(dtype)
    return mixed, post, out


def reference(mixed, post, out):
    """new[t, i] = mixed[t, i] + post[i, t] out[t]."""
    return mixed + torch.einsum("it,tc->tic", post, out)


@pytest.mark.parametrize(("tokens", "n", "width"), [(1, 4, 256), (7, 4, 16), (33, 4, 13), (5, 1, 8), (9, 3, 1),
                                                    (4, 8, 40), (300, 4, 64)])  # fmt: skip
def test_result_and_gradients_equal_float64_maths(tokens, n, width):
    args = [t.requires_grad_() for t in inputs(tokens, n, width, seed=tokens + n)]
    new = mhc_ops.post_add(*args, args[0].size(1))
    args64 = [t.detach().double().requires_grad_() for t in args]
    new64 = reference(*args64)
    torch.testing.assert_close(new.double(), new64.detach(), rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(new)
    got = torch.autograd.grad(new, args, grad)
    want = torch.autograd.grad(new64, args64, grad.double())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_the_module_helper_equals_the_pytorch_code():
    mixed, post, out = (t.requires_grad_() for t in inputs(40, 4, 24))
    grad = torch.randn(40, 4, 24)
    results = []
    for on in (True, False):
        with mhc_kernel.enabled(on):
            new = mhc.depth_connection(mixed, post, out, 4)
            results.append((new, *torch.autograd.grad(new, (mixed, post, out), grad)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_gradcheck_of_the_operator_backward():
    # float32 kernel: finite differences in float32 need a loose tolerance
    mixed, post, out = (t.requires_grad_() for t in inputs(3, 2, 5))
    warnings.filterwarnings("ignore", "Input #. requires gradient and is not a double")
    assert torch.autograd.gradcheck(lambda a, b, c: mhc_ops.mhc_post(a, b, c, 2), (mixed, post, out), eps=1e-2,
                                    atol=1e-2, rtol=1e-2)  # fmt: skip


def test_the_operator_and_the_function_agree():
    args = [t.requires_grad_() for t in inputs(6, 4, 16)]
    grad = torch.randn(6, 4, 16)
    a = mhc_ops.mhc_post(*args, 4)
    ga = torch.autograd.grad(a, args, grad)
    b = mhc_ops.PostFunction.apply(*args, 4)
    gb = torch.autograd.grad(b, args, grad)
    torch.testing.assert_close(a, b)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y)


def test_nan_propagates():
    mixed, post, out = inputs(5, 4, 8)
    out[2, 3] = float("nan")
    new = mhc_ops.post_add(mixed, post, out, 4)
    assert new[2, :, 3].isnan().all() and not new[[0, 1, 3, 4]].isnan().any()


@pytest.mark.parametrize("case", ["float64", "float16", "2-d streams", "n = 9", "no tokens", "no width", "post tokens",
                                  "post rows", "n mismatch", "out width", "out tokens", "post float64"])  # fmt: skip
def test_malformed_inputs_are_refused_in_python(case):
    n, (mixed, post, out) = 4, inputs(5, 4, 8)
    if case in ("float64", "float16"):
        mixed = mixed.to(getattr(torch, case))
    elif case == "2-d streams":
        mixed = mixed.flatten(1)
    elif case == "n = 9":
        n, (mixed, post, out) = 9, inputs(5, 9, 8)
    elif case == "no tokens":
        mixed, post, out = mixed[:0], post[:, :0], out[:0]
    elif case == "no width":
        mixed, out = mixed[..., :0], out[:, :0]
    elif case == "n mismatch":
        n = 3
    elif case == "post tokens":
        post = post[:, :-1]
    elif case == "post rows":
        post = post[:-1]
    elif case == "out width":
        out = out[:, :-1]
    elif case == "out tokens":
        out = out[:-1]
    else:
        post = post.double()
    assert mhc_kernel.check_post(mixed, post, out, n) is not None
    with pytest.raises(ValueError, match="the mHC kernel cannot take"):
        mhc_kernel.post_forward(mixed, post, out, n)
    with pytest.raises(ValueError, match="the mHC kernel cannot take"):
        mhc_kernel.post_backward(mixed, post, out, n)


def test_non_contiguous_inputs_are_copied():
    mixed, post, out = inputs(6, 4, 16)
    mt = mixed.transpose(0, 1).contiguous().transpose(0, 1)
    pt = post.t().contiguous().t()
    torch.testing.assert_close(mhc_ops.post_add(mt, pt, out, 4), reference(mixed, post, out))


def test_the_c_entry_points_check_their_arguments():
    lib = mhc_kernel.loaded()
    mixed, post, out = inputs(5, 4, 8)
    new, gp, go = torch.empty_like(mixed), torch.empty_like(post), torch.empty_like(out)

    def call(dims, tensors, sizes=None, count=None, fn=lib.mhc_post_forward):
        d = array("q", dims)
        p = array("q", [t.data_ptr() if t is not None else 0 for t in tensors])
        s = array("q", sizes if sizes is not None else [t.numel() if t is not None else 0 for t in tensors])
        return fn(d.buffer_info()[0], p.buffer_info()[0], s.buffer_info()[0], len(tensors) if count is None else count)

    assert call([4, 5, 8, 1], [mixed, post, out, new]) == 0
    for k in range(4):
        dims = [4, 5, 8, 1]
        dims[k] = 0
        assert call(dims, [mixed, post, out, new]) == 10 + k
    assert call([4, 6, 8, 1], [mixed, post, out, new]) == 100
    assert call([4, 5, 8, 1], [mixed, post, out, None]) == 103
    assert call([4, 5, 8, 1], [mixed, post, out, new], sizes=[40 * 4, 19, 40, 160]) == 101
    assert call([4, 5, 8, 1], [mixed, post, out, new], count=5) == 104
    assert call([4, 5, 8, 1], [mixed, post, out, gp, go], fn=lib.mhc_post_backward) == 0
    assert call([4, 5, 8, 1], [mixed, post, out, gp, go[:-1]], fn=lib.mhc_post_backward) == 104
    assert call([4, 5, 8, 1], [mixed, post, out, gp], fn=lib.mhc_post_backward) == 105


def test_traces_as_an_operator():
    args = inputs(4, 4, 8)
    warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated")
    traced = torch.jit.trace(lambda a, b, c: mhc_ops.post_add(a, b, c, 4), args)
    assert "fairseq_plugins::mhc_post" in str(traced.graph)
    torch.testing.assert_close(traced(*args), reference(*args))
