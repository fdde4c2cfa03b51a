"""The fused CPU GRN kernels (fairseq_plugins/kernels) against the PyTorch GRN code they replace: same outputs
and gradients in float32 for every GRN version, output count, LayerNorm and stack layout; the same DCA model
training step with and without them; the fallback when they cannot be built or are turned off."""

import hashlib
import os
import shutil

import pytest
import torch
from torch import nn

from fairseq_plugins.kernels import grn_kernel
from fairseq_plugins.modules.grn import GRNv1, GRNv2, GRNv3

from .helpers import build_model, random_batch

HAVE_CC = shutil.which(os.environ.get("CC", "cc")) is not None
needs_kernel = pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the PyTorch code runs instead")


def run_grn(grn, norm, stack, split, kernel: bool):
    """Outputs, gradients (stack, GRN, LayerNorm) and the no-grad outputs of one GRN call on ``stack``."""
    norm_params = list(norm.parameters()) if norm is not None else []
    for p in [*grn.parameters(), *norm_params]:
        p.grad = None
    with grn_kernel.enabled(kernel):
        entries = stack.clone().requires_grad_()
        chunks = list(torch.split(entries, split))
        out = grn(chunks, norm=norm)
        outs = out if isinstance(out, tuple) else (out,)
        weights = torch.Generator().manual_seed(1)
        sum((o * torch.randn(o.shape, generator=weights)).sum() for o in outs).backward()
        with torch.no_grad():
            no_grad = grn([c.detach() for c in chunks], norm=norm)
    grads = [entries.grad, *(p.grad for p in grn.parameters()), *(p.grad for p in norm_params)]
    return [o.detach() for o in outs], grads, list(no_grad if isinstance(no_grad, tuple) else (no_grad,))


@needs_kernel
def test_the_kernels_build_here():
    assert grn_kernel.library() is not None, grn_kernel.failure
    assert grn_kernel.usable([torch.ones(2, 3)], torch.ones(1, 2, 3))
    # other dtypes, and stacks in more chunks than DepthStack hands over: the PyTorch code
    assert not grn_kernel.usable([torch.ones(2, 3)], torch.ones(1, 2, 3, dtype=torch.float64))
    assert not grn_kernel.usable([torch.ones(1, 3)] * (grn_kernel.MAX_CHUNKS + 1), torch.ones(1, 4, 3))


@needs_kernel
@pytest.mark.parametrize("cls,outputs", [(GRNv1, 1), (GRNv1, 3), (GRNv2, 1), (GRNv3, 1), (GRNv3, 3)])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("split", [[5], [1, 1, 3], [2, 3]])  # the whole stack, k-DCA's (embedding, middle, last k)
def test_kernels_compute_what_the_pytorch_code_does(cls, outputs, with_norm, split):
    torch.manual_seed(0)
    dim = 40  # not a multiple of the kernels' vector lanes: their tail loops run too
    grn = cls(dim, sum(split), outputs)
    norm = nn.LayerNorm(dim) if with_norm else None
    with torch.no_grad():
        grn.b.normal_(1.0, 0.5)
        if grn.w is not None:
            grn.w.normal_(0.0, 0.3)  # gates of both signs
        if norm is not None:
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    stack = torch.randn(sum(split), 6, 3, dim) * 3
    stack[0, 0, 0] = 0.0  # a zero entry: its gate's dot product is exactly 0 (σ'(0) = 1)
    got = run_grn(grn, norm, stack, split, kernel=True)
    want = run_grn(grn, norm, stack, split, kernel=False)
    assert [len(part) for part in got] == [len(part) for part in want]
    for a, b in zip([t for part in got for t in part], [t for part in want for t in part], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("used", [0, 1])  # x[0] alone (no gradient reaches h), h alone (the output GRN's case)
def test_kernels_take_the_gradient_of_one_output_alone(used):
    torch.manual_seed(0)
    grn, norm = GRNv3(16, 4, 3), nn.LayerNorm(16)
    with torch.no_grad():
        grn.w.normal_(0.0, 0.3)
    stack = torch.randn(4, 5, 16)
    grads = []
    for kernel in (True, False):
        entries = stack.clone().requires_grad_()
        with grn_kernel.enabled(kernel):
            grn([entries[:1], entries[1:]], norm=norm)[used].pow(2).sum().backward()
        grads.append([entries.grad, grn.b.grad, grn.w.grad, norm.weight.grad])
        grn.zero_grad(set_to_none=True)
        norm.zero_grad(set_to_none=True)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("k", ["0", "2"])
def test_a_dca_training_step_is_the_same_with_and_without_the_kernels(k):
    results = []
    for kernel in (True, False):
        model = build_model("dca_e6d6", ["--encoder-layers", "4", "--decoder-layers", "4", "--dca-k", k], seed=3)
        for name, p in model.named_parameters():  # non-initial GRN weights, so that every gate is at work
            if name.endswith("grn.w"):
                nn.init.normal_(p, 0.0, 0.2)
        with grn_kernel.enabled(kernel):
            out, _ = model(*random_batch(model))
            out.float().pow(2).mean().backward()
        results.append((out.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (out_k, grads_k), (out_t, grads_t) = results
    torch.testing.assert_close(out_k, out_t, rtol=1e-4, atol=1e-5)
    for name, grad in grads_t.items():
        torch.testing.assert_close(grads_k[name], grad, rtol=1e-3, atol=1e-6, msg=name)


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """The loader as in a new process (nothing loaded or tried yet), with an empty cache; restored afterwards."""
    monkeypatch.setattr(grn_kernel, "_library", None)
    monkeypatch.setattr(grn_kernel, "_tried", False)
    monkeypatch.setattr(grn_kernel, "failure", None)
    monkeypatch.setenv("FAIRSEQ_PLUGINS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_failed_build_falls_back_to_the_pytorch_code_with_a_warning(fresh_loader, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(fresh_loader.parent / "no-such-compiler"))
    out = GRNv3(8, 3, 3)([torch.randn(3, 4, 8)])
    assert grn_kernel.library() is None and out.shape == (3, 4, 8)
    warnings = [r.getMessage() for r in caplog.records if "GRN kernels unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "using the PyTorch code" in warnings[0], warnings
    assert not fresh_loader.exists()  # nothing that looks built


def test_the_kernels_can_be_turned_off(fresh_loader):
    with grn_kernel.enabled(False):
        GRNv3(8, 3, 3)([torch.randn(3, 4, 8)])
        assert grn_kernel.library() is None and grn_kernel.failure is None
    assert not fresh_loader.exists()


@needs_kernel
def test_a_build_leaves_only_the_finished_library_and_its_hash_record(fresh_loader):
    assert grn_kernel.loaded() is not None, grn_kernel.failure
    files = sorted((p.name for p in fresh_loader.iterdir()), key=lambda name: name.endswith(".so"))  # names are hashes
    assert len(files) == 2 and files[0].endswith(".sha256") and files[1].endswith(".so"), files
    digest = (fresh_loader / files[0]).read_text().strip()
    assert files[1] == f"grn_cpu-{digest}.so"
    assert hashlib.sha256((fresh_loader / files[1]).read_bytes()).hexdigest() == digest  # content-addressed
