"""The grid of issue 26: every combination of the four axes of ``residual_axes`` (fairseq_plugins/axes/) either
works or is refused when the model is built, with one error naming both choices and the reason.

CI runs a pairwise covering subset (``grid.covering()``: every pair of choices from two axes in at least one
working combination, plus one combination for every refused pair); ``ALL_FAMILIES=1`` runs the full product.

A working combination, at tiny width and two layers: one training step (SGD) with a finite loss and finite
weights after it, incremental decoding equal to full decoding (float64), a state-dict round trip into a freshly
built model that then computes the same, a bfloat16 autocast forward/backward (``--autocast-dtype``, issue 31) with a
finite loss and incremental decoding equal to full within bfloat16 rounding, and a float16 forward/backward with
a finite loss. ``docs/grid.md`` is
this grid as a table (``scripts/analysis/grid_table.py``); a test keeps the two in step.
"""

import copy
import functools
import os

import pytest
import torch

from fairseq_plugins.axes import IncompatibleChoices
from fairseq_plugins.axes.grid import combinations, covering, refusal
from fairseq_plugins.models.axes_transformer import AxesTransformerModel
from fairseq_plugins.precision import enable_autocast

from .helpers import (
    REPO,
    TinyTask,
    close_in_bf16,
    full_and_incremental_logits,
    parse_model_args,
    random_batch,
)

LAYERS = ["--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0"]
TASK = TinyTask()
COMBOS = combinations() if os.environ.get("ALL_FAMILIES") == "1" else covering()


@functools.cache
def parsed(residual: str):
    """fairseq-train's args for ``--arch residual_axes --residual R`` (parsing once per residual choice: the
    other axes' options are filled by build_model's architecture step, as for a checkpoint's args)."""
    return parse_model_args("residual_axes", [*LAYERS, "--residual", residual])


def args_of(combo: dict[str, str]):
    args = copy.deepcopy(parsed(combo["residual"]))
    for axis, name in combo.items():
        setattr(args, axis, name)
    return args


def build(args, seed: int):
    torch.manual_seed(seed)
    return AxesTransformerModel.build_model(copy.deepcopy(args), TASK)


def loss_of(model, batch) -> torch.Tensor:
    src, lengths, prev = batch
    logits, _ = model(src, lengths, prev)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), prev.roll(-1, 1).flatten())


def ids(combo):
    return "/".join(combo.values())


@pytest.mark.parametrize("combo", COMBOS, ids=[ids(c) for c in COMBOS])
def test_combination_works_or_is_refused_naming_both_choices(combo):
    args = args_of(combo)
    reason = refusal(combo)
    if reason is not None:
        with pytest.raises(IncompatibleChoices) as err:
            build(args, 0)
        assert str(err.value) == reason
        named = [f"--{a.replace('_', '-')} {n}" for a, n in combo.items() if f"--{a.replace('_', '-')} {n}" in reason]
        assert len(named) == 2, reason
        return

    model = build(args, 0).train()
    batch = random_batch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = loss_of(model, batch)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters())

    model.eval()
    fresh = build(args, 1).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)

    double = copy.deepcopy(model).double()
    full, incremental = full_and_incremental_logits(double, *batch)
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-6)  # fairseq softmaxes attention in float32

    mixed = enable_autocast(copy.deepcopy(model), torch.bfloat16)
    full, incremental = full_and_incremental_logits(mixed, *batch)
    assert full.dtype == torch.float32 and close_in_bf16(incremental, full)
    mixed_loss = loss_of(mixed.train(), batch)
    mixed_loss.backward()
    assert torch.isfinite(mixed_loss) and all(p.grad is None or p.grad.dtype == torch.float32 for p in mixed.parameters())

    half = model.half().train()
    half_loss = loss_of(half, batch)
    half_loss.backward()
    assert torch.isfinite(half_loss)


def test_docs_grid_is_up_to_date():
    from scripts.analysis import grid_table

    assert (REPO / "docs" / "grid.md").read_text() == grid_table.markdown(), (
        "docs/grid.md is stale: python -m scripts.analysis.grid_table > docs/grid.md"
    )


def test_the_ci_subset_covers_every_pair_and_every_refusal():
    """Every pair of choices that some working combination holds is held by a working combination of
    ``covering()``, and every refused pair is refused by one of its combinations."""
    from fairseq_plugins.axes.grid import _names, _pairs

    chosen = covering()
    everything = combinations()
    working = [c for c in everything if refusal(c) is None]
    assert set().union(*(_pairs(c) for c in working)) <= set().union(*(_pairs(c) for c in chosen if refusal(c) is None))

    def refused_pairs(combos):
        out = set()
        for c in combos:
            reason = refusal(c)
            if reason is not None:
                out.add(tuple(sorted((a, n) for a, n in c.items() if _names(reason, a, n))))
        return out

    assert refused_pairs(everything) == refused_pairs(chosen)
