"""Half precision at depth: an E36D6 model of every family (real IWSLT width) runs forward and backward in
float16 on CPU at initialisation without inf or NaN, ResiDual with the dual-stream scale the recipes use
for fp16 (0.05, the authors' value).

The matrix products run through ``Float32Accumulation``: the CPU's float16 GEMM is a scalar fallback (10 ms a
weight gradient at width 512, 95% of a test's time) that accumulates in float32 and rounds once to float16; the
mode computes exactly that (float16 inputs, a float32 product, one rounding to float16) with the vectorised float32
GEMM, so every value the assertions see is a float16 value computed as before, an overflow still an inf."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_plugins.models import PRESETS

from .helpers import build_model, random_batch

FP16_MODEL_ARGS = {"residual": ["--dual-residual-scale", "0.05"]}
ARCHS = sorted(a for a, p in PRESETS.items() if a == f"{p.family}_iwslt_e36d6")
GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
         torch.ops.aten.baddbmm.default}  # fmt: skip


class Float32Accumulation(TorchDispatchMode):
    """A float16 matrix product as the CPU computes it (float32 accumulation, one rounding), in float32 GEMM."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if func in GEMMS and "out" not in kwargs and tensors and all(t.dtype == torch.half for t in tensors):
            args = tuple(a.float() if isinstance(a, torch.Tensor) else a for a in args)
            return func(*args, **kwargs).half()
        return func(*args, **kwargs)


def test_the_mode_rounds_as_the_float16_gemm_does():
    """Same float16 result as the native product (to summation order), an overflow still an inf."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(s, generator=g).half() for s in ((6, 40), (40, 5), (5,)))
    big = torch.full((2, 40), 30.0).half()  # 40 * 30 * 30 = 36000 < 65504 each, but 2x that overflows
    # partial sums past float16's range (2 * 250 * 250), a total of 0: the native product accumulates in float32 too
    swing, ones = torch.tensor([[250.0, 250.0, -250.0, -250.0] * 8]).half(), torch.full((32, 3), 250.0).half()
    with Float32Accumulation():
        got = [a @ b, torch.addmm(c, a, b), swing @ ones, big @ (2 * big.t())]
    torch.testing.assert_close(got[:3], [a @ b, torch.addmm(c, a, b), swing @ ones])
    assert all(t.dtype == torch.half for t in got) and not got[2].any() and torch.isinf(got[3]).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_e36d6_forward_backward_in_half_precision(arch):
    family = PRESETS[arch].family
    model = build_model(arch, FP16_MODEL_ARGS.get(family, []), tiny=False).half().train()
    src, lengths, prev = random_batch(model, batch=4, src_len=12, tgt_len=10)
    with Float32Accumulation():
        logits, _ = model(src, lengths, prev)
        assert torch.isfinite(logits).all()
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), src[:, :10].flatten())
        loss.backward()
    assert torch.isfinite(loss)
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad[:5]}"
