"""The GRN kernels with malformed inputs and in every autograd and compilation mode: they behave as the PyTorch
GRN code does (the same result, or the same kind of error), where they once crashed, returned garbage or
dropped a term (issue 30)."""

import gc
import os
import shutil

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from fairseq_plugins.kernels import grn_kernel, grn_ops
from fairseq_plugins.modules.grn import GRNv3

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


def outcome(fn):
    """fn()'s tensors (detached), or the type of the error it raised."""
    try:
        out = fn()
    except (RuntimeError, ValueError, IndexError) as err:
        return type(err)
    return [t.detach() for t in (out if isinstance(out, tuple) else (out,))]


def same_outcome(fn):
    """fn() with and without the kernels: equal tensors, or errors of one type. Returns the kernels' outcome."""
    with grn_kernel.enabled(True):
        got = outcome(fn)
    with grn_kernel.enabled(False):
        want = outcome(fn)
    if isinstance(want, type):
        assert got is want, (got, want)
    else:
        assert not isinstance(got, type), got
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, equal_nan=True)
    return got


def gated(grn):
    with torch.no_grad():
        grn.w.normal_(0.0, 0.3)
    return grn


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("case", ["short chunk", "narrow grn", "narrow norm", "no outputs", "five outputs",
                                  "strided norm weight", "strided chunk"])  # fmt: skip
def test_malformed_inputs_behave_as_in_the_pytorch_code(case, grad):
    torch.manual_seed(0)
    dim, norm, grn = 16, None, gated(GRNv3(16, 3, 3))
    chunks = [torch.randn(1, 4, 2, dim), torch.randn(2, 4, 2, dim)]
    if case == "short chunk":  # fewer tokens than the first: a heap overflow in gate_sums once
        chunks[1] = torch.randn(2, 3, 2, dim)
    elif case == "narrow grn":  # a GRN of width 8 on a 16-wide stack: values of 1e30 once
        grn = gated(GRNv3(8, 3, 3))
    elif case == "narrow norm":
        norm = nn.LayerNorm(8)
    elif case == "no outputs":
        grn, norm = GRNv3(dim, 3, 0), nn.LayerNorm(dim)
    elif case == "five outputs":  # beyond the kernels' MAX_OUTPUTS: the PyTorch code serves it
        grn, norm = gated(GRNv3(dim, 3, 5)), nn.LayerNorm(dim)
    elif case == "strided norm weight":  # silently wrong once (max difference 7.6)
        norm = nn.LayerNorm(dim)
        norm.weight = nn.Parameter(torch.randn(2 * dim)[::2])
    else:
        chunks[1] = torch.randn(2, 2, 4, dim).transpose(1, 2)
    with torch.set_grad_enabled(grad):
        same_outcome(lambda: grn(chunks, norm=norm))


def test_the_kernels_own_entry_point_refuses_what_it_cannot_take():
    chunks, b = [torch.randn(3, 4, 8)], torch.ones(5, 3, 8)
    with pytest.raises(ValueError, match="b of shape .*1 to 4 outputs"):
        grn_kernel.forward(chunks, b, None, None, None, 1e-5, False, save=False)
    with pytest.raises(ValueError, match="norm_weight of shape"):
        grn_kernel.forward(chunks, b[:3], None, torch.ones(4), None, 1e-5, True, save=False)
    with pytest.raises(ValueError, match="chunks of shapes"):
        grn_kernel.forward([chunks[0], torch.randn(1, 3, 8)], torch.ones(1, 4, 8), None, None, None, 0.0, False,
                           save=False)  # fmt: skip


def test_a_nan_gate_propagates_as_with_clamp():
    grn = gated(GRNv3(8, 3, 1))
    with torch.no_grad():
        grn.w[0, 0] = float("nan")
    stack = torch.randn(3, 4, 8).requires_grad_()
    out = same_outcome(lambda: grn([stack]))
    assert out[0].isnan().all()


def test_switching_the_kernels_off_between_forward_and_backward():
    grn, stack = gated(GRNv3(8, 3, 3)), torch.randn(3, 4, 8)
    grads = []
    for switch in (True, False):
        entries = stack.clone().requires_grad_()
        with grn_kernel.enabled(True):
            out = grn([entries], norm=None)
        with grn_kernel.enabled(not switch):
            out.pow(2).sum().backward()
        grads.append(entries.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_double_backward_raises_the_same_error_in_both_paths():
    grn, norm = gated(GRNv3(8, 3, 3)), nn.LayerNorm(8)
    for kernel in (True, False):
        stack = torch.randn(3, 4, 8, requires_grad=True)
        with grn_kernel.enabled(kernel):
            _, h = grn([stack], norm=norm)
            (grad,) = torch.autograd.grad(h.pow(3).sum(), stack, create_graph=True)
            assert grad.requires_grad  # the GRN's term is not silently dropped
            with pytest.raises(RuntimeError, match="no second derivative"):
                grad.pow(2).sum().backward()


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.grn, self.norm = gated(GRNv3(8, 3, 3)), nn.LayerNorm(8)

    def forward(self, stack):
        return self.grn([stack], norm=self.norm)[1]


def test_tracing_under_no_grad_records_the_kernel():
    model = Mixer()
    with torch.no_grad(), pytest.warns(Warning):  # torch.jit.trace is deprecated; its warnings are expected
        traced = torch.jit.trace(model, torch.randn(3, 4, 8))
    assert "fairseq_plugins::grn_forward" in str(traced.inlined_graph)
    with torch.no_grad():
        fresh = torch.randn(3, 4, 8)
        torch.testing.assert_close(traced(fresh), model(fresh))


def test_compiled_with_fullgraph_matches_eager():
    torch._dynamo.reset()
    grn, norm = gated(GRNv3(8, 3, 3)), nn.LayerNorm(8)

    def step(stack):
        first, h = grn([stack[:1], stack[1:]], norm=norm)
        return first.sum() + h.pow(2).sum()

    # aot_eager: dynamo's capture and AOTAutograd's fake and autograd tracing, without inductor's C++ build
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (compiled, step):
        stack = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0)).requires_grad_()
        loss = fn(stack)
        loss.backward()
        results.append((loss.detach(), stack.grad))
    torch.testing.assert_close(results[0], results[1])


def test_inference_mode_and_activation_checkpointing():
    grn, norm, stack = gated(GRNv3(8, 3, 3)), nn.LayerNorm(8), torch.randn(3, 4, 8)
    with torch.inference_mode():
        same_outcome(lambda: grn([stack], norm=norm))
    grads = []
    for ckpt in (True, False):
        entries = stack.clone().requires_grad_()
        fn = lambda s: grn([s], norm=norm)[1].pow(2).sum()
        (checkpoint(fn, entries, use_reentrant=False) if ckpt else fn(entries)).backward()
        grads.append(entries.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_ddp_gets_the_kernels_gradients(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        grn, stack, grads = gated(GRNv3(8, 3, 3)), torch.randn(3, 4, 8), []
        model = nn.parallel.DistributedDataParallel(grn)
        for kernel in (True, False):
            with grn_kernel.enabled(kernel):
                model([stack]).pow(2).sum().backward()  # DDP's hooks all-reduce the parameters' gradients
            grads.append([p.grad.clone() for p in grn.parameters()])
            grn.zero_grad()
        del model
    finally:
        # DDP's reducer freed while the group is alive: freed after it, the reducer held the group's last reference,
        # and the group's destructor ran with the GIL held and joined a gloo thread that was waiting for the GIL to
        # free a tensor (a deadlock, once in CI; pytorch/pytorch#56297); the group's own Python object releases the
        # GIL before destroying it
        gc.collect()
        dist.destroy_process_group()
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_two_threads_compute_what_one_does():
    torch.manual_seed(0)
    grn, norm = gated(GRNv3(64, 4, 3)), nn.LayerNorm(64)
    stack = torch.randn(4, 1024, 64)  # enough tokens that the kernels split them between threads
    results, before = [], torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            entries = stack.clone().requires_grad_()
            grn.zero_grad()
            _, h = grn([entries], norm=norm)
            h.pow(2).sum().backward()
            results.append([h.detach(), entries.grad, grn.b.grad, grn.w.grad])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_the_operators_are_registered():
    assert torch.ops.fairseq_plugins.grn_forward.default is not None
    assert "no second derivative" in grn_ops.NO_DOUBLE_BACKWARD
