"""A study's grid through submitit (scripts/study/study.py, EXECUTOR=submitit-local or slurm; docs/study_tool.md).

EXECUTOR=local (the default) is study_run.Study.execute: JOBS processes on this machine. With submitit every run's
training and evaluation is ONE submitit job, and a job is study_run.Study.execute for that run alone (RunJob): the
same fairseq-train command, the same resume from the run's checkpoint_last.pt, the same early stopping across
resumes, the same DONE.json, evaluation and validation check; the report is then written from those records by the
same code as the local path's. The tuning runs go out as one job array (SLURM's ``--array=0-N%ARRAY_PARALLELISM``);
a later seed is submitted once its model's tuning jobs are done and its setting is chosen, the later seeds known
at that moment as one more array. The parent waits on submitit's own futures (``helpers.as_completed``,
``job.result()``): no pool or scheduler of its own.

- ``slurm``: submitit's SlurmExecutor, with PARTITION, GPUS_PER_RUN, CPUS_PER_TASK, MEM, TIME_LIMIT,
  ARRAY_PARALLELISM and SLURM_ARGS. SLURM signals a job (USR2) before its time limit or on preemption; submitit
  then calls RunJob.checkpoint (helpers.Checkpointable's: the same callable again) and requeues it, and the
  requeued job continues from the run's checkpoint_last.pt exactly as a rerun of the local path does.
- ``submitit-local``: submitit's LocalExecutor, every job a process of this machine, all jobs of an array at once
  (it has no array parallelism), requeued the same way (at TIME_LIMIT, or on USR2).

DRY_RUN=1 prints what would be submitted (for slurm the sbatch script of the array, made by SlurmExecutor's own
script generation, and each array task's run and fairseq-train command) and submits nothing.

Test hook: with STUDY_INTERRUPT_AT=RUNS:UPDATES (study_run's), the first job to start training once RUNS runs are
done trains to UPDATES and then signals itself USR2, as SLURM does at a time limit or preemption: submitit's
checkpoint-and-requeue path runs for real, and the requeued job must continue from the checkpoint.
"""

import json
import os
import re
import shlex
import shutil
import signal
import sys
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError
from submitit.helpers import Checkpointable, as_completed

from scripts.study.study_common import RecipeError, Run, write_json
from scripts.study.study_run import INTERRUPT_HOOK, Study

EXECUTORS = ("local", "submitit-local", "slurm")
# option -> (variable, the executors that read it): any other executor refuses it
OPTIONS = {
    "partition": ("PARTITION", ("slurm",)),
    "gpus_per_run": ("GPUS_PER_RUN", ("submitit-local", "slurm")),
    "cpus_per_task": ("CPUS_PER_TASK", ("slurm",)),
    "mem": ("MEM", ("slurm",)),
    "time_limit": ("TIME_LIMIT", ("submitit-local", "slurm")),
    "array_parallelism": ("ARRAY_PARALLELISM", ("slurm",)),
    "slurm_args": ("SLURM_ARGS", ("slurm",)),
}
ENV_VARS = ("EXECUTOR", *(variable for variable, _ in OPTIONS.values()))
SLURM_TIME_LIMIT = 240  # minutes: SLURM stops a job there, and submitit requeues it (it resumes from its checkpoint)
LOCAL_TIME_LIMIT = 7 * 24 * 60  # submitit-local without TIME_LIMIT: no limit in practice (LocalExecutor's is 2 min)
CPUS_PER_TASK = 8
POLL_SECONDS = {"submitit-local": 0.5, "slurm": 15.0}  # how often as_completed asks submitit whether a job is done
_MEM = re.compile(r"^\d+[KMGT]?B?$")
_SLURM_ARG = re.compile(r"^[a-z][a-z0-9_-]*=\S+$")
_HOOK_MARK = "interrupt_hook"  # created by the one job the test hook stops (O_EXCL: exactly one, never again)


def add_options(p) -> None:
    p.add_argument("--executor", default="local",
                   help="EXECUTOR: local (this machine, JOBS runs x THREADS threads), submitit-local (every run a submitit "
                        "job on this machine) or slurm (the runs as SLURM job arrays through submitit; docs/study_tool.md)")  # fmt: skip
    p.add_argument("--partition", default=None, help="PARTITION: the SLURM partition (default: the cluster's)")
    p.add_argument("--gpus-per-run", type=int, default=None,
                   help="GPUS_PER_RUN: GPUs of one node per run; > 0 trains and evaluates on them (no --cpu; several: "
                        "fairseq's data parallelism on that node) (default 0: the CPU, as the local path)")  # fmt: skip
    p.add_argument("--cpus-per-task", type=int, default=None,
                   help=f"CPUS_PER_TASK: CPUs per run (default THREADS, else {CPUS_PER_TASK}); THREADS defaults to it")
    p.add_argument("--mem", default=None, help="MEM: memory per run as sbatch --mem takes it, e.g. 32G (default: the cluster's)")
    p.add_argument("--time-limit", type=int, default=None,
                   help=f"TIME_LIMIT: minutes per job; at the limit the job is requeued and continues from its checkpoint "
                        f"(default {SLURM_TIME_LIMIT} with slurm, none with submitit-local)")  # fmt: skip
    p.add_argument("--array-parallelism", type=int, default=None,
                   help="ARRAY_PARALLELISM: runs of a job array running at once (sbatch --array=...%%N; default: all)")
    p.add_argument("--slurm-args", default=None,
                   help="SLURM_ARGS: more sbatch options, space-separated KEY=VALUE (e.g. 'account=abc qos=high "
                        "constraint=a100'; default none)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="DRY_RUN=1: print the job scripts (slurm: the sbatch script) and the runs' commands; submit nothing")


def validate(args, runs: int, cores: int) -> None:
    """The executor's settings, checked with the others before anything is prepared; for a submitit executor also
    JOBS and THREADS, which the local path derives from the cores of this machine."""
    if args.executor not in EXECUTORS:
        raise RecipeError(f"EXECUTOR (--executor)={args.executor!r}: allowed {', '.join(EXECUTORS)}")
    for name, (variable, readers) in OPTIONS.items():
        if getattr(args, name) is not None and args.executor not in readers:
            raise RecipeError(f"{variable} (--{name.replace('_', '-')}) is read with EXECUTOR={' or '.join(readers)} "
                              f"only, not EXECUTOR={args.executor}: drop it or choose that executor")  # fmt: skip
    if args.dry_run and args.report_only:
        raise RecipeError("DRY_RUN and REPORT_ONLY are both set: DRY_RUN shows the jobs of a training, REPORT_ONLY "
                          "reports without one; set one of them")  # fmt: skip
    if args.executor == "local":
        return
    if args.jobs:
        raise RecipeError(f"JOBS (--jobs)={args.jobs} schedules runs on this machine (EXECUTOR=local); with "
                          f"EXECUTOR={args.executor} " + ("ARRAY_PARALLELISM sets how many run at once" if
                          args.executor == "slurm" else "every job of an array starts at once") + ": drop JOBS")  # fmt: skip
    for name, low in (("gpus_per_run", 0), ("cpus_per_task", 1), ("time_limit", 1), ("array_parallelism", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            raise RecipeError(f"{OPTIONS[name][0]} (--{name.replace('_', '-')})={value}: must be >= {low}")
    if args.mem is not None and not _MEM.match(args.mem):
        raise RecipeError(f"MEM (--mem)={args.mem!r}: allowed a number with an optional unit K, M, G or T, e.g. 32G")
    args.slurm_extra = {}
    for token in (args.slurm_args or "").split():
        if not _SLURM_ARG.match(token):
            raise RecipeError(f"SLURM_ARGS (--slurm-args)={args.slurm_args!r}: {token!r} is not KEY=VALUE (an sbatch "
                              "long option without its dashes, e.g. account=abc)")  # fmt: skip
        key, value = token.split("=", 1)
        args.slurm_extra[key.replace("_", "-")] = value
    slurm = args.executor == "slurm"
    if slurm and not args.dry_run and shutil.which("sbatch") is None:
        raise RecipeError("EXECUTOR=slurm: no sbatch on this machine (run it on a SLURM login node; EXECUTOR=submitit-local "
                          "runs the same jobs here, DRY_RUN=1 shows the sbatch script)")  # fmt: skip
    args.gpus_per_run = args.gpus_per_run or 0
    args.cpus_per_task = args.cpus_per_task or args.threads or CPUS_PER_TASK
    args.array_parallelism = min(runs, args.array_parallelism or runs)
    args.jobs = args.array_parallelism if slurm else runs
    args.threads = args.threads or (args.cpus_per_task if slurm else max(1, cores // args.jobs))


# --------------------------------------------------------------------------------------------- the job


class RunJob(Checkpointable):
    """One run's training and evaluation as one submitit job: study_run.Study.execute for that run alone, so that
    the job resumes, stops early, evaluates and records exactly as the local path does. Requeued after a time limit
    or preemption, submitit runs the same callable again (Checkpointable.checkpoint) and Study continues the run from
    its checkpoint_last.pt. Returns {"failed": why or None}; the parent reports a failure by the run's name."""

    def __init__(self, args, data: Path, manifest: dict, run: Run, cwd: str):
        self.args, self.data, self.manifest, self.run, self.cwd = args, data, manifest, run, cwd

    def __call__(self) -> dict:
        os.chdir(self.cwd)  # OUT_DIR and DATA_BIN may be relative to where the study was started
        if os.environ.get("SUBMITIT_EXECUTOR") == "local":
            # a local job is stopped by SIGTERM (_Submitted.stop; its controller forwards it), which submitit's handler
            # would ignore (on SLURM it must: preemption sends it too); SIGINT too, even where a background shell
            # started the study with SIGINT ignored
            signal.signal(signal.SIGTERM, _stopped)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        study = Study(self.args, self.data, self.manifest)
        study.hook = self._hook(study)
        try:
            study.execute([self.run], [])
        except KeyboardInterrupt:
            if not study.interrupted_by_hook:
                raise
            # the test hook: preempted as SLURM preempts (USR2); submitit's handler checkpoints and requeues the job
            signal.raise_signal(submitit.JobEnvironment._usr_sig())
            raise
        finally:  # a requeue (SystemExit from submitit's signal handler) or a cancel leaves no fairseq behind
            for proc in [*study.train.values(), *study.evals.values()]:
                proc.stop()
        return {"failed": study.failed.get(self.run)}

    def _hook(self, study: Study) -> dict | None:
        """study_run's STUDY_INTERRUPT_AT for one job only: jobs run side by side and a requeued job starts afresh, so
        the first to claim the marker file is stopped; every other job, and that one once requeued, is not."""
        value = os.environ.get(INTERRUPT_HOOK)
        if not value:
            return None
        runs, updates = (int(x) for x in value.split(":"))
        if len(list(study.runs_dir.glob("*/DONE.json"))) < runs:
            return None
        try:
            os.close(os.open(self.args.out_dir / "submitit" / _HOOK_MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None
        return {"runs": 0, "updates": updates, "run": None}


def _stopped(*_):
    raise KeyboardInterrupt


class _Submitted:
    """A submitted job where Study keeps its running processes (Study.train): the console shows the run as running,
    and study.py's Ctrl-C / SIGTERM handling, which stops every process there, cancels the job."""

    def __init__(self, job, log_file: Path):
        self.job, self.log_file = job, log_file

    def stop(self) -> None:
        if self.job.done():
            return
        if isinstance(self.job, submitit.LocalJob):  # SIGTERM to its controller (the id is its pid), see RunJob
            os.kill(int(self.job.job_id), signal.SIGTERM)
        else:
            self.job.cancel(check=False)  # scancel


# ------------------------------------------------------------------------------------------ submitting


def _python_path() -> str:
    """The job process unpickles RunJob, so it must import the study's modules (scripts.study.*) as this process
    does: the repository root goes first on its PYTHONPATH."""
    here = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([here, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]])


def slurm_parameters(args) -> dict:
    """SlurmExecutor's parameters: one node and one task per run (several GPUs: fairseq's own processes)."""
    params = {"job_name": args.defaults.tag, "time": args.time_limit or SLURM_TIME_LIMIT, "nodes": 1,
              "ntasks_per_node": 1, "cpus_per_task": args.cpus_per_task, "array_parallelism": args.array_parallelism,
              "stderr_to_stdout": True, "setup": [f"export PYTHONPATH={shlex.quote(_python_path())}"]}  # fmt: skip
    if args.partition:
        params["partition"] = args.partition
    if args.gpus_per_run:
        params["gpus_per_node"] = args.gpus_per_run
    if args.mem:
        params["mem"] = args.mem
    if args.slurm_extra:
        params["additional_parameters"] = dict(args.slurm_extra)
    return params


class _ScriptOnlySlurmExecutor(submitit.SlurmExecutor):
    """SlurmExecutor that only writes sbatch scripts (DRY_RUN): it submits nothing, so it needs no srun here."""

    @classmethod
    def affinity(cls) -> int:
        return 2


def _folder(args) -> Path:
    return args.out_dir / "submitit"  # one folder: LocalExecutor would also make a directory named "%j" literally


def make_executor(args, script_only: bool = False):
    if args.executor == "slurm":
        executor = (_ScriptOnlySlurmExecutor if script_only else submitit.SlurmExecutor)(folder=_folder(args))
        executor.update_parameters(**slurm_parameters(args))
        return executor
    executor = submitit.LocalExecutor(folder=_folder(args))
    params = {"timeout_min": args.time_limit or LOCAL_TIME_LIMIT}
    if args.gpus_per_run:
        params["gpus_per_node"] = args.gpus_per_run
    executor.update_parameters(**params)
    return executor


def _finished(study: Study, run: Run) -> bool:
    return study.is_done(run) and study.is_settled(run)


def _records(study: Study) -> Path:
    return study.args.out_dir / "submitit" / "jobs.json"


def _still_queued(study: Study, runs: list[Run], jobs: dict) -> list[Run]:
    """The runs whose SLURM job from an earlier study process is still pending or running (that process lost, e.g.
    with the login session): waited for, not submitted again, so that two jobs never train one run; returns the
    others. Only SLURM's jobs outlive the study process (LocalExecutor's die with it, Ctrl-C or not)."""
    path = _records(study)
    if study.args.executor != "slurm" or not path.is_file():
        return runs
    recorded = json.loads(path.read_text(encoding="utf-8"))
    others = []
    for run in runs:
        job = submitit.SlurmJob(folder=_folder(study.args), job_id=recorded[run.name]) if run.name in recorded else None
        if job is None or job.done(force_check=True):
            others.append(run)
            continue
        jobs[job] = run
        study.train[run] = _Submitted(job, study.run_dir(run) / "train.log")
        print(f"[{study.args.defaults.tag}] {run.name}: its job {job.job_id} from before is still queued or running; "
              "waiting for it", flush=True)  # fmt: skip
    return others


def _submit(executor, study: Study, runs: list[Run], jobs: dict) -> None:
    """The runs as one job array (one job if alone), each job's id recorded for a later study process."""
    runs = _still_queued(study, runs, jobs)
    if not runs:
        return
    os.environ["PYTHONPATH"] = _python_path()  # LocalExecutor's jobs inherit it; sbatch's setup line exports it too
    cwd = os.getcwd()
    submitted = executor.submit_array([RunJob(study.args, study.data, study.manifest, run, cwd) for run in runs])
    path = _records(study)
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for run, job in zip(runs, submitted, strict=True):
        jobs[job] = run
        recorded[run.name] = job.job_id
        study.train[run] = _Submitted(job, study.run_dir(run) / "train.log")
    write_json(path, recorded)
    print(f"[{study.args.defaults.tag}] submitted {len(runs)} run(s) as {'a job array' if len(runs) > 1 else 'a job'} "
          f"({submitted[0].job_id.split('_')[0]}); submitit's logs in {study.args.out_dir / 'submitit'}", flush=True)  # fmt: skip


def _reason(err: Exception) -> str:
    """The line that says why a job has no result: the exception of its traceback, or submitit's own first line."""
    text = str(err)
    if "----------------------" in text:  # FailedJobError: the job's traceback between two rules
        lines = [line for line in text.split("----------------------")[1].splitlines() if line.strip()]
        return lines[-1].strip() if lines else text.splitlines()[0]
    return text.splitlines()[0] if text else type(err).__name__


def collect(study: Study, run: Run, job) -> None:
    """A finished job: its run's failure, if any, recorded by name as the local path records it."""
    study.train.pop(run, None)
    try:
        outcome = job.result()
    except (UncompletedJobError, FailedJobError) as err:  # killed (out of memory, scancel, a node lost) or crashed
        study._fail(run, f"the job of {run.name} ({job.job_id}) ended without a result ({_reason(err)}); see "
                         f"{job.paths.stdout}")  # fmt: skip
        return
    if outcome.get("failed"):
        study._fail(run, outcome["failed"])


def execute(study: Study, tuning: list[Run], later: list[Run]) -> list[Run]:
    """Study.execute through submitit: returns the runs of the study (tuning and chosen); study.failed and
    study.blocked as the local path leaves them."""
    executor = make_executor(study.args)
    for run in tuning:
        study._check_reusable(run)
    waiting = [run for run in tuning if not _finished(study, run)]
    skipped = len(tuning) - len(waiting)
    total = len(tuning) + len(later)
    jobs: dict = {}
    resolved: dict[Run, Run] = {}
    active: list = []
    while True:
        choices = study._choices(tuning)
        for run in later:
            if run not in resolved and (target := study.resolve(run, choices)) is not None:
                resolved[run] = target
                study._check_reusable(target)
                if _finished(study, target):
                    skipped += 1
                else:
                    waiting.append(target)
        failed_groups = {run.group for run in tuning if run in study.failed}
        study.blocked = [run for run in later if run not in resolved and run.group in failed_groups]
        if waiting:
            before = set(jobs)
            _submit(executor, study, waiting, jobs)
            active += [job for job in jobs if job not in before]
            waiting = []
        all_runs = tuning + list(resolved.values())
        if not active:
            study._progress(all_runs, total, skipped, final=True)
            return study.scored([run for run in all_runs if run not in study.failed])
        job = next(as_completed(active, poll_frequency=POLL_SECONDS[study.args.executor]))
        active.remove(job)
        collect(study, jobs[job], job)
        study._progress(all_runs, total, skipped)


# --------------------------------------------------------------------------------------------- dry run


def dry_run(study: Study, tuning: list[Run], later: list[Run]) -> None:
    """What EXECUTOR would run, printed: nothing is submitted or trained."""
    args = study.args
    tag = args.defaults.tag
    runs = [run for run in tuning if not _finished(study, run)]
    print(f"[{tag}] dry run, EXECUTOR={args.executor}: nothing is submitted; {len(runs)} of {len(tuning)} tuning "
          f"run(s) to train" + (f", then {len(later)} later seed run(s) at their model's choice" if later else ""), flush=True)  # fmt: skip
    if args.executor == "slurm":
        executor = make_executor(args, script_only=True)
        if len(runs) > 1:  # how SlurmExecutor makes an array's script (map_count: the array's size)
            executor.parameters["map_count"] = len(runs)
        print(f"\n# the sbatch script of the tuning runs' job array\n"
              f"{executor._make_submission_file_text(executor._submitit_command_str, 'dry-run')}")  # fmt: skip
    elif args.executor == "submitit-local":
        command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(_folder(args)))])
        print(f"\n# every job, a process of this machine (submitit's LocalExecutor; %j its id)\n{command}")
    for index, run in enumerate(runs):
        cmd = study._command(run, study.run_dir(run) / "checkpoints", list(args.extra))
        print(f"\n# {'array task ' + str(index) + ': ' if args.executor != 'local' else ''}{run.name}\n{shlex.join(cmd)}")
    for run in later:
        print(f"\n# later, {run.label}")
    sys.stdout.flush()
