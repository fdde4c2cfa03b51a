#!/usr/bin/env python
"""A study (recipes/study.sh): a grid of architectures x seeds (x set-up variants) trained on one prepared
dataset under an equal budget, translated, scored and compared.

    ARCHS='transformer_preln_iwslt_e12d12 residual_iwslt_e12d12' SEEDS='1 2' MAX_UPDATE=1000 \\
        MULTI30K_DIR=../shared/data/multi30k bash recipes/study.sh

1. data: Multi30k prepared with scripts/data/prepare_multi30k.py (``--raw-dir``/MULTI30K_DIR, or a download),
   or any prepared ``--data-bin``/DATA_BIN (a directory with recipe.json);
2. training: every run gets the same fairseq-train command (study_common.train_command) except ``--arch``,
   the seed, the variant's schedule and, with LRS/WARMUPS, the lr and warm-up. The budget is equal: MAX_UPDATE
   updates, or TRAIN_MINUTES of training time (then MAX_UPDATE only caps it). With several LRS or WARMUPS,
   each architecture tries them all with the first seed, keeps the one with the lowest final validation loss
   and trains the other seeds with it (study_report). JOBS runs go side by side, THREADS threads each;
3. every run's checkpoint_best.pt is translated and scored with scripts/training/evaluate_recipe.py (sacrebleu
   BLEU and chrF; beam from the dataset's recipe.json; output length capped at 1.5 x source + 10 pieces so that
   an untrained model's babbling costs no more than a trained model's translations);
4. results.md, results.json, curves.png and bleu.png in OUT_DIR, naming the command and the machine.

Resuming: a run that finished training has ``DONE.json`` (written atomically) and is skipped; an interrupted
one continues from its checkpoint_last.pt (fairseq restores it from the same save directory); evaluations
that finished are reused. Run it again with the same settings after an interruption (Ctrl-C stops all runs).

The console gets a compact view only (a line per run: updates, train/valid loss, elapsed and remaining time;
redrawn in place on a terminal, otherwise printed at every fifth of the work); fairseq's own output goes to
``OUT_DIR/runs/RUN/train.log`` (JSON records, ``--log-format json``) and ``OUT_DIR/logs/``.
"""

import argparse
import itertools
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import study_report
from study_common import (
    ATTEMPT,
    REPO,
    VARIANTS,
    Budget,
    RecipeError,
    Run,
    Setup,
    as_dict,
    attempt_line,
    check_archs,
    command_differences,
    command_line,
    describe_machine,
    log,
    machine,
    read_curves,
    read_lines,
    read_manifest,
    run_main,
    train_command,
    write_json,
)

TAG = "study"
SCRIPTS = Path(__file__).resolve().parents[1]
WIDTH_128 = ("--encoder-embed-dim 128 --decoder-embed-dim 128 "
             "--encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512")  # fmt: skip
ENV_VARS = ("ARCHS", "SEEDS", "VARIANTS", "MAX_UPDATE", "TRAIN_MINUTES", "MODEL_ARGS", "TRAIN_LINES", "MULTI30K_DIR",
            "DATA_BIN", "OUT_DIR", "LRS", "WARMUPS", "JOBS", "THREADS", "MAX_TOKENS", "VALID_EVERY", "BOOTSTRAP",
            "VOCAB_SIZE", "SRC", "TGT", "VERIFY_COUNTS")  # fmt: skip
# a test hook: "RUNS:UPDATES" stops the study like Ctrl-C once RUNS runs are done and the next reached UPDATES
INTERRUPT_HOOK = "STUDY_INTERRUPT_AT"
INTERRUPTED = "=== study: interrupted\n"


@dataclass
class Defaults:
    """What the command line starts from: the study's, or the main job's (scripts/training/main_job.py)."""

    archs: str = "transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12 residual_iwslt_e12d12"
    seeds: str = "1 2"
    max_update: int = 1000
    model_args: str = WIDTH_128
    out_dir: Path = REPO / "work_dirs" / "study"
    jobs: str = "cores"  # "cores": one run per core; "all": every run at once
    tag: str = TAG
    description: str = __doc__
    extra_help: dict = field(default_factory=dict)


def parse_args(argv=None, defaults: Defaults | None = None):
    d = defaults or Defaults()
    own, extra = (list(sys.argv[1:] if argv is None else argv), [])
    if "--" in own:
        cut = own.index("--")
        own, extra = own[:cut], own[cut + 1 :]
    p = argparse.ArgumentParser(description=d.description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s [options] [-- more fairseq-train options for every run]")  # fmt: skip
    p.add_argument("--archs", default=d.archs, help=f"ARCHS: architectures, the first is the baseline (default '{d.archs}')")
    p.add_argument("--seeds", default=d.seeds, help=f"SEEDS: random seeds (default '{d.seeds}')")
    p.add_argument("--variants", default="warmup", help=f"VARIANTS: set-up variants of {', '.join(VARIANTS)} (default warmup)")
    p.add_argument("--max-update", type=int, default=None,
                   help=f"MAX_UPDATE: updates per run (default {d.max_update}; with TRAIN_MINUTES, a cap, 0 = none)")
    p.add_argument("--train-minutes", type=float, default=0.0,
                   help="TRAIN_MINUTES: budget in training minutes per run instead of updates (default 0: updates)")
    p.add_argument("--model-args", default=d.model_args, help=f"MODEL_ARGS: fairseq-train options for every model (default '{d.model_args}')")
    p.add_argument("--lrs", default="", help="LRS: peak learning rates to choose from per model (default: 1e-3)")
    p.add_argument("--warmups", default="", help="WARMUPS: warm-up updates to choose from per model (default: 400)")
    p.add_argument("--max-tokens", type=int, default=Setup.max_tokens, help=f"MAX_TOKENS: tokens per update (default {Setup.max_tokens})")
    p.add_argument("--valid-every", type=int, default=0,
                   help="VALID_EVERY: validate and save a checkpoint every N updates (default: MAX_UPDATE / 8, or 100)")
    p.add_argument("--jobs", type=int, default=0,
                   help="JOBS: runs side by side (default: " + ("every run at once" if d.jobs == "all" else "one per core") + ")")
    p.add_argument("--threads", type=int, default=0, help="THREADS: threads per run (default: cores / JOBS, at least 1)")
    p.add_argument("--bootstrap", type=int, default=1000, help="BOOTSTRAP: paired bootstrap samples (default 1000)")
    p.add_argument("--raw-dir", type=Path, help="MULTI30K_DIR: a local Multi30k copy (default: download)")
    p.add_argument("--data-bin", type=Path, help="DATA_BIN: an already prepared dataset instead of Multi30k")
    p.add_argument("--train-lines", type=int, default=0, help="TRAIN_LINES: only the first N training pairs (default 0: all)")
    p.add_argument("--vocab-size", type=int, default=8000, help="VOCAB_SIZE: joint SentencePiece pieces (default 8000)")
    p.add_argument("--src", default="de", help="SRC: source language (default de)")
    p.add_argument("--tgt", default="en", help="TGT: target language (default en)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="VERIFY_COUNTS=0: accept a Multi30k copy whose line counts differ from the published ones")
    p.add_argument("--report-only", action="store_true",
                   help="REPORT_ONLY=1: train nothing; report the runs finished so far and list the missing ones")
    p.add_argument("--out-dir", type=Path, default=d.out_dir, help=f"OUT_DIR: everything goes here (default {d.out_dir})")
    args = p.parse_args(own)
    args.extra = extra
    args.defaults = d
    validate(args, d)
    return args


def _numbers(text: str, variable: str, kind, allowed: str) -> list:
    try:
        values = [kind(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise RecipeError(f"{variable}={text!r}: expected {allowed}") from None
    if len(set(values)) != len(values):
        raise RecipeError(f"{variable}={text!r}: a value appears twice")
    return values


def validate(args, d: Defaults) -> None:
    """Every setting checked before anything is prepared or trained; messages name the variable."""
    args.arch_list = args.archs.split()
    if not args.arch_list:
        raise RecipeError("ARCHS (--archs) is empty: give at least one architecture")
    if len(set(args.arch_list)) != len(args.arch_list):
        raise RecipeError(f"ARCHS (--archs)={args.archs!r}: an architecture appears twice")
    args.seed_list = _numbers(args.seeds, "SEEDS (--seeds)", int, "integers, e.g. '1 2'")
    if not args.seed_list:
        raise RecipeError("SEEDS (--seeds) is empty: give at least one seed")
    args.variant_list = args.variants.replace(",", " ").split()
    bad = [v for v in args.variant_list if v not in VARIANTS]
    if bad or not args.variant_list or len(set(args.variant_list)) != len(args.variant_list):
        raise RecipeError(f"VARIANTS (--variants)={args.variants!r}: allowed {', '.join(VARIANTS)}, each once")
    args.lr_list = _numbers(args.lrs, "LRS (--lrs)", float, "numbers, e.g. '5e-4 1e-3'") or [Setup.lr]
    if any(not 0 < lr < 1 for lr in args.lr_list):
        raise RecipeError(f"LRS (--lrs)={args.lrs!r}: every learning rate must be in (0, 1)")
    args.warmup_list = _numbers(args.warmups, "WARMUPS (--warmups)", int, "integers, e.g. '100 400'") or [Setup.warmup]
    if any(w < 1 for w in args.warmup_list):
        raise RecipeError(f"WARMUPS (--warmups)={args.warmups!r}: warm-up updates must be >= 1 (the no-warm-up "
                          "schedule is VARIANTS=nowarmup)")  # fmt: skip
    if args.train_minutes < 0:
        raise RecipeError(f"TRAIN_MINUTES (--train-minutes)={args.train_minutes:g}: must be >= 0")
    if args.max_update is None:
        args.max_update = 0 if args.train_minutes else d.max_update
    if args.max_update < 0 or (not args.train_minutes and args.max_update == 0):
        raise RecipeError(f"MAX_UPDATE (--max-update)={args.max_update}: must be > 0 (or set TRAIN_MINUTES for a "
                          "time budget)")  # fmt: skip
    if "nowarmup" in args.variant_list and not args.max_update:
        raise RecipeError("VARIANTS=nowarmup decays the lr linearly to 0 at the last update, so it needs MAX_UPDATE > 0 "
                          "(with TRAIN_MINUTES too)")  # fmt: skip
    for name, variable, low in (("max_tokens", "MAX_TOKENS", 1), ("valid_every", "VALID_EVERY", 0), ("jobs", "JOBS", 0),
                                ("threads", "THREADS", 0), ("bootstrap", "BOOTSTRAP", 0), ("train_lines", "TRAIN_LINES", 0),
                                ("vocab_size", "VOCAB_SIZE", 1)):  # fmt: skip
        if getattr(args, name) < low:
            raise RecipeError(f"{variable} (--{name.replace('_', '-')})={getattr(args, name)}: must be >= {low}")
    try:
        args.model_arg_list = shlex.split(args.model_args)
    except ValueError as err:
        raise RecipeError(f"MODEL_ARGS (--model-args)={args.model_args!r}: {err}") from None
    if args.raw_dir is not None and args.data_bin is not None:
        raise RecipeError("MULTI30K_DIR and DATA_BIN are both set: give one (DATA_BIN is already prepared)")
    if args.raw_dir is not None and not args.raw_dir.is_dir():
        raise RecipeError(f"MULTI30K_DIR (--raw-dir)={args.raw_dir}: no such directory")
    if args.data_bin is not None and not args.data_bin.is_dir():
        raise RecipeError(f"DATA_BIN (--data-bin)={args.data_bin}: no such directory")
    cores = os.cpu_count() or 1
    runs = len(args.arch_list) * len(args.variant_list) * len(args.seed_list)
    args.jobs = args.jobs or (runs if d.jobs == "all" else cores)
    args.threads = args.threads or max(1, cores // args.jobs)
    args.budget = Budget(max_update=args.max_update, minutes=args.train_minutes)
    args.valid_every = args.valid_every or (max(1, args.max_update // 8) if not args.train_minutes else 100)
    args.setup = Setup(max_tokens=args.max_tokens)


# ------------------------------------------------------------------------------------------------- data


def prepare_data(args, logs: Path) -> Path:
    """The binarized dataset: DATA_BIN as given, or Multi30k prepared once into OUT_DIR/data-bin."""
    if args.data_bin is not None:
        read_manifest(args.data_bin)
        return args.data_bin
    name = f"multi30k_{args.src}_{args.tgt}"
    dest = args.out_dir / "data-bin" / name
    settings = {"corpus": "multi30k", "languages": sorted((args.src, args.tgt)), "vocab_size": args.vocab_size,
                "train_lines": args.train_lines}  # fmt: skip
    if (dest / "recipe.json").is_file():
        old = json.loads((dest / "recipe.json").read_text(encoding="utf-8")).get("settings") or {}
        # prepare_multi30k.py may record more than these (e.g. the direction): these must match
        if all(old.get(key) == value for key, value in settings.items()):
            return dest
        raise RecipeError(f"OUT_DIR={args.out_dir}: its data was prepared with {old}, now {settings}; use another "
                          "OUT_DIR or the same TRAIN_LINES, VOCAB_SIZE, SRC and TGT")  # fmt: skip
    cmd = [sys.executable, SCRIPTS / "data" / "prepare_multi30k.py", "--src", args.src, "--tgt", args.tgt,
           "--work-dir", args.out_dir / "data" / name, "--dest-dir", dest, "--train-lines", str(args.train_lines),
           "--vocab-size", str(args.vocab_size)]  # fmt: skip
    cmd += ["--raw-dir", args.raw_dir] if args.raw_dir else []
    cmd += [] if args.verify_counts else ["--no-verify-counts"]
    log_file = logs / "prepare.log"
    with open(log_file, "w", encoding="utf-8") as out:
        status = subprocess.run([str(c) for c in cmd], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if status != 0:
        text = log_file.read_text(encoding="utf-8", errors="replace")
        errors = [line.split("error: ", 1)[1] for line in text.splitlines() if "] error: " in line]
        if args.raw_dir is None and "download of" in text:
            raise RecipeError("Multi30k could not be downloaded (offline?): set MULTI30K_DIR to a local copy "
                              "(train/val/test_2016_flickr.LANG.gz) or DATA_BIN to a prepared dataset; "
                              f"details in {log_file}")  # fmt: skip
        raise RecipeError(f"data preparation failed: {errors[-1] if errors else 'see ' + str(log_file)}")
    return dest


# ---------------------------------------------------------------------------------------------- the grid


def grid(args) -> tuple[list[Run], list[Run]]:
    """(the tuning runs: every lr/warm-up with the first seed, the other seeds' runs at a setting to choose)."""
    first, *others = args.seed_list
    tuning = []
    for arch, variant in itertools.product(args.arch_list, args.variant_list):
        warmups = args.warmup_list if variant == "warmup" else [0]
        for lr, warmup in itertools.product(args.lr_list, warmups):
            tuning.append(Run(arch, variant, lr, warmup, first))
    return tuning, [Run(a, v, 0.0, 0, s) for a, v, s in itertools.product(args.arch_list, args.variant_list, others)]


class Process:
    """A training or evaluation subprocess whose output goes to a file."""

    def __init__(self, cmd: list[str], log_file: Path, threads: int, mode: str = "a", header: str = ""):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = log_file
        self.out = open(log_file, mode, encoding="utf-8")  # noqa: SIM115  (closed in done())
        self.out.write(header)
        self.out.flush()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.out, stderr=subprocess.STDOUT)
        self.started = time.time()

    def poll(self) -> int | None:
        status = self.proc.poll()
        if status is not None:
            self.out.close()
        return status

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.out.close()


class Study:
    def __init__(self, args, data: Path, manifest: dict):
        self.args, self.data, self.manifest = args, data, manifest
        self.runs_dir = args.out_dir / "runs"
        self.start = time.time()
        self.train: dict[Run, Process] = {}
        self.evals: dict[Run, Process] = {}
        self.finished: list[Run] = []
        self.hook = self._hook()
        self.interrupted_by_hook = False
        self.last_report = -1
        self.tty = sys.stdout.isatty()
        self.drawn = 0

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
            all_runs = tuning + list(resolved.values())
            for run in [r for r in all_runs if self.is_done(r) and not self.is_evaluated(r)]:
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
            if (not pending_train and not self.train and not self.evals and len(resolved) == len(later)
                    and all(self.is_evaluated(r) for r in all_runs)):  # fmt: skip
                self._progress(all_runs, total, skipped, final=True)
                return all_runs
            time.sleep(0.5 if self.hook else 2.0)

    def finished_runs(self, tuning: list[Run], later: list[Run]) -> tuple[list[Run], list[Run]]:
        """(finished and evaluated runs, the others) of the grid, for a report without training (REPORT_ONLY)."""
        choices = self._choices(tuning)
        resolved = {run: self.resolve(run, choices) for run in later}
        runs = tuning + [target for target in resolved.values() if target is not None]
        runs += [run for run, target in resolved.items() if target is None]  # unresolved: missing
        done = [run for run in runs if self.is_done(run) and self.is_evaluated(run)]
        for run in done:
            self._check_reusable(run)
        return done, [run for run in runs if run not in done]

    def _check_reusable(self, run: Run) -> None:
        """A finished run is reused only if it was trained by the command this study would run now.

        Run names carry the architecture, variant, lr, warm-up and seed, not the budget, width or batch: without
        this check, the same OUT_DIR with another MAX_UPDATE or MODEL_ARGS would silently mix two set-ups.
        """
        stored = self.run_dir(run) / "command.json"
        if not self.is_done(run) or not stored.is_file():
            return
        now = train_command(run, self.args.setup, self.args.budget, self.data, self.manifest, self.run_dir(run) / "checkpoints",
                            self.args.valid_every, self.args.model_arg_list, list(self.args.extra))  # fmt: skip
        differences = command_differences(json.loads(stored.read_text(encoding="utf-8"))["command"], now)
        if differences:
            raise RecipeError(f"OUT_DIR (--out-dir)={self.args.out_dir} holds run {run.name}, finished under another "
                              f"set-up ({'; '.join(differences)}): use a new OUT_DIR, or the settings it was made with")  # fmt: skip

    def _finished_before(self, run: Run) -> bool:
        """A run whose fairseq-train ended normally but was stopped before DONE.json: marked done now.

        Restarting it would not be a no-op: fairseq resumed from a checkpoint saved at MAX_UPDATE at the end of an
        epoch makes one more update before it checks the limit.
        """
        log_file = self.run_dir(run) / "train.log"
        if self.is_done(run) or not log_file.is_file():
            return False
        last_attempt = log_file.read_text(encoding="utf-8", errors="replace").rsplit(ATTEMPT, 1)[-1]
        if "| done training in" not in last_attempt or INTERRUPTED in last_attempt:
            return False
        self._mark_done(run)
        return True

    def _mark_done(self, run: Run) -> None:
        curves = read_curves(self.run_dir(run) / "train.log")
        write_json(self.run_dir(run) / "DONE.json", {"run": as_dict(run), "finished": _now(),
                                                     "updates": curves["train"][-1][0] if curves["train"] else 0})  # fmt: skip
        self.finished.append(run)

    def _choices(self, tuning: list[Run]) -> dict:
        groups: dict[tuple[str, str], list[Run]] = {}
        for run in tuning:
            groups.setdefault(run.group, []).append(run)
        done = {run: self.result(run, evaluated=False) for run in tuning if self.is_done(run)}
        return {group: choice for group, choice in study_report.choose_settings(done, self.args.seed_list[0]).items()
                if all(r in done for r in groups[group])}  # fmt: skip

    def _train(self, run: Run) -> Process:
        save_dir = self.run_dir(run) / "checkpoints"
        extra = list(self.args.extra)
        hook = self.hook
        if hook and hook["run"] is None and len(list(self.runs_dir.glob("*/DONE.json"))) >= hook["runs"]:
            hook["run"] = run
            extra += ["--max-update", str(hook["updates"])]  # as if the run were stopped at this update
        cmd = train_command(run, self.args.setup, self.args.budget, self.data, self.manifest, save_dir,
                            self.args.valid_every, self.args.model_arg_list, extra)  # fmt: skip
        attempts = read_curves(self.run_dir(run) / "train.log")["attempts"]
        write_json(self.run_dir(run) / "command.json", {"command": cmd})
        return Process(cmd, self.run_dir(run) / "train.log", self.args.threads, header=attempt_line(attempts + 1, time.time()))

    def _evaluate(self, run: Run) -> Process:
        cmd = [sys.executable, SCRIPTS / "training" / "evaluate_recipe.py", self.data,
               self.run_dir(run) / "checkpoints" / "checkpoint_best.pt", "--output-dir", self.run_dir(run) / "eval",
               "--sets", self.test_set["name"], "--gpu", "0", "--max-tokens", "4000", "--",
               "--max-len-a", "1.5", "--max-len-b", "10"]  # fmt: skip
        return Process([str(c) for c in cmd], self.run_dir(run) / "eval.log", self.args.threads, mode="w")

    @property
    def test_set(self) -> dict:
        return self.manifest["tests"][0]

    def _poll(self) -> None:
        for run, proc in list(self.train.items()):
            status = proc.poll()
            if status is None:
                continue
            del self.train[run]
            if status != 0:
                raise RecipeError(f"training {run.name} failed (exit {status}); see {proc.log_file}")
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
                raise RecipeError(f"evaluation of {run.name} failed (exit {status}); see {proc.log_file}")
            for stale in (self.run_dir(run) / "checkpoints").glob("checkpoint_*_*.pt"):
                stale.unlink()  # the interval checkpoint only served resuming; best (and last) stay

    # -------------------------------------------------------------------------------- console

    def _progress(self, runs: list[Run], total: int, skipped: int, final: bool = False) -> None:
        """A line per run; redrawn on a terminal, otherwise printed at each fifth of the work."""
        done = sum(self.is_evaluated(r) for r in runs)
        fraction = self._fraction(runs, total)
        step = int(fraction * 5)
        if not self.tty and not final and (step <= self.last_report or step >= 5):
            return
        if self.tty and not final and time.time() - getattr(self, "_drawn_at", 0) < 5:
            return
        self.last_report, self._drawn_at = step, time.time()
        lines = [(f"[{self.args.defaults.tag}] {_minutes(time.time() - self.start)} elapsed: {done}/{total} runs "
                 f"done{f' ({skipped} from before)' if skipped else ''}, ~{fraction:.0%} of the work")]  # fmt: skip
        for run in runs:
            lines.append("  " + self._status(run))
        if self.tty and self.drawn:
            sys.stdout.write(f"\x1b[{self.drawn}F\x1b[J")
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        self.drawn = len(lines) if self.tty and not final else 0

    def _fraction(self, runs: list[Run], total: int) -> float:
        work = 0.0
        for run in runs:
            if self.is_evaluated(run):
                work += 1
            elif self.is_done(run):
                work += 0.95
            else:
                work += 0.95 * self._run_fraction(run)
        return min(1.0, work / max(1, total))

    def _run_fraction(self, run: Run) -> float:
        curves = read_curves(self.run_dir(run) / "train.log")
        budget = self.args.budget
        if budget.minutes:
            seconds = max([p[1] for p in curves["train"]], default=0.0)
            return min(1.0, seconds / (60 * budget.minutes))
        return min(1.0, (curves["train"][-1][0] if curves["train"] else 0) / budget.max_update)

    def _status(self, run: Run) -> str:
        curves = read_curves(self.run_dir(run) / "train.log")
        updates = curves["train"][-1][0] if curves["train"] else 0
        train = f"{curves['train'][-1][2]:.2f}" if curves["train"] else "-"
        valid = f"{curves['valid'][-1][2]:.2f}" if curves["valid"] else "-"
        seconds = max([p[1] for p in curves["train"] + curves["valid"]], default=0.0)
        if self.is_evaluated(run):
            state = "done"
        elif self.is_done(run):
            state = "translating" if run in self.evals else "trained"
        elif run in self.train:
            fraction = self._run_fraction(run)
            left = (seconds / fraction - seconds) if fraction > 0.02 else None
            state = f"training, {_minutes(left) + ' left' if left is not None else 'starting'}"
        else:
            state = "waiting"
        cap = self.args.budget.max_update or "?"
        return (f"{run.arch:<32} {run.variant:<8} lr {run.lr:g} s{run.seed}  {updates:>5}/{cap} upd  "
                f"train {train:>5}  valid {valid:>5}  {_minutes(seconds):>8}  {state}")  # fmt: skip

    # -------------------------------------------------------------------------------- results

    def result(self, run: Run, evaluated: bool = True) -> dict:
        curves = read_curves(self.run_dir(run) / "train.log")
        out = {"curves": curves, "parameters": curves["parameters"],
               "valid_loss": curves["valid"][-1][2] if curves["valid"] else None,
               "first_valid_loss": curves["valid"][0][2] if curves["valid"] else None,
               "updates": curves["train"][-1][0] if curves["train"] else 0,
               "seconds": max([p[1] for p in curves["train"] + curves["valid"]], default=0.0)}  # fmt: skip
        if evaluated:
            ev = json.loads((self.run_dir(run) / "eval" / "results.json").read_text(encoding="utf-8"))
            test = ev["tests"][self.test_set["name"]]
            out.update(bleu=test["bleu"], chrf=test["chrf"], sentences=test["sentences"], beam=ev["beam"],
                       signature=ev["signatures"]["bleu"])  # fmt: skip
            hyp_file = next((self.run_dir(run) / "eval" / "hyps").glob(f"{self.test_set['name']}.*"))
            out["hyps"] = read_lines(hyp_file)
        return out


def _interrupt(*_):
    raise KeyboardInterrupt  # SIGTERM stops the runs like Ctrl-C: nothing is left training in the background


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min"


def _shown(path: Path) -> str:
    """A path inside the repository relative to it, so a committed study names no machine's directories."""
    try:
        return str(path.resolve().relative_to(REPO.resolve()))
    except ValueError:
        return str(path)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def report(args, study: Study, runs: list[Run], data: Path, manifest: dict, info: dict, started: str,
           missing: list[Run] = ()) -> dict:  # fmt: skip
    """results.json, results.md, curves.png, bleu.png; returns the context (with the reading) for the console."""
    results = {run: study.result(run) for run in runs}
    choices = study_report.choose_settings(results, args.seed_list[0])
    by_seed: dict[tuple[str, int], list] = {}
    for variant in args.variant_list:
        for arch in args.arch_list:
            for run, r in results.items():
                if run.group == (arch, variant) and study_report._chosen(run, choices):
                    by_seed.setdefault((variant, run.seed), []).append((arch, r["hyps"]))
    # a seed whose baseline run is missing (a partial report) has nothing to be paired with
    by_seed = {key: systems for key, systems in by_seed.items() if systems[0][0] == args.arch_list[0]}
    references = read_lines(data / study.test_set["reference"])
    tests = study_report.paired_tests(by_seed, references, args.bootstrap) if args.bootstrap else {}
    rows = study_report.summarize(results, args.arch_list, args.variant_list, choices, tests)
    for row in rows:  # the first validation, for the reading's "did not train"
        firsts = [r["first_valid_loss"] for run, r in results.items()
                  if run.group == (row["arch"], row["variant"]) and study_report._chosen(run, choices)]  # fmt: skip
        row["first_valid_loss"] = study_report.mean_std(firsts)[0]
    out = args.out_dir
    curves_png, bleu_png = out / "curves.png", out / "bleu.png"
    study_report.plots(results, rows, choices, curves_png, bleu_png)
    budget_text = args.budget.describe()
    any_result = next(iter(results.values()))
    settings = {key: getattr(args, key) for key in ("arch_list", "seed_list", "variant_list", "lr_list", "warmup_list",
                                                      "max_update", "train_minutes", "model_args", "train_lines",
                                                      "jobs", "threads", "valid_every", "bootstrap")}  # fmt: skip
    context = {
        "archs": args.arch_list, "command": command_line(ENV_VARS), "machine_text": describe_machine(info),
        "started": started, "total_minutes": (time.time() - study.start) / 60,
        "data_text": f"{manifest.get('dataset', data.name)} {manifest['source_lang']}->{manifest['target_lang']} "
                     f"(`{_shown(data)}`{', first ' + str(args.train_lines) + ' training pairs' if args.train_lines else ''})",
        "budget_text": budget_text, "jobs": args.jobs, "threads": args.threads,
        "setup_text": f"`{' '.join(args.model_arg_list) or '(preset width)'}`, Adam {args.setup.adam_betas}, peak lr "
                      f"{'/'.join(f'{lr:g}' for lr in args.lr_list)}, dropout {args.setup.dropout}, label smoothing "
                      f"{args.setup.label_smoothing}, weight decay {args.setup.weight_decay}, {args.setup.max_tokens} "
                      f"tokens per update, validation every {args.valid_every} updates"
                      + (f", extra `{shlex.join(args.extra)}`" if args.extra else ""),
        "test_set": study.test_set["name"], "sentences": any_result["sentences"], "beam": any_result["beam"],
        "bootstrap": args.bootstrap, "signature": any_result["signature"],
        "curves_png": str(curves_png), "bleu_png": str(bleu_png),
        "reading": study_report.reading(rows, budget_text, missing=len(missing), total=len(runs) + len(missing)),
        "missing": [run.name for run in missing], "report_only": args.report_only,
    }  # fmt: skip
    (out / "results.md").write_text(study_report.markdown(rows, choices, context), encoding="utf-8")
    write_json(out / "results.json", {
        "command": context["command"], "machine": info, "started": started,
        "total_minutes": round(context["total_minutes"], 1), "budget": as_dict(args.budget),
        "budget_kind": "wall-clock training minutes" if args.budget.minutes else "updates",
        "setup": as_dict(args.setup), "settings": settings, "data": _shown(data), "test_set": study.test_set["name"],
        "models": rows, "reading": context["reading"], "missing": context["missing"], "report_only": args.report_only,
        "choices": [{"arch": a, "variant": v, **c} for (a, v), c in choices.items()],
        "runs": [{**as_dict(run), "name": run.name, "command": json.loads((study.run_dir(run) / "command.json").read_text())["command"],
                  **{k: v for k, v in r.items() if k not in ("hyps",)}} for run, r in results.items()],
    })  # fmt: skip
    return {**context, "rows": rows}


def console_table(rows: list[dict]) -> str:
    lines = [f"{'model':<32} {'variant':<8} {'seeds':>5} {'BLEU':>13} {'chrF':>13} {'valid loss':>10} {'updates':>7}"]
    for r in rows:
        lines.append(f"{r['arch']:<32} {r['variant']:<8} {len(r['seeds']):>5} {study_report._fmt(r['bleu'], r['bleu_std']):>13} "
                     f"{study_report._fmt(r['chrf'], r['chrf_std']):>13} {study_report._fmt(r['valid_loss'], None, 3):>10} "
                     f"{r['updates'] or 0:>7.0f}")  # fmt: skip
    return "\n".join(lines)


def main(argv=None, defaults: Defaults | None = None):
    # fairseq's and matplotlib's loggers and warnings stay off the console: runs log to their own files
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    args = parse_args(argv, defaults)
    tag = args.defaults.tag
    started = _now()
    check_archs(args.arch_list, "ARCHS (--archs)")
    out = args.out_dir
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tuning, later = grid(args)
    n_runs = len(tuning) + len(later)
    log(tag, f"{len(args.arch_list)} model(s) x {len(args.seed_list)} seed(s)"
             f"{' x ' + str(len(args.variant_list)) + ' variants' if len(args.variant_list) > 1 else ''}"
             f"{' (+ lr/warm-up choice)' if len(tuning) > len(args.arch_list) * len(args.variant_list) else ''}: {n_runs} runs of "
             f"{args.budget.describe()}, {args.jobs} at a time, {args.threads} thread(s) each; output in {out}")  # fmt: skip
    log(tag, "data ...")
    data = prepare_data(args, logs)
    manifest = read_manifest(data)
    info = machine()
    study = Study(args, data, manifest)
    if args.report_only:
        runs, missing = study.finished_runs(tuning, later)
        if not runs:
            raise RecipeError(f"REPORT_ONLY (--report-only): no run in OUT_DIR (--out-dir)={out} has finished and been "
                              "evaluated yet")  # fmt: skip
        log(tag, f"report only: {len(runs)} of {n_runs} runs finished" + (f"; missing {', '.join(r.name for r in missing)}" if missing else ""))
        context = report(args, study, runs, data, manifest, info, started, missing)
        print(f"\n{console_table(context['rows'])}\n\ntables: {out / 'results.md'}, {out / 'results.json'}", flush=True)
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        runs = study.execute(tuning, later)
    except BaseException:
        for proc in [*study.train.values(), *study.evals.values()]:
            proc.stop()
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            log(tag, "interrupted: run the same command again to continue (finished runs are kept)")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    context = report(args, study, runs, data, manifest, info, started)
    print("\n" + console_table(context["rows"]), flush=True)
    print(f"\nplots: {context['curves_png']}, {context['bleu_png']}\ntables: {out / 'results.md'}, {out / 'results.json'}")
    print("\n" + context["reading"], flush=True)
    log(tag, f"done in {_minutes(time.time() - study.start)}")


if __name__ == "__main__":
    run_main(TAG, main)
