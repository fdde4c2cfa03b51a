#!/usr/bin/env python
"""Train a named architecture on a prepared dataset with the papers' hyper-parameters (recipes/train.sh).

    python scripts/training/train_recipe.py residual_iwslt_e12d12 iwslt14_en_de
    python scripts/training/train_recipe.py --gpus 8 crossformer_sg_e6d6 wmt14_en_de -- --keep-last-epochs 2

Where the numbers come from (``--hparams``, by default chosen by the architecture's family):

- ``residual`` (``residual_*``, ``transformer_preln_*``, ``transformer_postln_*``, and any other registered
  architecture): ResiDual (Xie et al. 2023, arXiv:2304.14802) appendix H.2, table 9 (IWSLT-14), table 10
  (WMT) and table 11 (OPUS-100). The tables give no batch size; we use 4,096 tokens per update for IWSLT
  (fairseq's IWSLT recipe) and 32,768 for WMT and OPUS-100 (about Vaswani et al.'s 25k).
- ``crossformer`` (``crossformer_*``): Crossformer appendix A.1 and section 4.1: Vaswani et al.'s optimizer
  and schedule (Adam (0.9, 0.98), inverse square root, 4,000 warm-up updates, peak 512^-0.5 * 4000^-0.5 =
  7e-4), label smoothing 0.1, 50k updates of 4k tokens on IWSLT (Wu et al. 2019's set-up, lr 5e-4,
  dropout 0.3), 100k (En-De) and 60k (En-Fr) updates on WMT, guidance weight alpha = 0.01 (given for IWSLT;
  kept for WMT, where the paper gives none), and on WMT the average of the last 5 checkpoints (Vaswani et
  al.). ``crossformer_sg_*`` train with the criterion ``label_smoothed_cross_entropy_with_guidance``.
- ``dca`` (``dca_*``): the ResiDual table of the dataset, with DeepCrossAttention section 5's optimizer
  where it applies: AdamW (fairseq's ``adam`` decays weights decoupled), betas (0.9, 0.98), weight decay 0.1.
  Section 5's learning rate (1.6e-3, 1,000 warm-up updates) belongs to 262k-token language-model batches;
  the dataset's schedule is kept.

Multi30k is no paper's dataset: its row is the CPU-scale setting measured here (see recipes/main_job.sh).

On a GPU the model trains in fp16 (``--fp16 auto``), and ``residual_transformer`` models then get ResiDual's
dual-branch downscale ``--dual-residual-scale 0.05`` (appendix H.3). Several GPUs use fairseq's own
distributed training (``--distributed-world-size``), with ``--update-freq`` keeping the tokens per update
of the table. Anything after ``--`` goes to fairseq-train last, so it overrides the recipe.
"""

import argparse
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from training_common import (
    MANIFEST,
    PLUGIN_DIR,
    REPO,
    RecipeError,
    fairseq_module,
    log,
    read_manifest,
    run_main,
    split_passthrough,
    write_json,
)

TAG = "train"
GUIDANCE_CRITERION = "label_smoothed_cross_entropy_with_guidance"


@dataclass(frozen=True)
class Hparams:
    source: str  # where the numbers come from
    lr: float
    warmup: int
    dropout: float
    max_update: int
    tokens_per_update: int
    weight_decay: float = 1e-4
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    adam_betas: str = "(0.9, 0.98)"
    average_last: int = 0  # average the last N checkpoints (saved every save_interval_updates)
    save_interval_updates: int = 0
    guidance_weight: float = 0.01  # crossformer_sg only


# CPU scale (no paper trains on Multi30k): small batches and a short warm-up, because a CPU run makes a
# few thousand updates at most; lr 1e-3 with 400 warm-up updates trains Pre-LN E12D12 at width 128 here
MULTI30K = Hparams("CPU-scale setting for Multi30k (no paper trains on it)", lr=1e-3, warmup=400,
                   dropout=0.3, max_update=20_000, tokens_per_update=2048)  # fmt: skip

RESIDUAL = {
    "iwslt14": Hparams("ResiDual table 9", lr=5e-4, warmup=4000, dropout=0.3, max_update=300_000,
                       tokens_per_update=4096),
    "wmt14_en_de": Hparams("ResiDual table 10", lr=1e-3, warmup=4000, dropout=0.3, max_update=500_000,
                           tokens_per_update=32768),
    "opus100": Hparams("ResiDual table 11", lr=1e-3, warmup=4000, dropout=0.1, max_update=100_000,
                       tokens_per_update=32768),
    "multi30k": MULTI30K,
}  # fmt: skip
RESIDUAL["wmt14_en_fr"] = replace(RESIDUAL["wmt14_en_de"], source="ResiDual table 10 (its WMT row, for En-Fr)")

_VASWANI_WMT = Hparams("Crossformer A.1 (Vaswani et al. base)", lr=7e-4, warmup=4000, dropout=0.1,
                       max_update=100_000, tokens_per_update=32768, weight_decay=0.0, average_last=5,
                       save_interval_updates=1000)  # fmt: skip
CROSSFORMER = {
    "iwslt14": Hparams("Crossformer 4.1/A.1 (Wu et al. 2019 IWSLT set-up)", lr=5e-4, warmup=4000, dropout=0.3,
                       max_update=50_000, tokens_per_update=4096),
    "wmt14_en_de": _VASWANI_WMT,
    "wmt14_en_fr": replace(_VASWANI_WMT, max_update=60_000),
    "multi30k": MULTI30K,
}  # fmt: skip

HPARAMS = ("auto", "residual", "crossformer", "dca")
DATASETS = ("iwslt14", "wmt14_en_de", "wmt14_en_fr", "opus100", "multi30k")


def registered_architectures() -> dict[str, str]:
    """{arch: model} of every architecture fairseq knows once the plugin is imported."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    import fairseq_plugins  # noqa: F401  (registers the plugin's architectures)

    return dict(ARCH_MODEL_NAME_REGISTRY)


def check_architecture(arch: str) -> str:
    """The model name of ``arch``; an unknown name stops with the plugin's families listed."""
    archs = registered_architectures()
    if arch not in archs:
        plugin = sorted({a.rsplit("_", 1)[0] + "_*" for a in archs if re.search(r"_e\d+d\d+$", a)})
        close = [a for a in sorted(archs) if a.split("_")[0] == arch.split("_")[0]][:8]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise RecipeError(
            f"unknown architecture {arch!r} (ARCH): not registered with fairseq after importing fairseq_plugins. "
            f"Families: {', '.join(plugin)} with depths e6d6 e12d12 e18d18 e24d24 e12d6 e18d6 e24d6 e36d6{hint}"
        )
    return archs[arch]


def family_hparams(arch: str) -> str:
    if arch.startswith("crossformer_"):
        return "crossformer"
    if arch.startswith("dca_"):
        return "dca"
    return "residual"


def choose_hparams(paper: str, dataset: str) -> Hparams:
    if dataset not in DATASETS:
        raise RecipeError(f"dataset {dataset!r} (in {MANIFEST}): no hyper-parameters; known: {', '.join(DATASETS)}")
    if paper == "crossformer":
        if dataset in CROSSFORMER:
            return CROSSFORMER[dataset]
        log(TAG, f"Crossformer gives no setting for {dataset}: using ResiDual's")
    hp = RESIDUAL[dataset]
    if paper == "dca":
        hp = replace(hp, source=hp.source + " + DCA section 5 optimizer (AdamW, weight decay 0.1)", weight_decay=0.1)
    return hp


def cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_data(dataset: str, data_bin: Path | None) -> Path:
    path = data_bin or (Path(dataset) if Path(dataset).is_dir() else REPO / "data-bin" / dataset)
    if not path.is_dir():
        raise RecipeError(f"DATASET={dataset!r}: no data directory {path}; prepare it with recipes/prepare_*.sh "
                          "or set DATA_BIN")  # fmt: skip
    return path


def parse_args(argv=None):
    own, extra = split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s [options] ARCH DATASET [-- fairseq-train options]")  # fmt: skip
    p.add_argument("arch", help="a registered --arch name, e.g. residual_iwslt_e12d12")
    p.add_argument("dataset", help="a prepared dataset: data-bin/NAME (e.g. iwslt14_en_de) or a directory")
    p.add_argument("--data-bin", type=Path, help="the binarized data directory (default data-bin/DATASET)")
    p.add_argument("--save-dir", type=Path, help="checkpoints (default checkpoints/DATASET/ARCH)")
    p.add_argument("--hparams", default="auto", help=f"whose settings: {', '.join(HPARAMS)} (default auto: by family)")
    p.add_argument("--fp16", default="auto", help="auto (on with GPUs), 1 or 0")
    p.add_argument("--gpus", type=int, help="GPUs to train on (default all visible; 0 = CPU)")
    p.add_argument("--max-update", type=int, help="override the table's number of updates")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per GPU batch (default 4096)")
    p.add_argument("--average-last", type=int, help="average the last N checkpoints (default: the paper's)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--dry-run", action="store_true", help="print the fairseq-train command and stop")
    args = p.parse_args(own)
    args.extra = extra
    if args.hparams not in HPARAMS:
        raise RecipeError(f"--hparams {args.hparams!r} (HPARAMS): allowed {', '.join(HPARAMS)}")
    if args.fp16 not in ("auto", "1", "0"):
        raise RecipeError(f"--fp16 {args.fp16!r} (FP16): allowed auto, 1, 0")
    for name in ("max_update", "average_last", "gpus"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise RecipeError(f"--{name.replace('_', '-')} {value}: must be >= 0")
    if args.max_tokens <= 0:
        raise RecipeError(f"--max-tokens {args.max_tokens} (MAX_TOKENS): must be > 0")
    return args


def build_command(args, model: str, data: Path, manifest: dict) -> tuple[list[str], Hparams, dict]:
    paper = family_hparams(args.arch) if args.hparams == "auto" else args.hparams
    hp = choose_hparams(paper, manifest["dataset"])
    if args.max_update is not None:
        hp = replace(hp, max_update=args.max_update)
    if args.average_last is not None:
        hp = replace(hp, average_last=args.average_last, save_interval_updates=hp.save_interval_updates or 1000)
    available = cuda_devices()
    gpus = available if args.gpus is None else args.gpus
    if gpus > available:
        raise RecipeError(f"--gpus {gpus} (NUM_GPUS): only {available} CUDA device(s) visible")
    fp16 = gpus > 0 if args.fp16 == "auto" else args.fp16 == "1"
    update_freq = max(1, round(hp.tokens_per_update / (args.max_tokens * max(gpus, 1))))
    cmd = fairseq_module("train") + [
        data, "--user-dir", PLUGIN_DIR, "--arch", args.arch, "--task", "translation",
        "--source-lang", manifest["source_lang"], "--target-lang", manifest["target_lang"],
        "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", hp.adam_betas,
        "--lr", repr(hp.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(hp.warmup),
        "--warmup-init-lr", "1e-07", "--clip-norm", repr(hp.clip_norm), "--weight-decay", repr(hp.weight_decay),
        "--dropout", repr(hp.dropout), "--label-smoothing", repr(hp.label_smoothing),
        "--max-tokens", str(args.max_tokens), "--update-freq", str(update_freq), "--max-update", str(hp.max_update),
        "--save-dir", args.save_dir, "--seed", str(args.seed), "--log-format", "simple", "--log-interval", "100",
        "--no-epoch-checkpoints",
    ]  # fmt: skip
    if args.arch.startswith("crossformer_sg_"):
        cmd += ["--criterion", GUIDANCE_CRITERION, "--guidance-weight", repr(hp.guidance_weight)]
    else:
        cmd += ["--criterion", "label_smoothed_cross_entropy"]
    if hp.average_last:
        cmd += ["--save-interval-updates", str(hp.save_interval_updates),
                "--keep-interval-updates", str(hp.average_last)]  # fmt: skip
    if gpus == 0:
        cmd += ["--cpu"]
    if gpus > 1:
        cmd += ["--distributed-world-size", str(gpus)]
    if fp16:
        # on CPU, plain --fp16 asserts CUDA; --fp16-no-flatten-grads trains in half precision there too
        cmd += ["--fp16"] + (["--fp16-no-flatten-grads"] if gpus == 0 else [])
        if model == "residual_transformer" and "--dual-residual-scale" not in args.extra:
            cmd += ["--dual-residual-scale", "0.05"]  # ResiDual appendix H.3: keeps the dual stream in range
    cmd += args.extra
    info = {"hparams": paper, "gpus": gpus, "fp16": fp16, "update_freq": update_freq}
    return [str(c) for c in cmd], hp, info


def stream(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd``, echo its output as it comes, return (exit status, the output)."""
    lines = []
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return proc.returncode, "".join(lines)


def summarize(output: str) -> dict:
    """Facts from fairseq-train's simple log: parameters, updates, last validation loss."""
    params = re.findall(r"num\. (?:shared )?model params: ([\d,]+)", output)
    updates = re.findall(r"num_updates (\d+)", output)
    valid = re.findall(r"valid on 'valid' subset \| loss ([\d.]+)", output)
    return {
        "parameters": int(params[-1].replace(",", "")) if params else None,
        "num_updates": int(updates[-1]) if updates else None,
        "valid_loss": float(valid[-1]) if valid else None,
    }


def main(argv=None):
    args = parse_args(argv)
    data = resolve_data(args.dataset, args.data_bin)  # the cheap checks first: the next one imports fairseq
    manifest = read_manifest(data)
    model = check_architecture(args.arch)
    name = args.dataset if not Path(args.dataset).is_dir() else Path(args.dataset).name
    args.save_dir = args.save_dir or REPO / "checkpoints" / name / args.arch
    cmd, hp, info = build_command(args, model, data, manifest)
    log(TAG, f"{args.arch} on {manifest['dataset']} ({manifest['source_lang']}->{manifest['target_lang']}): "
             f"{hp.source}; {info['gpus'] or 'no'} GPU(s), fp16 {'on' if info['fp16'] else 'off'}, "
             f"update-freq {info['update_freq']}")  # fmt: skip
    log(TAG, " ".join(cmd))
    if args.dry_run:
        return
    args.save_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    status, output = stream(cmd)
    seconds = time.monotonic() - start
    if status != 0:
        raise RecipeError(f"fairseq-train failed (exit {status}); its output is above")
    summary = {"arch": args.arch, "dataset": manifest["dataset"], "data": str(data), "command": cmd,
               "hparams": asdict(hp), **info, "train_seconds": round(seconds, 1), **summarize(output)}  # fmt: skip
    if hp.average_last:
        summary["averaged"] = average_last(args.save_dir, hp.average_last)
    write_json(args.save_dir / "train_summary.json", summary)
    log(TAG, f"done in {seconds / 60:.1f} min: {args.save_dir}")


def average_last(save_dir: Path, n: int) -> str | None:
    """Average the last ``n`` update checkpoints into checkpoint_avgN.pt (scripts/training/average_checkpoints.py)."""
    found = sorted(save_dir.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    if len(found) < n:
        log(TAG, f"only {len(found)} update checkpoints, fewer than {n}: no average")
        return None
    output = save_dir / f"checkpoint_avg{n}.pt"
    cmd = [sys.executable, str(Path(__file__).with_name("average_checkpoints.py")), "--inputs", str(save_dir),
           "--num-update-checkpoints", str(n), "--output", str(output)]  # fmt: skip
    if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
        raise RecipeError("checkpoint averaging failed (output above)")
    return str(output)


if __name__ == "__main__":
    run_main(TAG, main)
