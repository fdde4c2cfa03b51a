"""fairseq's own distributed data parallel training, with 2 CPU processes on gloo (the launcher fairseq
uses on GPUs counts CUDA devices, so each rank is started by hand with --distributed-no-spawn): for every
family, the losses match a single-process run over the same total batch (--update-freq 2), which also
shows that no gradient is lost or counted twice (tied weights, extra modules)."""

import os
import subprocess

import pytest

from fairseq_plugins.models import PRESETS

from .helpers import REPO, family_train_args, free_port, run, train_command, train_log

# the plugin's families; the baselines are fairseq's own transformer, which the plugin does not touch
FAMILIES = sorted({p.family for p in PRESETS.values() if f"{p.family}_e6d6" in PRESETS and p.model != "transformer"})
UPDATES = 4


def run_ranks(cmd, world_size=2):
    port = free_port()
    dist = ["--distributed-world-size", str(world_size), "--distributed-backend", "gloo",
            "--distributed-no-spawn", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
            "--ddp-backend", "legacy_ddp"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [str(c) for c in [*cmd, *dist, "--distributed-rank", str(rank)]], cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for rank in range(world_size)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{out[-4000:]}"
    return outputs[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_two_process_ddp_matches_single_process(family, corpus_bin, tmp_path):
    arch = f"{family}_e6d6"
    # no dropout: each rank draws its own masks, so only a deterministic model can match exactly
    extra = ["--dropout", "0", "--max-tokens", "500", *family_train_args(arch)]
    single = run(train_command(corpus_bin, tmp_path / "single", arch, UPDATES, [*extra, "--update-freq", "2"]))
    ddp = run_ranks(train_command(corpus_bin, tmp_path / "ddp", arch, UPDATES, extra))
    single_log, ddp_log = train_log(single.stdout), train_log(ddp)
    assert [int(r["num_updates"]) for r in ddp_log] == list(range(1, UPDATES + 1))
    for a, b in zip(single_log, ddp_log, strict=True):
        assert a["wpb"] == b["wpb"], "the two runs must see the same total batch"
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), abs=2e-3), (a, b)
        assert float(a["gnorm"]) == pytest.approx(float(b["gnorm"]), rel=1e-3, abs=2e-3), (a, b)
