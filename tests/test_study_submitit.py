"""The study tool's grid through submitit (scripts/study/study_submitit.py, EXECUTOR=submitit-local|slurm).

End to end with submitit's LocalExecutor (real job processes, tiny models, 4 updates): a 2-architecture x 2-seed
grid reports exactly what the local path reports for the same runs; a job preempted as SLURM preempts (USR2, the
test hook) is requeued by submitit and continues its run from checkpoint_last.pt, while a run whose training fails
is named and its later seed reported as waiting; for SLURM, DRY_RUN prints the sbatch script of the array (partition,
GPUs, CPUs, memory, time, array lines) and submits nothing. The settings' checks run in-process.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from submitit.core.utils import UncompletedJobError

from scripts.study import study, study_common, study_logs, study_run, study_submitit

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked  # noqa: F401  (a fixture)
from .helpers import REPO
from .study_fixtures import MODEL_ARGS, recipe, recipes_side_by_side, slow

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")

PRELN, RESIDUAL = "transformer_preln_e6d6", "residual_e6d6"
# what differs between two studies of the same runs: when they ran (results.json; curves' points lose their seconds)
TIMING = {"seconds", "train_seconds", "train_seconds_std", "reach_seconds", "started", "finished", "total_minutes"}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """Multi30k fixtures prepared once (the studies below get it as DATA_BIN)."""
    root = tmp_path_factory.mktemp("submitit_data")
    fx.make_multi30k(root / "raw")
    cmd = [sys.executable, "-m", "scripts.data.prepare_multi30k", "--src", "de", "--tgt", "en", "--work-dir",
           root / "work", "--dest-dir", root / "data-bin", "--train-lines", "0", "--vocab-size", "100", "--raw-dir",
           root / "raw", "--no-verify-counts"]  # fmt: skip
    subprocess.run([str(c) for c in cmd], cwd=REPO, check=True, capture_output=True)
    return root / "data-bin"


def _env(data_bin, out, **more) -> dict:
    return {"DATA_BIN": str(data_bin), "OUT_DIR": str(out), "ARCHS": f"{PRELN} {RESIDUAL}", "SEEDS": "1 2",
            "MAX_UPDATE": "4", "VALID_EVERY": "2", "BOOTSTRAP": "20", "MODEL_ARGS": MODEL_ARGS, "THREADS": "1", **more}  # fmt: skip


def _without_timing(value):
    if isinstance(value, dict):
        return {k: ([p[::2] for p in v] if k in ("train", "valid") and v and isinstance(v[0], list) else _without_timing(v))
                for k, v in value.items() if k not in TIMING}  # fmt: skip
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _report(out) -> dict:
    """results.json with OUT_DIR as "OUT" (the runs' commands name their save directory) and without timing."""
    report = json.loads((out / "results.json").read_text().replace(str(out), "OUT"))
    report.pop("command")  # the variables the user set: the executor's among them
    # runs are listed in the order they finished, which two runs side by side settle by timing, on either path
    report["runs"] = sorted(report["runs"], key=lambda r: r["name"])
    return _without_timing(report)


@slow
def test_grid_through_submitit_reports_as_the_local_path(data_bin, tmp_path):
    # the two studies side by side (each its own OUT_DIR): neither waits for the other's one-process phases
    local, jobs = recipes_side_by_side(("study.sh", _env(data_bin, tmp_path / "local", JOBS="4")),
                                       ("study.sh", _env(data_bin, tmp_path / "submitit", EXECUTOR="submitit-local")))  # fmt: skip
    # the first seeds as one array, the second seeds as another once their model's setting is chosen
    assert jobs.stdout.count("submitted 2 run(s) as a job array") == 2, jobs.stdout[-3000:] + jobs.stderr[-3000:]
    runs = tmp_path / "submitit" / "runs"
    assert len(list(runs.glob("*/DONE.json"))) == 4 and len(list(runs.glob("*/eval/results.json"))) == 4
    # each run was one submitit job with a result, and every one trained once, as on the local path
    assert len(list((tmp_path / "submitit" / "submitit").glob("*_result.pkl"))) == 4
    assert all(study_logs.read_curves(log)["attempts"] == 1 for log in runs.glob("*/train.log"))
    commands = [json.loads((tmp_path / name / "results.json").read_text())["command"] for name in ("local", "submitit")]
    assert "EXECUTOR=submitit-local" in commands[1] and "EXECUTOR" not in commands[0]
    local_report, submitit_report = _report(tmp_path / "local"), _report(tmp_path / "submitit")
    assert len(local_report["runs"]) == 4 and local_report["settings"]["jobs"] == 4
    assert submitit_report == local_report
    assert local.stdout.splitlines()[-1].startswith("[study] done in")


@slow
def test_a_preempted_job_is_requeued_and_resumes_and_a_failed_run_is_named(data_bin, tmp_path):
    """The Pre-LN run's job is preempted at update 2 (the test hook signals USR2 as SLURM does) and requeued by
    submitit; residual's training fails (its checkpoint directory cannot be made), so its seed 2 never starts."""
    out = tmp_path / "out"
    failing = out / "runs" / f"{RESIDUAL}.warmup.lr0.001.wu400.s1"
    failing.mkdir(parents=True)
    (failing / "checkpoints").write_text("not a directory")
    proc = recipe("study.sh", _env(data_bin, out, EXECUTOR="submitit-local", SEEDS="1", STUDY_INTERRUPT_AT="0:2"),
                  check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"1 of 2 runs failed (training {failing.name} failed (exit 1); see {failing / 'train.log'})" in proc.stderr
    assert "the partial report (results.md) covers the others" in proc.stderr
    resumed = out / "runs" / f"{PRELN}.warmup.lr0.001.wu400.s1"
    assert study_run.INTERRUPTED in (resumed / "train.log").read_text()  # the hook stopped this run's first attempt
    curves = study_logs.read_curves(resumed / "train.log")
    assert curves["attempts"] == 2 and [u for u, _, _ in curves["train"]] == [1, 2, 3, 4]
    assert "(epoch 3 @ 2 updates)" in (resumed / "train.log").read_text()  # continued from its checkpoint_last.pt
    provenance = json.loads((resumed / "provenance.json").read_text())
    assert [a["resumed_from"] for a in provenance] == [None, {"checkpoint": "checkpoint_last.pt", "update": 2}]
    logs = "".join(p.read_text() for p in (out / "submitit").glob("*_log.*"))
    assert "this job is preempted" in logs and "Requeued job" in logs  # submitit's own checkpoint-and-requeue
    report = json.loads((out / "results.json").read_text())
    assert [(r["arch"], r["updates"]) for r in report["runs"]] == [(PRELN, 4)] and report["missing"] == [failing.name]


class _JobsHere:
    """submitit's executor as study_submitit uses it, running each submitted job's callable (RunJob: the run's real
    fairseq-train, evaluation and records) in this process when submitted, instead of in a job process of its own."""

    def __init__(self):
        self.arrays: list[list[str]] = []

    def submit_array(self, fns):
        self.arrays.append([fn.run.name for fn in fns])
        return [_FinishedJob(f"{len(self.arrays)}_{index}", fn()) for index, fn in enumerate(fns)]


class _FinishedJob:
    def __init__(self, job_id: str, outcome: dict):
        self.job_id, self.outcome = job_id, outcome

    def done(self, force_check=False):
        return True

    def result(self):
        return self.outcome


@slow
def test_later_seeds_waiting_for_a_failed_tuning_run_are_named(data_bin, tmp_path, monkeypatch):
    """A tuning run failing in its job: its model's later seed is never submitted, and named as waiting. The jobs run
    here (their submitit processes, and a real job's failure, are the preemption test's); the study is study.main."""
    out = tmp_path / "out"
    failing = out / "runs" / f"{RESIDUAL}.warmup.lr0.001.wu400.s1"
    failing.mkdir(parents=True)
    (failing / "checkpoints").write_text("not a directory")
    executor = _JobsHere()
    monkeypatch.setattr(study_submitit, "make_executor", lambda args, script_only=False: executor)
    monkeypatch.delenv(study_run.INTERRUPT_HOOK, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # study_submitit._submit sets it for its jobs
    argv = ["--data-bin", str(data_bin), "--out-dir", str(out), "--archs", RESIDUAL, "--seeds", "1 2", "--max-update",
            "4", "--valid-every", "2", "--bootstrap", "20", "--model-args", MODEL_ARGS, "--threads", "1",
            "--executor", "submitit-local"]  # fmt: skip
    try:  # study.main silences fairseq's logging below errors for its console: restored for the other tests
        with pytest.raises(study_common.RecipeError) as err:
            study.main(argv)
    finally:
        logging.disable(logging.NOTSET)
    assert f"1 of 2 runs failed (training {failing.name} failed (exit 1)" in str(err.value)
    assert f"not started, waiting for their model's failed tuning run: {RESIDUAL} seed 2" in str(err.value)
    assert executor.arrays == [[failing.name]]  # the later seed was never submitted
    assert not (out / "runs" / f"{RESIDUAL}.warmup.lr0.001.wu400.s2").exists()


@slow
def test_stopping_the_study_cancels_its_jobs(data_bin, tmp_path):
    """SIGTERM (as Ctrl-C) stops the study's submitit jobs and their fairseq processes, as the local path stops its
    runs, also where a background shell started the study with SIGINT ignored (the jobs inherit that)."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RECIPE_PYTHON": sys.executable,
           **_env(data_bin, out, EXECUTOR="submitit-local", SEEDS="1", MAX_UPDATE="100000")}  # fmt: skip
    # trap '' INT: SIGINT ignored, as in a script's background job; the recipe execs the study in the same process
    proc = subprocess.Popen(["bash", "-c", f"trap '' INT; exec bash {REPO / 'recipes' / 'study.sh'}"], cwd=REPO, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    # both jobs' fairseq-train running (VALID_EVERY=2: a train_inner record at every update, from the first on)
    deadline = time.time() + 600
    while time.time() < deadline and sum("| train_inner |" in p.read_text() for p in out.glob("runs/*/train.log")) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted: run the same command again" in stdout, stdout[-3000:]

    def left() -> list[str]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(out) in text:  # the study, submitit's controllers and jobs, fairseq-train (--save-dir)
                found.append(text)
        return found

    deadline = time.time() + 60
    while left() and time.time() < deadline:
        time.sleep(0.2)
    assert not left()


def test_slurm_dry_run_prints_the_sbatch_script_and_submits_nothing(data_bin, tmp_path):
    out = tmp_path / "out"
    env = _env(data_bin, out, EXECUTOR="slurm", DRY_RUN="1", PARTITION="gpu", GPUS_PER_RUN="1", CPUS_PER_TASK="6",
               MEM="32G", TIME_LIMIT="90", ARRAY_PARALLELISM="2", SLURM_ARGS="account=abc qos=high", LRS="1e-3 2e-3")  # fmt: skip
    proc = recipe("study.sh", env)
    script = proc.stdout.split("# the sbatch script of the tuning runs' job array\n", 1)[1]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=6",
                 "#SBATCH --mem=32G", "#SBATCH --time=90", "#SBATCH --array=0-3%2", "#SBATCH --account=abc",
                 "#SBATCH --qos=high", "#SBATCH --signal=USR2@90", "export PYTHONPATH=", "-m submitit.core._submit"):  # fmt: skip
        assert line in script, script
    # 2 models x 2 lrs with the first seed in the array; the second seed's runs wait for their model's choice
    assert script.count("# array task ") == 4 and "# later, residual_e6d6.warmup.s2 (at its first seed's choice)" in script
    task = script.split(f"# array task 0: {PRELN}.warmup.lr0.001.wu400.s1\n", 1)[1].splitlines()[0]
    assert "fairseq_cli.train" in task and "--cpu" not in task.split()  # GPUS_PER_RUN: trained on the job's GPU
    assert not (out / "submitit").exists() and not (out / "runs").exists()  # nothing submitted


# ------------------------------------------------------------------------------------------- in-process


def _error(argv) -> str:
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args(argv)
    return str(err.value)


def test_executor_settings_are_checked_and_name_the_variable(monkeypatch):
    base = ["--archs", PRELN, "--seeds", "1", "--max-update", "4"]
    assert _error([*base, "--executor", "pbs"]) == "EXECUTOR (--executor)='pbs': allowed local, submitit-local, slurm"
    assert _error([*base, "--partition", "gpu"]).startswith("PARTITION (--partition) is read with EXECUTOR=slurm only, "
                                                            "not EXECUTOR=local")  # fmt: skip
    assert _error([*base, "--executor", "submitit-local", "--mem", "8G"]).startswith("MEM (--mem) is read with EXECUTOR=slurm")
    assert "drop JOBS" in _error([*base, "--executor", "submitit-local", "--jobs", "2"])
    assert _error([*base, "--executor", "slurm", "--dry-run", "--mem", "lots"]).startswith("MEM (--mem)='lots': allowed")
    assert "is not KEY=VALUE" in _error([*base, "--executor", "slurm", "--dry-run", "--slurm-args", "--account abc"])
    assert _error([*base, "--executor", "slurm", "--dry-run", "--time-limit", "0"]) == "TIME_LIMIT (--time-limit)=0: must be >= 1"
    monkeypatch.setattr(study_submitit.shutil, "which", lambda name: None)
    assert _error([*base, "--executor", "slurm"]).startswith("EXECUTOR=slurm: no sbatch on this machine")
    args = study.parse_args([*base, "--executor", "slurm", "--dry-run", "--seeds", "1 2 3", "--array-parallelism", "2"])
    assert (args.jobs, args.threads, args.cpus_per_task, args.gpus_per_run) == (2, study_submitit.CPUS_PER_TASK,
                                                                                study_submitit.CPUS_PER_TASK, 0)  # fmt: skip


class _KilledJob:
    """A submitit job that ended without a result (killed by the out-of-memory killer, scancel, a lost node)."""

    job_id = "4242_1"

    class paths:  # as submitit's job.paths
        stdout = "/cluster/out/submitit/4242_1_0_log.out"

    def result(self):
        raise UncompletedJobError("Job 4242_1 (task: 0) with path ... has not produced any output (state: OUT_OF_MEMORY)")


def test_a_job_without_result_fails_its_run_by_name(tmp_path, capsys):
    args = study.parse_args(["--archs", PRELN, "--seeds", "1", "--max-update", "4", "--out-dir", str(tmp_path)])
    runner = study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})
    run = study_run.grid(args)[0][0]
    study_submitit.collect(runner, run, _KilledJob())
    assert runner.failed[run] == (f"the job of {run.name} (4242_1) ended without a result (Job 4242_1 (task: 0) with "
                                  "path ... has not produced any output (state: OUT_OF_MEMORY)); see "
                                  "/cluster/out/submitit/4242_1_0_log.out")  # fmt: skip
    assert f"[study] error: the job of {run.name}" in capsys.readouterr().out


def test_a_slurm_job_still_queued_from_before_is_waited_for_not_submitted_again(tmp_path, monkeypatch):
    """A study process lost with its login session leaves its SLURM jobs running: the same command run again waits
    for a run's recorded job while it is pending or running, and submits only the runs whose job has ended."""
    args = study.parse_args(["--archs", f"{PRELN} {RESIDUAL}", "--seeds", "1", "--max-update", "4", "--executor", "slurm",
                             "--dry-run", "--out-dir", str(tmp_path)])  # fmt: skip
    runner = study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})
    queued, ended = study_run.grid(args)[0]
    study_common.write_json(tmp_path / "submitit" / "jobs.json", {queued.name: "77_0", ended.name: "77_1"})

    class SlurmJob:
        def __init__(self, folder, job_id):
            self.job_id = job_id

        def done(self, force_check=False):
            return self.job_id == "77_1"

    monkeypatch.setattr(study_submitit.submitit, "SlurmJob", SlurmJob)
    jobs: dict = {}
    assert study_submitit._still_queued(runner, [queued, ended], jobs) == [ended]
    assert [(job.job_id, run) for job, run in jobs.items()] == [("77_0", queued)] and list(runner.train) == [queued]
