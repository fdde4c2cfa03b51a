"""Half precision at depth: an E36D6 model of every family (real IWSLT width) runs forward and backward in
float16 on CPU at initialisation without inf or NaN, ResiDual with the dual-stream scale the recipes use
for fp16 (0.05, the authors' value)."""

import pytest
import torch

from fairseq_plugins.models import PRESETS

from .helpers import build_model, random_batch

FP16_MODEL_ARGS = {"residual": ["--dual-residual-scale", "0.05"]}
ARCHS = sorted(a for a, p in PRESETS.items() if a == f"{p.family}_iwslt_e36d6")


@pytest.mark.parametrize("arch", ARCHS)
def test_e36d6_forward_backward_in_half_precision(arch):
    family = PRESETS[arch].family
    model = build_model(arch, FP16_MODEL_ARGS.get(family, []), tiny=False).half().train()
    src, lengths, prev = random_batch(model, batch=4, src_len=12, tgt_len=10)
    logits, _ = model(src, lengths, prev)
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), src[:, :10].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad[:5]}"
