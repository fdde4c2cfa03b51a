"""Shared by the study tool's tests (test_study*.py): the tiny models and the recipe runner."""

import contextlib
import json
import os
import subprocess
import sys
import tempfile

import pytest

from .helpers import REPO, TINY, run

slow = pytest.mark.skipif(os.environ.get("RECIPE_TESTS") == "fast", reason="slow recipe test (RECIPE_TESTS=fast)")
# the fixtures' dev/test sets are smaller than fairseq's default batch multiple (8): keep every sentence
MODEL_ARGS = " ".join([*TINY, "--required-batch-size-multiple", "1"])


def recipe(name: str, env: dict, check: bool = True):
    return run(["bash", REPO / "recipes" / name], env={"RECIPE_PYTHON": sys.executable, **env}, check=check, timeout=900)


def recipes_side_by_side(*calls: tuple[str, dict], check: bool = True) -> list[subprocess.CompletedProcess]:
    """recipe() for each (name, env) at the same time: studies that do not depend on each other (each its own OUT_DIR)
    overlap their one-process phases (start-up, data, validation checks, report), which otherwise leave a core idle.
    Every process has ended when this returns (a failing or timed-out one does not leave the others running)."""
    full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", RECIPE_PYTHON=sys.executable)
    full.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # as helpers.run
    started, done = [], []
    with contextlib.ExitStack() as files:
        try:
            for name, env in calls:
                out, err = (files.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8")) for _ in range(2))
                cmd = ["bash", str(REPO / "recipes" / name)]  # output to files: no pipe to fill up while waiting
                started.append((subprocess.Popen(cmd, cwd=REPO, env={**full, **env}, stdout=out, stderr=err), out, err))
            for proc, _, _ in started:
                proc.wait(timeout=900)
        finally:
            for proc, _, _ in started:
                if proc.poll() is None:
                    proc.terminate()  # SIGTERM: the study stops its runs
            for proc, _, _ in started:
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for proc, out, err in started:
            out.seek(0), err.seek(0)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))
    for proc in done if check else []:
        assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return done


def log_record(stamp: str, kind: str, updates: int, loss: float) -> str:
    """One line of fairseq's JSON log (train.log) at 00:``stamp`` of 2026-01-01."""
    key = {"train_inner": ("num_updates", "loss"), "valid": ("valid_num_updates", "valid_loss")}[kind]
    return f"2026-01-01 00:{stamp} | INFO | {kind} | " + json.dumps({key[0]: str(updates), key[1]: str(loss)})


class Finished:
    """A training or evaluation process that has already ended with ``status``, having written ``files``."""

    def __init__(self, log_file, status: int, files: dict):
        self.log_file, self.status, self.files = log_file, status, files

    def poll(self):
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.files = {}
        return self.status

    def stop(self):
        pass
