"""Running a study's grid (scripts/study/study.py): the runs, their fairseq-train and evaluation processes,
resuming, early stopping, and each run's results read back from its records.

Resuming: a run that finished training has ``DONE.json`` (written atomically) and is skipped; an interrupted
one continues from its checkpoint_last.pt (fairseq restores it from the same save directory); evaluations
that finished are reused. Early stopping (PATIENCE) is fairseq's ``--patience``; because fairseq forgets its
count when a run is resumed, the tool applies the same rule to the run's whole validation record
(study_logs.early_stop) and stops a resumed run itself at the validation an uninterrupted run stops at.
A failed run (Study._fail) does not stop the others; study.py ends with the partial report and an error.
A run whose loss diverged (fairseq's FloatingPointError, study_logs.diverged) is a result, not a failure: its
DONE.json says ``"stopped": "diverged"``, it is not evaluated, never chosen, and the report lists it.
"""

import itertools
import json
import os
import select
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from scripts.study import study_checks, study_lm, study_stats
from scripts.study.study_common import (
    REPO,
    RecipeError,
    Run,
    as_dict,
    command_differences,
    cpu_identity,
    exit_text,
    git_commit,
    machine,
    portable_command,
    read_lines,
    train_command,
    validate_command,
    write_json,
)
from scripts.study.study_console import Console
from scripts.study.study_logs import (
    EARLY_STOP,
    FAIRSEQ_EARLY_STOP,
    attempt_line,
    best_validation,
    diverged,
    early_stop,
    finished_curves,
    last_attempt,
    last_saved_update,
    read_curves,
)
from scripts.study.study_process import Process

# a test hook: "RUNS:UPDATES" stops the study like Ctrl-C once RUNS runs are done and the next reached UPDATES
INTERRUPT_HOOK = "STUDY_INTERRUPT_AT"
INTERRUPTED = "=== study: interrupted\n"


def grid(args) -> tuple[list[Run], list[Run]]:
    """(the tuning runs: every lr/warm-up with the first seed, the other seeds' runs at a setting to choose)."""
    first, *others = args.seed_list
    tuning = []
    for arch, variant in itertools.product(args.arch_list, args.variant_list):
        for lr, warmup in study_checks.candidates(args, arch, variant):
            tuning.append(Run(arch, variant, lr, warmup, first))
    return tuning, [Run(a, v, 0.0, 0, s) for a, v, s in itertools.product(args.arch_list, args.variant_list, others)]


class Study(Console):
    def __init__(self, args, data: Path, manifest: dict):
        self.args, self.data, self.manifest = args, data, manifest
        self.runs_dir = args.out_dir / "runs"
        self.start = time.time()
        self.train: dict[Run, Process] = {}
        self.evals: dict[Run, Process] = {}
        self.finished: list[Run] = []
        self.failed: dict[Run, str] = {}  # run -> why: the other runs go on, the study ends with an error
        self.blocked: list[Run] = []  # later seeds of a model whose tuning failed (never started)
        self.hook = self._hook()
        self.interrupted_by_hook = False
        self.last_report = -1
        self.tty = sys.stdout.isatty()
        self.drawn = 0
        self._provenance: dict | None = None
        self.diverged_runs: list[Run] = []  # of the runs handed to the report (Study.scored)

    def _hook(self):
        value = os.environ.get(INTERRUPT_HOOK)
        if not value:
            return None
        runs, updates = (int(x) for x in value.split(":"))
        return {"runs": runs, "updates": updates, "run": None}

    def run_dir(self, run: Run) -> Path:
        return self.runs_dir / run.name

    def is_done(self, run: Run) -> bool:
        return (self.run_dir(run) / "DONE.json").is_file()

    def is_evaluated(self, run: Run) -> bool:
        return (self.run_dir(run) / "eval" / "results.json").is_file()

    def is_diverged(self, run: Run) -> bool:
        done = self.run_dir(run) / "DONE.json"
        return done.is_file() and json.loads(done.read_text(encoding="utf-8")).get("stopped") == "diverged"

    def is_settled(self, run: Run) -> bool:
        """Nothing left to do for the run: evaluated, or diverged (nothing to evaluate)."""
        return self.is_evaluated(run) or self.is_diverged(run)

    def scored(self, runs: list[Run]) -> list[Run]:
        """The runs with scores for the report; the diverged ones are kept in ``self.diverged_runs`` for it."""
        self.diverged_runs = [run for run in runs if self.is_diverged(run)]
        return [run for run in runs if run not in self.diverged_runs]

    # ---------------------------------------------------------------------------------- scheduling

    def resolve(self, run: Run, choices: dict) -> Run | None:
        """A later seed's run at its group's chosen setting, once the group's tuning is done."""
        if run.lr:
            return run
        choice = choices.get(run.group)
        return None if choice is None else Run(run.arch, run.variant, choice["lr"], choice["warmup"], run.seed)

    def execute(self, tuning: list[Run], later: list[Run]) -> list[Run]:
        """Train and evaluate every run; returns the runs of the study (tuning and chosen)."""
        pending_train = [r for r in tuning if not self.is_done(r) and not self._finished_before(r)]
        for run in tuning:
            self._check_reusable(run)
        skipped = len(tuning) - len(pending_train)
        resolved: dict[Run, Run] = {}
        total = len(tuning) + len(later)
        while True:
            choices = self._choices(tuning)
            for run in later:
                if run not in resolved and (target := self.resolve(run, choices)) is not None:
                    resolved[run] = target
                    if self.is_done(target) or self._finished_before(target):
                        self._check_reusable(target)
                        skipped += 1
                    else:
                        pending_train.append(target)
            failed_groups = {run.group for run in tuning if run in self.failed}
            self.blocked = [run for run in later if run not in resolved and run.group in failed_groups]
            all_runs = tuning + list(resolved.values())
            for run in [r for r in all_runs if self.is_done(r) and not self.is_settled(r) and r not in self.failed]:
                if run not in self.evals and len(self.train) + len(self.evals) < self.args.jobs:
                    self.evals[run] = self._evaluate(run)
            while pending_train and len(self.train) + len(self.evals) < self.args.jobs:
                run = pending_train.pop(0)
                self.train[run] = self._train(run)
            self._poll()
            if self.interrupted_by_hook:
                for proc in [*self.train.values(), *self.evals.values()]:
                    proc.stop()
                raise KeyboardInterrupt
            self._progress(all_runs, total, skipped)
            if (not pending_train and not self.train and not self.evals and len(resolved) + len(self.blocked) == len(later)
                    and all(self.is_settled(r) or r in self.failed for r in all_runs)):  # fmt: skip
                self._progress(all_runs, total, skipped, final=True)
                # in the grid's order (as REPORT_ONLY lists them), not the order the later seeds' settings were chosen
                ordered = tuning + [resolved[r] for r in later if r in resolved]
                return self.scored([r for r in ordered if r not in self.failed])
            self._wait(0.5 if self.hook else 2.0)

    def _wait(self, seconds: float) -> None:
        """Until one of the running processes ends, or ``seconds`` pass (the early-stopping and progress checks):
        the next phase of a run (its evaluation, a later seed) starts when the last one ends, not up to a poll later."""
        ended = [getattr(p, "ended", None) for p in (*self.train.values(), *self.evals.values())]
        if ended and None not in ended:
            waiting = select.poll()
            for fd in ended:
                waiting.register(fd, select.POLLIN)
            waiting.poll(seconds * 1000)
        else:
            time.sleep(seconds)

    def finished_runs(self, tuning: list[Run], later: list[Run]) -> tuple[list[Run], list[Run]]:
        """(finished and evaluated runs, the others) of the grid, for a report without training (REPORT_ONLY)."""
        self._record_divergence(tuning)  # first: a diverged tuning run is part of its group's choice
        choices = self._choices(tuning)
        resolved = {run: self.resolve(run, choices) for run in later}
        runs = tuning + [target for target in resolved.values() if target is not None]
        runs += [run for run, target in resolved.items() if target is None]  # unresolved: missing
        self._record_divergence(runs)
        done = [run for run in runs if self.is_done(run) and self.is_settled(run)]
        for run in done:
            self._check_reusable(run)
        return self.scored(done), [run for run in runs if run not in done]

    def _record_divergence(self, runs: list[Run]) -> None:
        """DONE.json for the runs that diverged before the study recorded it (or under an older tool, which
        failed them): a result to report, and to choose without."""
        for run in runs:
            if not self.is_done(run) and diverged(self.run_dir(run) / "train.log"):
                self._mark_done(run, diverged=True)

    def _fail(self, run: Run, why: str) -> None:
        """A run that failed: said now, and the study goes on with the runs that do not depend on it (a later
        seed waits for its model's tuning runs), so that one out-of-memory kill does not idle the machine."""
        self.failed[run] = why
        if self.hook and self.hook["run"] == run:  # the test hook waits for another run to stop at
            self.hook["run"] = None
        print(f"[study] error: {why}; the other runs go on", flush=True)

    def _check_reusable(self, run: Run) -> None:
        """A finished run is reused only if it was trained by the command this study would run now.

        Run names carry the architecture, variant, lr, warm-up and seed, not the budget, width or batch: without
        this check, the same OUT_DIR with another MAX_UPDATE or MODEL_ARGS would silently mix two set-ups.
        """
        stored = self.run_dir(run) / "command.json"
        if not self.is_done(run) or not stored.is_file():
            return
        now = self._command(run, self.run_dir(run) / "checkpoints", list(self.args.extra))
        differences = command_differences(json.loads(stored.read_text(encoding="utf-8"))["command"], now)
        if differences:
            raise RecipeError(f"OUT_DIR (--out-dir)={self.args.out_dir} holds run {run.name}, finished under another "
                              f"set-up ({'; '.join(differences)}): use a new OUT_DIR, or the settings it was made with")  # fmt: skip

    def _finished_before(self, run: Run) -> bool:
        """A run whose fairseq-train ended normally (or diverged) but was stopped before DONE.json: marked done now.

        Restarting it would not be a no-op: fairseq resumed from a checkpoint saved at MAX_UPDATE at the end of an
        epoch makes one more update before it checks the limit.
        """
        log_file = self.run_dir(run) / "train.log"
        if self.is_done(run) or not log_file.is_file():
            return False
        stop = early_stop(read_curves(log_file)["valid"], self.args.budget.patience)
        if stop is not None:  # interrupted after its record already met the patience rule
            self._stop_early(run, stop)
            return True
        if diverged(log_file):  # its last attempt diverged before the study recorded it (or under an older tool)
            self._mark_done(run, diverged=True)
            return True
        text = last_attempt(log_file)
        if "| done training in" not in text or INTERRUPTED in text:
            return False
        self._mark_done(run)
        return True

    @staticmethod
    def _fairseq_stopped(log_file: Path) -> bool:
        return FAIRSEQ_EARLY_STOP in last_attempt(log_file)

    def _stop_early(self, run: Run, updates: int) -> None:
        with open(self.run_dir(run) / "train.log", "a", encoding="utf-8") as f:
            f.write(f"{EARLY_STOP}at {updates} updates (patience {self.args.budget.patience})\n")
        self._mark_done(run, early_stop_at=updates)

    def _mark_done(self, run: Run, early_stop_at: int | None = None, diverged: bool = False) -> None:
        log_file = self.run_dir(run) / "train.log"
        curves = read_curves(log_file)
        if early_stop_at is None and FAIRSEQ_EARLY_STOP in log_file.read_text(encoding="utf-8", errors="replace"):
            early_stop_at = early_stop(curves["valid"], self.args.budget.patience)
        updates = early_stop_at or (curves["train"][-1][0] if curves["train"] else 0)
        record = {"run": as_dict(run), "finished": _now(), "updates": updates}
        if self.args.budget.patience:  # absent without PATIENCE: the committed studies' records stay as they were
            record["stopped"] = "patience" if early_stop_at else ("time" if self.args.budget.minutes and
                                                                  updates < (self.args.budget.max_update or updates + 1)
                                                                  else "updates")  # fmt: skip
        if diverged:  # with or without PATIENCE: the report and the choice read it
            record["stopped"] = "diverged"
        write_json(self.run_dir(run) / "DONE.json", record)
        self.finished.append(run)

    def _choices(self, tuning: list[Run]) -> dict:
        groups: dict[tuple[str, str], list[Run]] = {}
        for run in tuning:
            groups.setdefault(run.group, []).append(run)
        done = {run: self.result(run, evaluated=False) for run in tuning if self.is_done(run)}
        return {group: choice for group, choice in study_stats.choose_settings(done, self.args.seed_list[0]).items()
                if all(r in done for r in groups[group])}  # fmt: skip

    def _train(self, run: Run) -> Process:
        save_dir = self.run_dir(run) / "checkpoints"
        extra = list(self.args.extra)
        hook = self.hook
        if hook and hook["run"] is None and len(list(self.runs_dir.glob("*/DONE.json"))) >= hook["runs"]:
            hook["run"] = run
            extra += ["--max-update", str(hook["updates"])]  # as if the run were stopped at this update
        cmd = self._command(run, save_dir, extra)
        attempts = read_curves(self.run_dir(run) / "train.log")["attempts"]
        write_json(self.run_dir(run) / "command.json", {"command": portable_command(cmd, REPO)})
        self._record_provenance(run, attempts + 1, save_dir)
        return Process(cmd, self.run_dir(run) / "train.log", self.args.threads, header=attempt_line(attempts + 1, time.time()))

    def _record_provenance(self, run: Run, attempt: int, save_dir: Path) -> None:
        """provenance.json: one entry per attempt with the commit, the machine, the thread count, the versions and,
        for a resumed attempt, the update and checkpoint it continues from, so that the report can flag a run
        resumed across machines or commits and a comparison whose arms ran on different machines."""
        path = self.run_dir(run) / "provenance.json"
        entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        resumed = None
        if (save_dir / "checkpoint_last.pt").is_file():
            resumed = {"checkpoint": "checkpoint_last.pt", "update": last_saved_update(self.run_dir(run) / "train.log")}
        entries.append({"attempt": attempt, "started": _now(), "commit": self.provenance["commit"],
                        "machine": {**self.provenance["machine"], "threads": self.args.threads},
                        "versions": self.provenance["versions"], "resumed_from": resumed})  # fmt: skip
        write_json(path, entries)

    @property
    def provenance(self) -> dict:
        """What every attempt of this study process shares (computed once: it imports torch and fairseq)."""
        if self._provenance is None:
            info = machine()
            self._provenance = {
                "commit": git_commit(REPO, self.args.out_dir),
                "machine": {**cpu_identity(), "cores": info["cores"], "os": info["os"]},
                "versions": {k: info[k] for k in ("torch", "fairseq", "sacrebleu", "python")},
            }
        return self._provenance

    @property
    def lm(self) -> bool:
        return self.manifest.get("task") == study_lm.TASK

    def _command(self, run: Run, save_dir: Path, extra: list[str]) -> list[str]:
        if self.lm:
            cmd = study_lm.train_command(run, self.args.setup, self.args.budget, self.data, save_dir,
                                         self.args.valid_every, self.args.model_arg_list, extra)  # fmt: skip
        else:
            cmd = train_command(run, self.args.setup, self.args.budget, self.data, self.manifest, save_dir,
                                self.args.valid_every, self.args.model_arg_list, extra)  # fmt: skip
        # GPUS_PER_RUN (a submitit executor's): fairseq trains on the job's GPUs, so the command drops --cpu
        return [c for c in cmd if c != "--cpu"] if getattr(self.args, "gpus_per_run", 0) else cmd

    def _evaluate(self, run: Run) -> Process:
        if self.lm:  # perplexity and per-sentence log-likelihoods of valid and test (study_lm_eval.py)
            cmd = study_lm.eval_command(self.data, self.run_dir(run) / "checkpoints" / "checkpoint_best.pt",
                                        self.run_dir(run) / "eval" / "results.json")  # fmt: skip
            return Process(cmd, self.run_dir(run) / "eval.log", self.args.threads, mode="w")
        cmd = [sys.executable, "-m", "scripts.training.evaluate_recipe", self.data,
               self.run_dir(run) / "checkpoints" / "checkpoint_best.pt", "--output-dir", self.run_dir(run) / "eval",
               "--sets", self.test_set["name"], "--gpu", "auto" if getattr(self.args, "gpus_per_run", 0) else "0",
               "--max-tokens", "4000", "--",
               "--max-len-a", "1.5", "--max-len-b", "10"]  # fmt: skip
        return Process([str(c) for c in cmd], self.run_dir(run) / "eval.log", self.args.threads, mode="w")

    @property
    def test_set(self) -> dict:
        return {"name": "test"} if self.lm else self.manifest["tests"][0]

    def _poll(self) -> None:
        for run, proc in list(self.train.items()):
            status = proc.poll()
            if status is None:
                stop = early_stop(read_curves(proc.log_file)["valid"], self.args.budget.patience)
                if stop is None or self._fairseq_stopped(proc.log_file):
                    continue  # still improving, or fairseq stops it itself (an attempt that was never resumed)
                proc.stop()  # a resumed run past the validation its whole record says to stop at
                del self.train[run]
                self._stop_early(run, stop)
                continue
            del self.train[run]
            if status != 0 and diverged(proc.log_file):
                self._mark_done(run, diverged=True)
                print(f"[{self.args.defaults.tag}] {run.name} diverged (fairseq stopped it on a NaN/Inf loss): recorded "
                      f"as diverged, not evaluated, never chosen; see {proc.log_file}", flush=True)  # fmt: skip
                continue
            if status != 0:
                self._fail(run, f"training {run.name} failed ({exit_text(status)}); see {proc.log_file}")
                continue
            if self.hook and self.hook["run"] == run:
                with open(proc.log_file, "a", encoding="utf-8") as f:
                    f.write(INTERRUPTED)  # its "done training" came from the hook's --max-update, not the budget
                self.interrupted_by_hook = True
                return
            self._mark_done(run)
        for run, proc in list(self.evals.items()):
            status = proc.poll()
            if status is None:
                continue
            del self.evals[run]
            if status != 0:
                self._fail(run, f"evaluation of {run.name} failed ({exit_text(status)}); see {proc.log_file}")
                continue
            if not self.lm:
                self._check_validation(run)
            for stale in (self.run_dir(run) / "checkpoints").glob("checkpoint_*_*.pt"):
                stale.unlink()  # the interval checkpoint only served resuming; best (and last) stay

    def _check_validation(self, run: Run) -> None:
        """fairseq-validate on checkpoint_best.pt in a new process (eval/valid_check.json), to compare with the best
        valid loss training logged: a model whose evaluation keeps state from training shows here (dynamic
        hyper-connections' stale coefficient cache logged 5.09 bits where the checkpoint has 4.26). The report
        lists any difference; a check that cannot run is recorded, not fatal (the run's results stand)."""
        run_dir = self.run_dir(run)
        command_file, checkpoint = run_dir / "command.json", run_dir / "checkpoints" / "checkpoint_best.pt"
        record = {"command": None, "valid_loss": None}
        if command_file.is_file() and checkpoint.is_file():
            train_cmd = json.loads(command_file.read_text(encoding="utf-8"))["command"]
            cmd = validate_command(train_cmd, self.data, checkpoint)
            threads = str(self.args.threads)
            env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONWARNINGS": "ignore"}
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
            output = proc.stdout + proc.stderr
            losses = [json.loads(line.split("| valid | ", 1)[1])["valid_loss"]
                      for line in output.splitlines() if "| valid | " in line]  # fmt: skip
            record.update(command=portable_command(cmd, REPO), valid_loss=float(losses[-1]) if losses else None)
            if proc.returncode != 0 or not losses:
                record["error"] = f"fairseq-validate {exit_text(proc.returncode)}: {output[-500:]}"
        else:
            record["error"] = f"no {command_file.name} or {checkpoint.name} in the run's directory"
        if "error" in record:
            print(f"[study] warning: the validation check of {run.name} did not run ({record['error'][:200]})", flush=True)
        write_json(run_dir / "eval" / "valid_check.json", record)

    # -------------------------------------------------------------------------------- results

    def result(self, run: Run, evaluated: bool = True) -> dict:
        curves, done = finished_curves(self.run_dir(run))
        best = best_validation(curves["valid"])
        out = {"curves": curves, "parameters": curves["parameters"],
               "valid_loss": curves["valid"][-1][2] if curves["valid"] else None,
               "first_valid_loss": curves["valid"][0][2] if curves["valid"] else None,
               # a run ends on a validation (early stopping's) as often as on a logged training step
               "updates": max((p[0] for p in curves["train"] + curves["valid"]), default=0),
               "seconds": max([p[1] for p in curves["train"] + curves["valid"]], default=0.0),
               "best_valid_loss": best[2] if best else None, "best_valid_update": best[0] if best else None,
               "stopped": done.get("stopped")}  # fmt: skip
        if out["stopped"] == "diverged":  # what it validated before diverging is no candidate for the choice
            out.update(best_valid_loss=None, best_valid_update=None)
        if evaluated and self.lm:
            out.update(study_lm.read_eval(json.loads((self.run_dir(run) / "eval" / "results.json").read_text(encoding="utf-8"))))
        elif evaluated:
            ev = json.loads((self.run_dir(run) / "eval" / "results.json").read_text(encoding="utf-8"))
            test = ev["tests"][self.test_set["name"]]
            out.update(bleu=test["bleu"], chrf=test["chrf"], sentences=test["sentences"], beam=ev["beam"],
                       signature=ev["signatures"]["bleu"])  # fmt: skip
            check = self.run_dir(run) / "eval" / "valid_check.json"
            if check.is_file():
                out["checked_valid_loss"] = json.loads(check.read_text(encoding="utf-8")).get("valid_loss")
            hyp_file = next((self.run_dir(run) / "eval" / "hyps").glob(f"{self.test_set['name']}.*"))
            out["hyps"] = read_lines(hyp_file)
        return out




def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
