#!/usr/bin/env python
"""A study (recipes/study.sh): a grid of architectures x seeds (x set-up variants) trained on one prepared
dataset under an equal budget, translated, scored and compared.

    ARCHS='transformer_preln_iwslt_e12d12 residual_iwslt_e12d12' SEEDS='1 2' MAX_UPDATE=1000 \\
        MULTI30K_DIR=../shared/data/multi30k bash recipes/study.sh

1. data: Multi30k prepared with scripts/data/prepare_multi30k.py (``--raw-dir``/MULTI30K_DIR, or a download),
   or any prepared ``--data-bin``/DATA_BIN (a directory with recipe.json);
2. training: every run gets the same fairseq-train command (study_common.train_command) except ``--arch``,
   the seed, the variant's schedule and, with LRS/WARMUPS, the lr and warm-up. The budget is equal: MAX_UPDATE
   updates, or TRAIN_MINUTES of training time (then MAX_UPDATE only caps it); with PATIENCE, a run also stops
   after that many validations in a row without a lower validation loss (early stopping, study_run). With
   several LRS or WARMUPS, each architecture tries them all with the first seed, keeps the one with the lowest
   best validation loss and trains the other seeds with it (study_stats). JOBS runs go side by side, THREADS
   threads each. The variables are checked against each other before anything starts (study_checks);
3. every run's checkpoint_best.pt is translated and scored with scripts/training/evaluate_recipe.py (sacrebleu
   BLEU and chrF; beam from the dataset's recipe.json; output length capped at 1.5 x source + 10 pieces so that
   an untrained model's babbling costs no more than a trained model's translations);
4. results.md, results.json, curves.png and bleu.png in OUT_DIR, naming the command and the machine, with the
   paired bootstrap's p-value and 95% interval of every difference against the first architecture (and, with
   PAIRS, between the chosen SYSTEM:BASELINE pairs), and whether each run was still improving (study_report,
   study_stats).

Language models (study_lm.py): a DATA_BIN whose recipe.json says ``"task": "language_modeling"``, or LM=1
(TASK=language_modeling) with MULTI30K_DIR, runs the same grid on {family}_lm_* architectures with perplexity
as the score and a paired bootstrap on per-sentence log-likelihoods instead of BLEU (study_lm_report.py).

Resuming: finished runs are skipped, interrupted ones continue from their last checkpoint (study_run). Run it
again with the same settings after an interruption (Ctrl-C stops all runs).

On a cluster: EXECUTOR=slurm makes every run's training and evaluation one submitit job (job arrays, requeued at a
time limit or preemption and resumed from the checkpoint), EXECUTOR=submitit-local the same jobs on this machine;
the records and the report are the local path's (study_submitit.py, docs/study_tool.md). DRY_RUN=1 prints the jobs.

The console gets a compact view only (a line per run: updates, train/valid loss, elapsed and remaining time;
redrawn in place on a terminal, otherwise printed at every fifth of the work); fairseq's own output goes to
``OUT_DIR/runs/RUN/train.log`` (JSON records, ``--log-format json``) and ``OUT_DIR/logs/``.
"""

import argparse
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
from pathlib import Path

from scripts.lm.prepare_lm import DEFAULT_VOCAB as LM_DEFAULT_VOCAB
from scripts.study import (
    study_checks,
    study_lm,
    study_lm_report,
    study_report,
    study_submitit,
)
from scripts.study.study_common import (
    REPO,
    VARIANTS,
    Budget,
    RecipeError,
    Setup,
    check_archs,
    log,
    machine,
    read_manifest,
    run_main,
    warn_misspelt,
)
from scripts.study.study_console import _minutes, console_table
from scripts.study.study_run import INTERRUPTED, Study, _now, grid  # noqa: F401  (INTERRUPTED, grid: for the tests and main_job)

TAG = "study"
WIDTH_128 = ("--encoder-embed-dim 128 --decoder-embed-dim 128 "
             "--encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512")  # fmt: skip
ENV_VARS = ("ARCHS", "SEEDS", "VARIANTS", "MAX_UPDATE", "TRAIN_MINUTES", "MODEL_ARGS", "TRAIN_LINES", "MULTI30K_DIR",
            "DATA_BIN", "OUT_DIR", "LRS", "WARMUPS", "JOBS", "THREADS", "MAX_TOKENS", "VALID_EVERY", "BOOTSTRAP",
            "ARCH_LRS", "VOCAB_SIZE", "SRC", "TGT", "VERIFY_COUNTS", "PATIENCE", "LEVEL_MARGIN", "FALLING_LAST", "FALLING_SLOPE", "TASK", "LM",
            "PAIRS", *study_submitit.ENV_VARS)  # fmt: skip


@dataclass
class Defaults:
    """What the command line starts from: the study's, or the main job's (scripts/training/main_job.py)."""

    archs: str = "transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12 residual_iwslt_e12d12"
    seeds: str = "1 2"
    max_update: int = 1000
    arch_lrs: str = ""
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
    p.add_argument("--archs", default=None, help=f"ARCHS: architectures, the first is the baseline (default '{d.archs}'; "
                                                  f"for a language-modeling dataset '{study_lm.ARCHS}')")
    p.add_argument("--task", default=None, help="TASK (LM=1: language_modeling): translation or language_modeling "
                                                "(default: DATA_BIN's recipe.json says, else translation; see study_lm.py)")
    p.add_argument("--seeds", default=d.seeds, help=f"SEEDS: random seeds (default '{d.seeds}')")
    p.add_argument("--variants", default="warmup", help=f"VARIANTS: set-up variants of {', '.join(VARIANTS)} (default warmup)")
    p.add_argument("--max-update", type=int, default=None,
                   help=f"MAX_UPDATE: updates per run (default {d.max_update}; with TRAIN_MINUTES, a cap, 0 = none)")
    p.add_argument("--train-minutes", type=float, default=0.0,
                   help="TRAIN_MINUTES: budget in training minutes per run instead of updates (default 0: updates)")
    p.add_argument("--patience", type=int, default=0,
                   help="PATIENCE: stop a run after this many validations in a row without a lower valid loss "
                        "(fairseq's --patience, kept across resumes; default 0: none, MAX_UPDATE only)")
    p.add_argument("--model-args", default=None, help=f"MODEL_ARGS: fairseq-train options for every model (default "
                                                       f"'{d.model_args}'; language models '{study_lm.MODEL_ARGS}')")
    p.add_argument("--lrs", default="", help="LRS: peak learning rates to choose from per model (default: 1e-3; "
                                             "language models 1.6e-3)")
    p.add_argument("--warmups", default="", help="WARMUPS: warm-up updates to choose from per model (default: 400)")
    p.add_argument("--arch-lrs", default=None,
                   help="ARCH_LRS: an architecture's own peak lr (and warm-up), chosen before, e.g. by an LRS study, or "
                        "its own grid: space-separated ARCH=LR[,LR...][@WARMUP[,WARMUP...]]; those architectures try "
                        "these instead of LRS/WARMUPS (default: " + (f"'{d.arch_lrs}', unless LRS is given" if d.arch_lrs else "none") + ")")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"MAX_TOKENS: tokens per update (default {Setup.max_tokens}; language models "
                        f"{study_lm.LMSetup.max_tokens})")
    p.add_argument("--valid-every", type=int, default=0,
                   help="VALID_EVERY: validate and save a checkpoint every N updates (default: MAX_UPDATE / 8, or 100)")
    p.add_argument("--jobs", type=int, default=0,
                   help="JOBS: runs side by side (default: " + ("every run at once" if d.jobs == "all" else "one per core") + ")")
    p.add_argument("--threads", type=int, default=0, help="THREADS: threads per run (default: cores / JOBS, at least 1)")
    p.add_argument("--bootstrap", type=int, default=1000, help="BOOTSTRAP: paired bootstrap samples (default 1000)")
    p.add_argument("--level-margin", type=float, default=1.0,
                   help="LEVEL_MARGIN: BLEU margin (perplexity points for language models); two models are called "
                        "level only when every seed's 95%% interval of the difference lies inside +-margin (default 1.0, > 0)")
    p.add_argument("--pairs", default="",
                   help="PAIRS: more paired comparisons, space-separated SYSTEM:BASELINE pairs of architectures of ARCHS "
                        "(e.g. 'b_e6d6:a_e6d6'), reported beside those against the first architecture (default: none)")
    p.add_argument("--falling-last", type=int, default=3,
                   help="FALLING_LAST: validations the still-falling slope is fitted over (default 3, >= 2)")
    p.add_argument("--falling-slope", type=float, default=0.01,
                   help="FALLING_SLOPE: a run's valid loss counts as still falling when its slope is below minus this, "
                        "in loss per 100 updates (default 0.01, >= 0)")
    p.add_argument("--raw-dir", type=Path, help="MULTI30K_DIR: a local Multi30k copy (default: download)")
    p.add_argument("--data-bin", type=Path, help="DATA_BIN: an already prepared dataset instead of Multi30k")
    p.add_argument("--train-lines", type=int, default=None, help="TRAIN_LINES: only the first N training pairs (default 0: all)")
    p.add_argument("--vocab-size", type=int, default=None, help="VOCAB_SIZE: SentencePiece pieces (default 8000 joint for translation, 4000 for LM=1)")
    p.add_argument("--src", default="de", help="SRC: source language (default de)")
    p.add_argument("--tgt", default="en", help="TGT: target language (default en; the Multi30k side of an LM study)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="VERIFY_COUNTS=0: accept a Multi30k copy whose line counts differ from the published ones")
    p.add_argument("--report-only", action="store_true",
                   help="REPORT_ONLY=1: train nothing; report the runs finished so far and list the missing ones")
    p.add_argument("--out-dir", type=Path, default=d.out_dir, help=f"OUT_DIR: everything goes here (default {d.out_dir})")
    study_submitit.add_options(p)  # EXECUTOR and its settings (a cluster through submitit), DRY_RUN
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
    args.task = study_lm.resolve_task(args, read_manifest)
    lm = args.task == study_lm.TASK
    args.archs = args.archs if args.archs is not None else (study_lm.ARCHS if lm else d.archs)
    args.model_args = args.model_args if args.model_args is not None else (study_lm.MODEL_ARGS if lm else d.model_args)
    setup_class = study_lm.LMSetup if lm else Setup
    args.max_tokens = setup_class.max_tokens if args.max_tokens is None else args.max_tokens
    args.arch_list = args.archs.split()
    if not args.arch_list:
        raise RecipeError("ARCHS (--archs) is empty: give at least one architecture")
    if len(set(args.arch_list)) != len(args.arch_list):
        raise RecipeError(f"ARCHS (--archs)={args.archs!r}: an architecture appears twice")
    args.pair_list = study_checks.parse_pairs(args.pairs, args.arch_list)
    args.seed_list = _numbers(args.seeds, "SEEDS (--seeds)", int, "integers, e.g. '1 2'")
    if not args.seed_list:
        raise RecipeError("SEEDS (--seeds) is empty: give at least one seed")
    args.variant_list = args.variants.replace(",", " ").split()
    bad = [v for v in args.variant_list if v not in VARIANTS]
    if bad or not args.variant_list or len(set(args.variant_list)) != len(args.variant_list):
        raise RecipeError(f"VARIANTS (--variants)={args.variants!r}: allowed {', '.join(VARIANTS)}, each once")
    args.lr_list = _numbers(args.lrs, "LRS (--lrs)", float, "numbers, e.g. '5e-4 1e-3'") or [setup_class.lr]
    if any(not 0 < lr < 1 for lr in args.lr_list):
        raise RecipeError(f"LRS (--lrs)={args.lrs!r}: every learning rate must be in (0, 1)")
    args.warmup_list = _numbers(args.warmups, "WARMUPS (--warmups)", int, "integers, e.g. '100 400'") or [setup_class.warmup]
    if any(w < 1 for w in args.warmup_list):
        raise RecipeError(f"WARMUPS (--warmups)={args.warmups!r}: warm-up updates must be >= 1 (the no-warm-up "
                          "schedules are VARIANTS=nowarmup, against warmdecay on the same shape)")  # fmt: skip
    if args.arch_lrs is None:
        # the defaults' own settings, for those of their architectures still in ARCHS; an LRS given asks for a grid
        # for every model instead (it would otherwise be ignored for them)
        own = [e for e in d.arch_lrs.split() if e.partition("=")[0] in args.arch_list]
        args.arch_lrs = "" if args.lrs.strip() else " ".join(own)
    args.arch_settings = study_checks.parse_arch_lrs(args.arch_lrs, args.arch_list)
    if args.train_minutes < 0:
        raise RecipeError(f"TRAIN_MINUTES (--train-minutes)={args.train_minutes:g}: must be >= 0")
    if args.max_update is None:
        args.max_update = 0 if args.train_minutes else d.max_update
    if args.max_update < 0 or (not args.train_minutes and args.max_update == 0):
        raise RecipeError(f"MAX_UPDATE (--max-update)={args.max_update}: must be > 0 (or set TRAIN_MINUTES for a "
                          "time budget)")  # fmt: skip
    decaying = [v for v in args.variant_list if v in ("nowarmup", "warmdecay")]
    if decaying and not args.max_update:
        raise RecipeError(f"VARIANTS={decaying[0]} decays the lr linearly to 0 at the last update, so it needs MAX_UPDATE > 0 "
                          "(with TRAIN_MINUTES too)")  # fmt: skip
    if not args.level_margin > 0:
        raise RecipeError(f"LEVEL_MARGIN (--level-margin)={args.level_margin:g}: must be > 0 "
                          f"({'perplexity points' if lm else 'BLEU'})")  # fmt: skip
    study_lm.check_task_archs(args.arch_list, args.task)
    if lm and args.train_lines is not None:
        raise RecipeError("TRAIN_LINES with a language-modeling study: scripts/lm/prepare_lm.py prepares the whole "
                          "Multi30k side; drop TRAIN_LINES")  # fmt: skip
    args.explicit = {name for name in ("train_lines", "vocab_size") if getattr(args, name) is not None}
    args.train_lines = 0 if args.train_lines is None else args.train_lines
    if args.vocab_size is None:  # Multi30k's English side alone allows at most 7,928 pieces (prepare_lm's default)
        args.vocab_size = LM_DEFAULT_VOCAB["multi30k"] if lm else 8000
    for name, variable, low in (("max_tokens", "MAX_TOKENS", 1), ("valid_every", "VALID_EVERY", 0), ("jobs", "JOBS", 0),
                                ("threads", "THREADS", 0), ("bootstrap", "BOOTSTRAP", 0), ("train_lines", "TRAIN_LINES", 0),
                                ("vocab_size", "VOCAB_SIZE", 1), ("patience", "PATIENCE", 0), ("falling_last", "FALLING_LAST", 2),
                                ("falling_slope", "FALLING_SLOPE", 0)):  # fmt: skip
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
    study_submitit.validate(args, runs, cores)  # EXECUTOR's settings; with submitit, JOBS and THREADS too
    args.jobs = args.jobs or (runs if d.jobs == "all" else cores)
    args.threads = args.threads or max(1, cores // args.jobs)
    args.budget = Budget(max_update=args.max_update, minutes=args.train_minutes, patience=args.patience)
    args.valid_every = args.valid_every or (max(1, args.max_update // 8) if not args.train_minutes else 100)
    args.setup = setup_class(max_tokens=args.max_tokens)
    study_checks.check_pairs(args, cores)


# ------------------------------------------------------------------------------------------------- data


def prepare_data(args, logs: Path) -> Path:
    """The binarized dataset: DATA_BIN as given, or Multi30k prepared once into OUT_DIR/data-bin."""
    if args.data_bin is not None:
        read_manifest(args.data_bin)
        return args.data_bin
    if args.task == study_lm.TASK:
        return _prepare_lm(args, logs)
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
    cmd = [sys.executable, "-m", "scripts.data.prepare_multi30k", "--src", args.src, "--tgt", args.tgt,
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
        study_checks.explain_vocabulary_error(args, text)
        raise RecipeError(f"data preparation failed: {errors[-1] if errors else 'see ' + str(log_file)}")
    return dest


def _prepare_lm(args, logs: Path) -> Path:
    """The Multi30k side TGT as a language-modeling corpus, prepared once into OUT_DIR/data-bin/lm_multi30k_TGT
    (scripts/lm/prepare_lm.py refuses to rebuild it with other settings)."""
    dest = args.out_dir / "data-bin" / f"lm_multi30k_{args.tgt}"
    if (dest / "recipe.json").is_file():
        old = json.loads((dest / "recipe.json").read_text(encoding="utf-8")).get("settings") or {}
        if old.get("vocab_size") == args.vocab_size and old.get("lang") == args.tgt:
            return dest
    log_file = logs / "prepare.log"
    with open(log_file, "w", encoding="utf-8") as out:
        status = subprocess.run(study_lm.prepare_command(args, dest), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                check=False).returncode  # fmt: skip
    if status != 0:
        text = log_file.read_text(encoding="utf-8", errors="replace")
        errors = [line.split("error: ", 1)[1] for line in text.splitlines() if "] error: " in line]
        limit = study_checks._TOO_HIGH.search(text)
        if limit:
            raise RecipeError(f"MULTI30K_DIR and VOCAB_SIZE conflict: VOCAB_SIZE={args.vocab_size} SentencePiece pieces, "
                              f"but the {args.tgt} side of {args.raw_dir or 'Multi30k'} allows at most {limit.group(2)} "
                              f"(SentencePiece's own limit for this text); set VOCAB_SIZE <= {limit.group(2)}")  # fmt: skip
        raise RecipeError(f"LM data preparation failed: {errors[-1] if errors else 'see ' + str(log_file)}")
    return dest


# ---------------------------------------------------------------------------------------------- the grid


def _interrupt(*_):
    raise KeyboardInterrupt  # SIGTERM stops the runs like Ctrl-C: nothing is left training in the background


def main(argv=None, defaults: Defaults | None = None):
    # fairseq's and matplotlib's loggers and warnings stay off the console: runs log to their own files
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    args = parse_args(argv, defaults)
    tag = args.defaults.tag
    warn_misspelt(tag, (*ENV_VARS, "REPORT_ONLY", "DRY_RUN"))
    started = _now()
    check_archs(args.arch_list, "ARCHS (--archs)", lm=args.task == study_lm.TASK)
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
    study_checks.check_vocabulary(args)
    data = prepare_data(args, logs)
    manifest = read_manifest(data)
    info = machine()
    study = Study(args, data, manifest)
    lm = args.task == study_lm.TASK
    reporter, table = (study_lm_report, study_lm_report.console_table) if lm else (study_report, console_table)
    if args.report_only:
        runs, missing = study.finished_runs(tuning, later)
        if not runs:
            raise RecipeError(f"REPORT_ONLY (--report-only): no run in OUT_DIR (--out-dir)={out} has finished and been "
                              "evaluated yet")  # fmt: skip
        log(tag, f"report only: {len(runs)} of {n_runs} runs finished" + (f"; missing {', '.join(r.label for r in missing)}" if missing else ""))
        context = reporter.report(args, study, runs, data, manifest, info, started, ENV_VARS, REPO, missing)
        print(f"\n{table(context['rows'])}\n\ntables: {out / 'results.md'}, {out / 'results.json'}", flush=True)
        return
    if args.dry_run:
        study_submitit.dry_run(study, tuning, later)
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        # EXECUTOR=local: JOBS processes here; otherwise submitit jobs, each Study.execute of one run (study_submitit)
        runs = study.execute(tuning, later) if args.executor == "local" else study_submitit.execute(study, tuning, later)
    except BaseException:
        for proc in [*study.train.values(), *study.evals.values()]:
            proc.stop()
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            log(tag, "interrupted: run the same command again to continue (finished runs are kept)")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if study.failed:  # the report of what finished, as REPORT_ONLY makes it, then the failures
        failures = f"{len(study.failed)} of {n_runs} runs failed ({'; '.join(study.failed.values())})"
        if study.blocked:
            failures += (f"; not started, waiting for their model's failed tuning run: "
                         f"{', '.join(f'{r.arch} seed {r.seed}' for r in study.blocked)}")  # fmt: skip
        runs, missing = study.finished_runs(tuning, later)
        try:
            if runs:
                reporter.report(args, study, runs, data, manifest, info, started, ENV_VARS, REPO, missing)
        except Exception as err:  # the failures stay the message; the report's own error joins them
            raise RecipeError(f"{failures}; the partial report failed too: {err}") from err
        raise RecipeError(f"{failures}{'; the partial report (results.md) covers the others' if runs else ''}; after "
                          "fixing the cause, the same command continues (finished runs are kept)")  # fmt: skip
    context = reporter.report(args, study, runs, data, manifest, info, started, ENV_VARS, REPO)
    print("\n" + table(context["rows"]), flush=True)
    print(f"\nplots: {context['curves_png']}, {context.get('ppl_png') or context['bleu_png']}\ntables: {out / 'results.md'}, {out / 'results.json'}")
    print("\n" + context["reading"], flush=True)
    log(tag, f"done in {_minutes(time.time() - study.start)}")


if __name__ == "__main__":
    run_main(TAG, main)

