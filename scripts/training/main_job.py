#!/usr/bin/env python
"""The main job (recipes/main_job.sh): ResiDual against its Pre-LN baseline on Multi30k De->En, at CPU scale.

1. prepare Multi30k (joint SentencePiece 8k) with scripts/data/prepare_multi30k.py;
2. train every architecture of ``--archs`` with scripts/training/train_recipe.py on the same data, seed, batch and
   time budget; by default both at once, one CPU thread each (small models run faster on one thread, and
   two cores then train two models in the time of one);
3. evaluate each on test_2016_flickr with scripts/training/evaluate_recipe.py (beam 5, sacrebleu);
4. print a comparison table (BLEU, chrF, parameters, updates, training time) and write it to
   ``OUT_DIR/results.md`` and ``OUT_DIR/results.json``.

Defaults (about 25 minutes on 2 cores): E6D6 at width 128 (FFN 512, 4 heads) and 22 minutes of training per
model (fairseq's ``--stop-time-hours``). A budget of time rather than of updates keeps the job inside
30 minutes on any machine; the table reports how many updates each model made. Longer and better:
``--train-minutes 120``, wider models (``--model-args ''`` keeps the presets' width 256), other
architectures (``--archs 'residual_iwslt_e12d12 transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12'``).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from training_common import REPO, RecipeError, log, run_main, write_json

TAG = "main"
SCRIPTS = Path(__file__).resolve().parent
DEFAULT_ARCHS = "residual_iwslt_e6d6 transformer_preln_iwslt_e6d6"
DEFAULT_MODEL_ARGS = ("--encoder-embed-dim 128 --decoder-embed-dim 128 "
                      "--encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512")  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", default=DEFAULT_ARCHS, help=f"architectures to compare (default '{DEFAULT_ARCHS}')")
    p.add_argument("--model-args", default=DEFAULT_MODEL_ARGS,
                   help=f"fairseq-train options for every model (default '{DEFAULT_MODEL_ARGS}')")
    p.add_argument("--train-minutes", type=float, default=22.0, help="training time per model (default 22)")
    p.add_argument("--max-update", type=int, default=0, help="also stop after N updates (default 0: time only)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch (default 2048)")
    p.add_argument("--raw-dir", type=Path, help="local Multi30k directory (MULTI30K_DIR); default: download")
    p.add_argument("--src", default="de", help="source language (default de)")
    p.add_argument("--tgt", default="en", help="target language (default en)")
    p.add_argument("--train-lines", type=int, default=0, help="use only N training pairs (default 0: all)")
    p.add_argument("--vocab-size", type=int, default=8000, help="joint SentencePiece pieces (default 8000)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="accept a Multi30k copy whose line counts differ from the published ones")
    p.add_argument("--parallel", default="auto", help="train/evaluate the models at once: auto (with >= 2 cores), 1, 0")
    p.add_argument("--threads", type=int, default=0, help="threads per model (default 0: cores / models at once)")
    p.add_argument("--out-dir", type=Path, default=REPO / "work_dirs" / "main_job", help="everything goes here")
    args = p.parse_args(argv)
    args.arch_list = args.archs.split()
    if not args.arch_list:
        raise RecipeError("--archs (ARCHS) is empty")
    if len(set(args.arch_list)) != len(args.arch_list):
        raise RecipeError(f"--archs (ARCHS) names an architecture twice: {args.archs}")
    if args.train_minutes <= 0:
        raise RecipeError(f"--train-minutes {args.train_minutes} (TRAIN_MINUTES): must be > 0")
    if args.parallel not in ("auto", "1", "0"):
        raise RecipeError(f"--parallel {args.parallel!r} (PARALLEL): allowed auto, 1, 0")
    if args.max_update < 0 or args.threads < 0 or args.train_lines < 0:
        raise RecipeError("--max-update, --threads and --train-lines must be >= 0")
    return args


def check_archs(archs: list[str]) -> None:
    """Every architecture must be registered: checked before anything is prepared or trained."""
    from train_recipe import check_architecture

    for arch in archs:
        check_architecture(arch)


class Job:
    """A subprocess whose output is echoed line by line with a prefix and kept in a log file."""

    def __init__(self, name: str, cmd: list[str], log_file: Path, threads: int, prefix: bool):
        self.name, self.log_file = name, log_file
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        self.thread = threading.Thread(target=self._echo, args=(f"[{name}] " if prefix else "",), daemon=True)
        self.thread.start()

    def _echo(self, prefix: str) -> None:
        assert self.proc.stdout is not None
        with open(self.log_file, "w", encoding="utf-8") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                sys.stdout.write(prefix + line)
                sys.stdout.flush()

    def wait(self) -> int:
        status = self.proc.wait()
        self.thread.join()
        return status


def run_jobs(jobs: list[tuple[str, list[str], Path]], parallel: bool, threads: int, what: str) -> None:
    """Run the jobs (all at once if ``parallel``); a failure names the job and its log."""
    running: list[Job] = []
    failed = []
    for name, cmd, log_file in jobs:
        job = Job(name, cmd, log_file, threads, prefix=parallel)
        if parallel:
            running.append(job)
        elif job.wait() != 0:
            failed.append(job)
            break
    failed += [job for job in running if job.wait() != 0]
    if failed:
        raise RecipeError(f"{what} of {', '.join(j.name for j in failed)} failed; see {failed[0].log_file}")


def elapsed(start: float) -> str:
    return f"{(time.monotonic() - start) / 60:.1f} min"


def table(rows: list[dict], settings: dict) -> str:
    caption = (
        f"Multi30k {settings['src']}->{settings['tgt']}, test_2016_flickr ({rows[0]['sentences']} sentences), "
        f"beam {rows[0]['beam']}; every model trained for {settings['train_minutes']:g} min"
        f"{' or ' + str(settings['max_update']) + ' updates, whichever came first,' if settings['max_update'] else ''} with "
        f"`{settings['model_args'] or '(preset width)'}`, {settings['threads']} thread(s) each"
        f"{', at the same time' if settings['parallel'] else ''}."
    )
    lines = [
        caption,
        "",
        "| model | sacreBLEU | chrF | parameters | updates | training time | valid loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        loss = f"{r['valid_loss']:.3f}" if r["valid_loss"] is not None else "-"
        lines.append(f"| {r['arch']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['parameters'] or 0:,} | "
                     f"{r['num_updates']} | {r['train_seconds'] / 60:.1f} min | {loss} |")  # fmt: skip
    lines += ["", f"sacreBLEU signature: `{rows[0]['signature']}`", ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    start = time.monotonic()
    check_archs(args.arch_list)
    if args.raw_dir is not None and not args.raw_dir.is_dir():
        raise RecipeError(f"MULTI30K_DIR={args.raw_dir}: no such directory")
    cores = os.cpu_count() or 1
    parallel = (cores >= 2) if args.parallel == "auto" else args.parallel == "1"
    at_once = len(args.arch_list) if parallel else 1
    threads = args.threads or max(1, cores // at_once)
    out = args.out_dir
    name = f"multi30k_{args.src}_{args.tgt}"
    data = out / "data-bin" / name
    settings = {"src": args.src, "tgt": args.tgt, "archs": args.arch_list, "model_args": args.model_args,
                "train_minutes": args.train_minutes, "max_update": args.max_update, "max_tokens": args.max_tokens,
                "train_lines": args.train_lines, "vocab_size": args.vocab_size, "parallel": parallel, "threads": threads}  # fmt: skip
    log(TAG, f"{len(args.arch_list)} models, {args.train_minutes:g} min of training each, "
             f"{'at the same time' if parallel else 'one after the other'}, {threads} thread(s) each; "
             f"output in {out}")  # fmt: skip

    log(TAG, "step 1/3: data")
    prepare = [sys.executable, SCRIPTS.parent / "data" / "prepare_multi30k.py", "--src", args.src, "--tgt", args.tgt,
               "--work-dir", out / "data" / name, "--dest-dir", data, "--train-lines", str(args.train_lines),
               "--vocab-size", str(args.vocab_size)]  # fmt: skip
    prepare += ["--raw-dir", args.raw_dir] if args.raw_dir else []
    prepare += [] if args.verify_counts else ["--no-verify-counts"]
    run_jobs([("prepare", prepare, out / "logs" / "prepare.log")], False, max(1, cores), "data preparation")

    log(TAG, f"step 2/3: training ({elapsed(start)} so far)")
    extra = shlex.split(args.model_args) + ["--stop-time-hours", repr(args.train_minutes / 60), "--log-interval", "50"]
    jobs = []
    for arch in args.arch_list:
        cmd = [sys.executable, SCRIPTS / "train_recipe.py", arch, str(data), "--save-dir", out / "checkpoints" / arch,
               "--max-update", str(args.max_update), "--max-tokens", str(args.max_tokens), "--", *extra]  # fmt: skip
        jobs.append((arch, cmd, out / "logs" / f"{arch}.train.log"))
    run_jobs(jobs, parallel, threads, "training")

    log(TAG, f"step 3/3: evaluation ({elapsed(start)} so far)")
    jobs = []
    for arch in args.arch_list:
        cmd = [sys.executable, SCRIPTS / "evaluate_recipe.py", str(data), out / "checkpoints" / arch / "checkpoint_best.pt",
               "--output-dir", out / "eval" / arch, "--max-tokens", "4000"]  # fmt: skip
        jobs.append((arch, cmd, out / "logs" / f"{arch}.eval.log"))
    run_jobs(jobs, parallel, threads, "evaluation")

    rows = []
    for arch in args.arch_list:
        train = json.loads((out / "checkpoints" / arch / "train_summary.json").read_text(encoding="utf-8"))
        result = json.loads((out / "eval" / arch / "results.json").read_text(encoding="utf-8"))
        test = result["tests"]["test_2016_flickr"]
        rows.append({"arch": arch, "bleu": test["bleu"], "chrf": test["chrf"], "sentences": test["sentences"],
                     "parameters": train["parameters"], "num_updates": train["num_updates"],
                     "train_seconds": train["train_seconds"], "valid_loss": train["valid_loss"],
                     "beam": result["beam"], "signature": result["signatures"]["bleu"]})  # fmt: skip
    text = table(rows, settings)
    (out / "results.md").write_text(text, encoding="utf-8")
    write_json(out / "results.json", {"settings": settings, "models": rows,
                                      "total_minutes": round((time.monotonic() - start) / 60, 1)})  # fmt: skip
    print("\n" + text, flush=True)
    log(TAG, f"done in {elapsed(start)}: {out / 'results.md'}, {out / 'results.json'}")


if __name__ == "__main__":
    run_main(TAG, main)
