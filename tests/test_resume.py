"""A run stopped after N updates and resumed from checkpoint_last.pt follows the uninterrupted run exactly:
same logged losses and bit-identical parameters after the last update (same seed, same data order). For CI's
trained families and for the first two combinations of the covering sample of the axes grid (``residual_axes``;
tests/grid_sample.py: those adding the most axis choices CI's families do not hold); every family and the whole
grid with ALL_FAMILIES=1."""

import pytest
import torch

from .grid_sample import axis_flags, combo_id, family_choices, grid_sample
from .helpers import family_train_args, run, train_command, train_log, trained_families

FAMILIES = trained_families()
# two combinations in CI (each costs a family's subprocess runs, ~1 min on a loaded machine); all with ALL_FAMILIES=1
GRID = grid_sample(covered=family_choices(f"{family}_e6d6" for family in FAMILIES), limit=2)


def train(corpus_bin, save_dir, arch, max_update, axes=()):
    extra = ["--dropout", "0.2", *family_train_args(arch), *axes]  # dropout on: its RNG must be restored too
    proc = run(train_command(corpus_bin, save_dir, arch, max_update=max_update, extra=extra))
    return {int(r["num_updates"]): r["loss"] for r in train_log(proc.stdout)}


CONFIGS = [(f"{family}_e6d6", ()) for family in FAMILIES] + [("residual_axes", tuple(axis_flags(c))) for c in GRID]
IDS = FAMILIES + [combo_id(c) for c in GRID]


@pytest.mark.parametrize(("arch", "axes"), CONFIGS, ids=IDS)
def test_resume_follows_the_uninterrupted_run(arch, axes, corpus_bin, tmp_path):
    whole = train(corpus_bin, tmp_path / "whole", arch, max_update=6, axes=axes)
    first = train(corpus_bin, tmp_path / "split", arch, max_update=3, axes=axes)
    second = train(corpus_bin, tmp_path / "split", arch, max_update=6, axes=axes)
    assert sorted(first) == [1, 2, 3] and sorted(second) == [4, 5, 6]
    assert {**first, **second} == whole

    a = torch.load(tmp_path / "whole" / "checkpoint_last.pt")["model"]
    b = torch.load(tmp_path / "split" / "checkpoint_last.pt")["model"]
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resuming: {different[:5]}"


def test_resume_after_the_first_epoch_is_exact_with_update_epoch_batch_itr(corpus_bin, tmp_path):
    """fairseq builds the batches under the seed of the epoch its iterator is built in and an uninterrupted run keeps
    epoch 1's, so a run resumed in a later epoch trains on other batches; --update-epoch-batch-itr True rebuilds the
    iterator every epoch, and the resumed run is exact (docs/study_tool.md)."""
    extra = ["--dropout", "0.2", "--update-epoch-batch-itr", "True"]

    def train(save_dir, max_update):
        proc = run(train_command(corpus_bin, tmp_path / save_dir, "transformer_preln_e6d6", max_update=max_update,
                                 extra=extra))  # fmt: skip
        return {int(r["num_updates"]): (r["loss"], r["epoch"]) for r in train_log(proc.stdout)}

    whole = train("whole", 12)
    epoch_two = [u for u, (_, epoch) in whole.items() if epoch == 2]
    assert len(epoch_two) >= 2  # split at epoch 2's first update: the resumed run continues inside epoch 2
    split_at = epoch_two[0]
    first, second = train("split", split_at), train("split", 12)
    assert {u: loss for u, (loss, _) in {**first, **second}.items()} == {u: loss for u, (loss, _) in whole.items()}


def test_an_empty_last_checkpoint_resumes_exactly_from_the_newest_intact_one(corpus_bin, tmp_path):
    """A save killed while fairseq copied it to checkpoint_last.pt (by a run without the plugin's atomic copy)
    leaves that file empty: the same command resumes from the newest intact checkpoint (the save's own file,
    checkpoint_1_3.pt, or checkpoint_best.pt, copied from it after it), names it in one line, and follows the
    uninterrupted run exactly."""
    extra = ["--dropout", "0.2", "--save-interval-updates", "3"]

    def train(save_dir, max_update):
        proc = run(train_command(corpus_bin, tmp_path / save_dir, "transformer_preln_e6d6", max_update=max_update,
                                 extra=extra))  # fmt: skip
        return proc, {int(r["num_updates"]): r["loss"] for r in train_log(proc.stdout)}

    _, whole = train("whole", 6)
    _, first = train("split", 3)
    last = tmp_path / "split" / "checkpoint_last.pt"
    assert (tmp_path / "split" / "checkpoint_1_3.pt").exists()
    last.write_bytes(b"")
    proc, second = train("split", 6)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "truncated or corrupt; resuming from" in line]
    newest = [f"{tmp_path / 'split' / name}, the newest intact" for name in ("checkpoint_1_3.pt", "checkpoint_best.pt")]
    assert len(lines) == 1 and any(name in lines[0] for name in newest), lines
    assert sorted(first) == [1, 2, 3] and sorted(second) == [4, 5, 6]
    assert {**first, **second} == whole
