"""A run stopped after N updates and resumed from checkpoint_last.pt follows the uninterrupted run exactly:
same logged losses and bit-identical parameters after the last update (same seed, same data order). For CI's
trained families and for the first two combinations of the covering sample of the axes grid (``residual_axes``;
tests/grid_sample.py: those adding the most axis choices CI's families do not hold); every family and the whole
grid with ALL_FAMILIES=1.

Every run is fairseq-train's own entry point; the runs of one kind share a process (tests/one_process.py, forked
from the fork server: conftest.py in_one_forked_process): one process runs every uninterrupted run, a second every
first half, a third every resumed half, so a resumed run always starts in a process that did not write its
checkpoint, as after a real stop."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from .grid_sample import axis_flags, combo_id, family_choices, grid_sample
from .helpers import family_train_args, train_command, train_log, trained_families
from .one_process import Run

FAMILIES = trained_families()
# two combinations in CI (each costs a family's runs); all with ALL_FAMILIES=1
GRID = grid_sample(covered=family_choices(f"{family}_e6d6" for family in FAMILIES), limit=2)

CONFIGS = [(f"{family}_e6d6", ()) for family in FAMILIES] + [("residual_axes", tuple(axis_flags(c))) for c in GRID]
IDS = FAMILIES + [combo_id(c) for c in GRID]
EPOCHS = "update_epoch_batch_itr"  # the case resumed inside epoch 2 (--update-epoch-batch-itr True)
EMPTY = "empty_last_checkpoint"  # the case whose checkpoint_last.pt is emptied before resuming


@dataclass
class Case:
    """One uninterrupted run (``whole``) and the same run stopped after ``split`` updates and resumed."""

    arch: str
    extra: list
    total: int
    split: int | None  # None: chosen from the uninterrupted run's log
    runs: dict[str, Run] = field(default_factory=dict)  # whole, first, second
    interval_checkpoint_written: bool = False  # EMPTY: checkpoint_1_3.pt existed when checkpoint_last.pt was emptied

    def command(self, save_dir: Path, max_update: int, corpus_bin) -> tuple[str, list]:
        return "train", train_command(corpus_bin, save_dir, self.arch, max_update=max_update, extra=self.extra)[3:]

    def log(self, name: str) -> list[dict]:
        assert name in self.runs, f"no {name} run: its process failed (the error is on the first test of its set)"
        return train_log(self.runs[name].check().output)


def losses(case: Case, name: str) -> dict:
    return {int(r["num_updates"]): r["loss"] for r in case.log(name)}


# cases per set of three processes: CI's all at once; with ALL_FAMILIES=1 (hundreds of cases) the set of the case a
# test asks for runs in that test's time (conftest.py's limit per test), not all of them before the first test
CHUNK = 12


class Cases:
    """case id -> Case, its three runs made on first use, with the cases next to it in ``order``."""

    def __init__(self, corpus_bin, root: Path, run_in_one_process):
        self.corpus_bin, self.root, self.run_in_one_process = corpus_bin, root, run_in_one_process
        self.cases = {
            EPOCHS: Case("transformer_preln_e6d6", ["--dropout", "0.2", "--update-epoch-batch-itr", "True"], 12, None),
            EMPTY: Case("transformer_preln_e6d6", ["--dropout", "0.2", "--save-interval-updates", "3"], 6, 3),
        }
        for id_, (arch, axes) in zip(IDS, CONFIGS, strict=True):  # dropout on: its RNG must be restored too
            self.cases[id_] = Case(arch, ["--dropout", "0.2", *family_train_args(arch), *axes], 6, 3)
        self.order, self.started = list(self.cases), set()

    def __getitem__(self, id_: str) -> Case:
        if id_ not in self.started:
            start = self.order.index(id_) // CHUNK * CHUNK
            chunk = {i: self.cases[i] for i in self.order[start : start + CHUNK]}
            self.started.update(chunk)
            self.run(chunk)
        return self.cases[id_]

    def batch(self, name: str, cases: dict[str, Case], updates) -> None:
        """Run ``name`` (whole, first or second) of every case in one process."""
        commands = [case.command(self.root / id_ / ("whole" if name == "whole" else "split"), updates(case),
                                 self.corpus_bin) for id_, case in cases.items()]  # fmt: skip
        for case, run in zip(cases.values(), self.run_in_one_process(commands), strict=True):
            case.runs[name] = run

    def run(self, cases: dict[str, Case]) -> None:
        self.batch("whole", cases, lambda case: case.total)
        epochs = cases.get(EPOCHS)
        if epochs and epochs.runs["whole"].returncode == 0:  # split at epoch 2's first update: resumed inside it
            epochs.split = next((int(r["num_updates"]) for r in epochs.log("whole") if int(r["epoch"]) == 2), None)
        ready = {id_: case for id_, case in cases.items() if case.split is not None}
        self.batch("first", ready, lambda case: case.split)
        if EMPTY in cases:
            split = self.root / EMPTY / "split"
            cases[EMPTY].interval_checkpoint_written = (split / "checkpoint_1_3.pt").exists()
            if (split / "checkpoint_last.pt").exists():
                (split / "checkpoint_last.pt").write_bytes(b"")
        self.batch("second", ready, lambda case: case.total)


@pytest.fixture(scope="module")
def cases(corpus_bin, tmp_path_factory, in_one_forked_process):
    return Cases(corpus_bin, tmp_path_factory.mktemp("resume"), in_one_forked_process)


@pytest.mark.parametrize("id_", IDS)
def test_resume_follows_the_uninterrupted_run(id_, cases):
    root, case = cases.root, cases[id_]
    whole, first, second = losses(case, "whole"), losses(case, "first"), losses(case, "second")
    assert sorted(first) == [1, 2, 3] and sorted(second) == [4, 5, 6]
    assert {**first, **second} == whole

    a = torch.load(root / id_ / "whole" / "checkpoint_last.pt")["model"]
    b = torch.load(root / id_ / "split" / "checkpoint_last.pt")["model"]
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resuming: {different[:5]}"


def test_resume_after_the_first_epoch_is_exact_with_update_epoch_batch_itr(cases):
    """fairseq builds the batches under the seed of the epoch its iterator is built in and an uninterrupted run keeps
    epoch 1's, so a run resumed in a later epoch trains on other batches; --update-epoch-batch-itr True rebuilds the
    iterator every epoch, and the resumed run is exact (docs/study_tool.md)."""
    case = cases[EPOCHS]

    def log(name):
        return {int(r["num_updates"]): (r["loss"], r["epoch"]) for r in case.log(name)}

    whole = log("whole")
    epoch_two = [u for u, (_, epoch) in whole.items() if epoch == 2]
    assert len(epoch_two) >= 2  # split at epoch 2's first update: the resumed run continues inside epoch 2
    assert case.split == epoch_two[0]
    first, second = log("first"), log("second")
    assert {u: loss for u, (loss, _) in {**first, **second}.items()} == {u: loss for u, (loss, _) in whole.items()}


def test_an_empty_last_checkpoint_resumes_exactly_from_the_newest_intact_one(cases):
    """A save killed while fairseq copied it to checkpoint_last.pt (by a run without the plugin's atomic copy)
    leaves that file empty: the same command resumes from the newest intact checkpoint (the save's own file,
    checkpoint_1_3.pt, or checkpoint_best.pt, copied from it after it), names it in one line, and follows the
    uninterrupted run exactly."""
    root, case = cases.root, cases[EMPTY]
    whole, first, second = losses(case, "whole"), losses(case, "first"), losses(case, "second")
    assert case.interval_checkpoint_written
    split = root / EMPTY / "split"
    lines = [line for line in case.runs["second"].output.splitlines() if "truncated or corrupt; resuming from" in line]
    newest = [f"{split / name}, the newest intact" for name in ("checkpoint_1_3.pt", "checkpoint_best.pt")]
    assert len(lines) == 1 and any(name in lines[0] for name in newest), lines
    assert sorted(first) == [1, 2, 3] and sorted(second) == [4, 5, 6]
    assert {**first, **second} == whole
