"""A run stopped after N updates and resumed from checkpoint_last.pt follows the uninterrupted run exactly:
same logged losses and bit-identical parameters after the last update (same seed, same data order)."""

import pytest
import torch

from .helpers import family_train_args, run, train_command, train_log, trained_families

FAMILIES = trained_families()


def train(corpus_bin, save_dir, arch, max_update):
    extra = ["--dropout", "0.2", *family_train_args(arch)]  # dropout on: its RNG must be restored too
    proc = run(train_command(corpus_bin, save_dir, arch, max_update=max_update, extra=extra))
    return {int(r["num_updates"]): r["loss"] for r in train_log(proc.stdout)}


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_follows_the_uninterrupted_run(family, corpus_bin, tmp_path):
    arch = f"{family}_e6d6"
    whole = train(corpus_bin, tmp_path / "whole", arch, max_update=6)
    first = train(corpus_bin, tmp_path / "split", arch, max_update=3)
    second = train(corpus_bin, tmp_path / "split", arch, max_update=6)
    assert sorted(first) == [1, 2, 3] and sorted(second) == [4, 5, 6]
    assert {**first, **second} == whole

    a = torch.load(tmp_path / "whole" / "checkpoint_last.pt")["model"]
    b = torch.load(tmp_path / "split" / "checkpoint_last.pt")["model"]
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ after resuming: {different[:5]}"
