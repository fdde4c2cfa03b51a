"""Half precision at depth: an E36D6 model of every family (real IWSLT width) runs forward and backward in
float16 on CPU at initialisation without inf or NaN, ResiDual with the dual-stream scale the recipes use
for fp16 (0.05, the authors' value).

The matrix products run through ``Float32Accumulation``: the CPU's float16 GEMM is a scalar fallback (10 ms a
weight gradient at width 512, 95% of a test's time) that accumulates in float32 and rounds once to float16; the
mode computes exactly that (float16 inputs, a float32 product, one rounding to float16) with the vectorised float32
GEMM, so every value the assertions see is a float16 value computed as before, an overflow still an inf.

CI checks every axis choice once, not every family (issue 54 item 5; every family with ALL_FAMILIES=1): the families
whose numerics no combination of ``residual_axes`` computes (fairseq's transformer, a preset that sets a model option
beside the axes: tests/grid_sample.py options_beside_the_axes, a family with fp16 options of its own: FP16_MODEL_ARGS),
then ``residual_axes`` at the same depth and width on the combinations of the covering sample (grid_sample.py) that
hold every axis choice those families do not. Every other family has the arguments of ``residual_axes`` with its axis
choices (options_beside_the_axes is {}) and a model that is ``residual_axes`` or an alias class of it adding only an
architecture function (families.py ``_register_alias``), so it builds ``residual_axes``'s modules with choices the
run set holds: each choice's float16 arithmetic at E36D6 is checked, and the residual choice ``post``, which no
family makes, besides."""

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_plugins.models import PRESETS
from fairseq_plugins.models.axes_transformer import MODEL

from .grid_sample import (
    axis_flags,
    choices_of,
    combo_id,
    covering_sample,
    family_choices,
    options_beside_the_axes,
    working,
)
from .helpers import build_model, random_batch

FP16_MODEL_ARGS = {"residual": ["--dual-residual-scale", "0.05"]}
ALL_ARCHS = sorted(a for a, p in PRESETS.items() if a == f"{p.family}_iwslt_e36d6")


def own_numerics(arch: str) -> bool:
    """Whether no combination of residual_axes builds the modules of preset ``arch``."""
    return options_beside_the_axes(arch) != {} or PRESETS[arch].family in FP16_MODEL_ARGS


ARCHS = ALL_ARCHS if os.environ.get("ALL_FAMILIES") == "1" else [a for a in ALL_ARCHS if own_numerics(a)]
# the combinations holding every axis choice those families do not, at their depth and width (IWSLT E36D6)
COMBOS = covering_sample(covered=family_choices(a for a in ARCHS if options_beside_the_axes(a) is not None))
_SHAPE = PRESETS[ALL_ARCHS[0]]
SHAPE = [f for side in ("encoder", "decoder") for f in (
    f"--{side}-layers", str(getattr(_SHAPE, f"{side}_layers")), f"--{side}-embed-dim", str(_SHAPE.width.embed_dim),
    f"--{side}-ffn-embed-dim", str(_SHAPE.width.ffn_dim), f"--{side}-attention-heads", str(_SHAPE.width.heads))]  # fmt: skip
# id -> (arch, model options)
MODELS = {**{a: (a, FP16_MODEL_ARGS.get(PRESETS[a].family, [])) for a in ARCHS},
          **{f"{MODEL}:{combo_id(c)}": (MODEL, SHAPE + axis_flags(c)) for c in COMBOS}}  # fmt: skip
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


def test_the_run_set_holds_every_axis_choice_at_e36d6():
    assert all(PRESETS[a].encoder_layers == 36 and PRESETS[a].decoder_layers == 6 for a in ALL_ARCHS)
    assert len({PRESETS[a].width for a in ALL_ARCHS}) == 1  # the combinations' SHAPE is every family's
    assert {"transformer_preln_iwslt_e36d6", "residual_iwslt_e36d6", "value_residual_iwslt_e36d6"} <= set(ARCHS)
    held = family_choices(a for a in ARCHS if options_beside_the_axes(a) is not None) | set().union(*map(choices_of, COMBOS))
    assert held >= set().union(*map(choices_of, working()))  # every choice of the grid, the families' among them


@pytest.mark.parametrize("name", list(MODELS))
def test_e36d6_forward_backward_in_half_precision(name):
    arch, extra = MODELS[name]
    model = build_model(arch, extra, tiny=False).half().train()
    src, lengths, prev = random_batch(model, batch=4, src_len=12, tgt_len=10)
    with Float32Accumulation():
        logits, _ = model(src, lengths, prev)
        assert torch.isfinite(logits).all()
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), src[:, :10].flatten())
        loss.backward()
    assert torch.isfinite(loss)
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad[:5]}"
