#!/usr/bin/env python
"""Hold every plugin family against fairseq's own transformer: training and decoding speed, peak memory,
parameters and model FLOPs utilisation, at matched depth and width, measured in one process.

    python scripts/benchmark/benchmark.py                                  # every family, E6D6 E12D12 E18D18 E36D6
    python scripts/benchmark/benchmark.py --family residual --depth e18d18 --rounds 3 --threads 1
    python scripts/benchmark/benchmark.py --width base --embed-dim 384 --ffn-dim 1536 --heads 6   # any size

For every depth, the matched baseline ``transformer_preln_{width}{depth}`` (fairseq's ``transformer`` with
Pre-LN, no plugin code) and every family at the same depth and width are built side by side, warmed up,
and then measured in rounds: in each round every model is measured once, in an order that rotates from
round to round (A B C, B C A, ...), so slow drifts of the machine hit every model alike. A family's ratio
is computed per round against the baseline of the same round; the report gives the median ratio over the
rounds and its spread (min-max), from wall-clock times, and next to it the median ratio of the process CPU
times of the same measurements: with one thread, time the process spends descheduled by other load does
not count there, so on a busy machine it is the steadier estimate (a large gap between the two says the
machine was busy). Everything runs on torch.set_num_threads(--threads), one inter-op thread; the default
of one thread is what the project's main job gives each model on the 2-core machine (two models train side
by side), and the one setting whose CPU-time ratios other load cannot disturb.

What is measured, and how
- Training throughput: target tokens (non-padding, fairseq's ``ntokens``) per second of complete fairseq
  training steps, ``Trainer.train_step``: forward, label-smoothed cross entropy (0.1), backward, gradient
  norm, Adam (betas 0.9/0.98, inverse-sqrt warm-up), metrics. ``crossformer_sg_*`` trains with its own
  criterion ``label_smoothed_cross_entropy_with_guidance`` (as in training, see FAMILY_ARGS). Batches are
  real Multi30k de-en training sentences, batched by fairseq's ``batch_by_size`` to --max-tokens; the
  same --train-batches batches are used for every model. Dropout is fairseq's default (0.1).
- Decoding throughput: source sentences per second of fairseq's SequenceGenerator (``task.inference_step``,
  beam --beam, after ``prepare_for_inference_``, as fairseq-generate does) on the first
  --decode-sentences sentences of Multi30k test_2016_flickr, sorted by length, --decode-batch-size per batch.
  The models are untrained, so left alone they would stop at different steps; min_len = max_len_b =
  --decode-len and max_len_a = 0 ban EOS until step --decode-len and force it then, so every model decodes
  exactly --decode-len + 1 steps for every sentence and beam.
- Peak memory of a training step: bytes live at the peak of one training step on the largest batch, after
  warm-up (so Adam's state exists) = parameters + optimizer state (both counted once per storage, so
  tied weights count once) + the peak of the bytes the step itself holds: torch.profiler with
  profile_memory=True records every allocation and free of torch's CPU allocator, and replaying the
  step's own blocks in time order gives their highest running total (activations saved for backward,
  gradients, temporaries: what CUDA's max_memory_allocated would show). The previous gradients are
  released before the step, as zero_grad does at its start. Not seen: memory outside torch's allocator
  (oneDNN/MKL scratch, Python objects), small and alike for every model of a shape. Deterministic (same
  bytes on every run), so it is measured once per model.
- Parameters: unique parameters (a tied Parameter counts once).
- Model FLOPs utilisation (MFU): model FLOPs per second over the float32 matmul peak of this machine.
  Model FLOPs of a training step, from the padded batch shape (B sentences, S source and T target
  positions), width d, FFN width f, L_e/L_d layers, vocabulary V; backward counted as twice the forward:

      forward = 2 * [ B*S * (L_e*(4d^2 + 2df) + L_d*2d^2)      encoder layers; cross-attention K, V
                    + B*T * (L_d*(6d^2 + 2df) + d*V) ]         decoder layers; output projection
              + 4d * B * [ L_e*S^2 + L_d*(T^2 + T*S) ]          attention scores and weighted sums
      training = 3 * forward

  i.e. 6 x (matmul weights applied per position) + attention terms; embedding look-ups and element-wise
  work are not counted. It is the FLOPs of a standard transformer of that shape, the same for a family
  and its baseline, so work a family adds shows up as lower MFU. Crossformer-HG's tied weights are still
  applied in every layer, so it has the baseline's FLOPs with fewer parameters. The JSON also holds the
  matmul FLOPs torch's FlopCounterMode counts in one real training step of each model (a check of the
  formula, and of the work each family adds). The peak: the best of --peak-repeats timings of a 2048^3
  float32 matmul on the same thread count, taken at the start and at the end of the run (best of both).

Targets (TARGETS below, ratios to the matched baseline of the same run) are printed as PASS/FAIL, never
asserted; "(within spread)" marks a verdict the spread of the rounds does not settle. Families not
registered yet are skipped; a family without a preset at a depth (crossformer_all) is skipped there.

Caveats: timings on a shared or busy machine are noisy (the spread shows how noisy); the ratios are what
matter, and they hold only for the shape, thread count and batch size measured.
"""

import argparse
import contextlib
import copy
import gc
import gzip
import json
import logging
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

logging.getLogger("fairseq").setLevel(logging.WARNING)  # fairseq logs at import
# the profiled step frees blocks allocated before profiling began, which torch reports once per model
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
import torch

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "fairseq_plugins"

from fairseq import options, tasks
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.data import LanguagePairDataset, data_utils
from fairseq.data.dictionary import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.logging import metrics
from fairseq.trainer import Trainer
from fairseq.utils import import_user_module
from torch.utils.flop_counter import FlopCounterMode

# exactly as fairseq-train --user-dir loads the plugin: the package, then every file of its models/ folder,
# so a family whose file is not yet imported by models/__init__.py is found too
import_user_module(argparse.Namespace(user_dir=str(PLUGIN_DIR)))
from fairseq_plugins.models.presets import DEPTHS, PRESETS, WIDTHS

BASELINE = "transformer_preln"
DEFAULT_DEPTHS = ("e6d6", "e12d12", "e18d18", "e36d6")
# families that are fairseq's own transformer: no target, but transformer_postln is a useful control
NOT_BENCHMARKED = {BASELINE}

# training options a family needs, as in its recipes (a criterion that is not registered yet is dropped)
FAMILY_ARGS: dict[str, list[str]] = {
    "crossformer_sg": ["--criterion", "label_smoothed_cross_entropy_with_guidance"],
}

SRC, TGT = "de", "en"


@dataclass(frozen=True)
class Target:
    """A family's bound on its ratio to the matched baseline.

    metric: train / decode (throughput ratio), memory (peak-memory ratio), or train_flat (training ratio at
    the deepest measured depth over the ratio at the shallowest, depths ordered by total layers).
    depth: a depth name, or None for every measured depth.
    """

    family: str
    metric: str
    op: str  # ">=", "<=" or "<"
    bound: float
    depth: str | None = None

    def holds(self, value: float) -> bool:
        return {">=": value >= self.bound, "<=": value <= self.bound, "<": value < self.bound}[self.op]


# issue 15, item 1 (ratios to the matched baseline of the same run, width 256, one thread); plus k-DCA's
# flatness with depth, the property k-DCA exists for
TARGETS: tuple[Target, ...] = (
    Target("dca_k2", "train", ">=", 0.95),
    Target("dca_k2", "decode", ">=", 0.95),
    Target("dca_k2", "memory", "<=", 1.10),
    Target("dca_k2", "train_flat", ">=", 0.95),
    Target("dca", "train", ">=", 0.90, "e12d12"),
    Target("dca", "train", ">=", 0.85, "e18d18"),
    Target("dca", "decode", ">=", 0.90),
    *(Target(family, metric, ">=", 0.98) for family in ("crossformer_hg", "crossformer_sg", "residual")
      for metric in ("train", "decode")),
    Target("crossformer_hg", "memory", "<", 1.00),
)


class BenchmarkError(Exception):
    """A bad option or missing input: reported as one line naming it, exit status 2."""


# ----------------------------------------------------------------------------------------------- data


@dataclass
class Corpus:
    """Tokenised sentences: training pairs and decoding sources, as lists of words."""

    train: list[tuple[list[str], list[str]]]
    test_sources: list[list[str]]
    source: str


_WORD = re.compile(r"\w+|[^\w\s]")


def tokenize(line: str) -> list[str]:
    """Lower-cased words and single punctuation marks: a simple word-level tokenisation."""
    return _WORD.findall(line.lower())


def default_data_dir() -> Path:
    return Path(os.environ.get("MULTI30K_DIR") or REPO.parent / "shared" / "data" / "multi30k")


def _read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def load_multi30k(data_dir: Path) -> Corpus:
    names = [f"train.{SRC}.gz", f"train.{TGT}.gz", f"test_2016_flickr.{SRC}.gz"]
    missing = [n for n in names if not (data_dir / n).is_file()]
    if missing:
        raise BenchmarkError(
            f"--data-dir {data_dir}: missing {', '.join(missing)} (Multi30k raw files; set --data-dir or "
            "MULTI30K_DIR, or use --synthetic)"
        )
    src, tgt = (_read_gz(data_dir / n) for n in names[:2])
    if len(src) != len(tgt):
        raise BenchmarkError(f"--data-dir {data_dir}: train.{SRC} and train.{TGT} differ in length")
    test = _read_gz(data_dir / names[2])
    return Corpus([(tokenize(s), tokenize(t)) for s, t in zip(src, tgt, strict=True)],
                  [tokenize(s) for s in test], f"Multi30k ({data_dir})")  # fmt: skip


def synthetic_corpus(n_train: int = 4000, n_test: int = 200, vocab: int = 2000, seed: int = 0) -> Corpus:
    """Random sentences with Multi30k-like lengths (the regression guard: no data files needed)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]

    def sentence() -> list[str]:
        return rng.choices(words, k=max(3, min(40, int(rng.gauss(13, 4)))))

    return Corpus([(sentence(), sentence()) for _ in range(n_train)], [sentence() for _ in range(n_test)],
                  "synthetic")  # fmt: skip


def build_dictionary(corpus: Corpus, vocab_size: int) -> Dictionary:
    """A joint word-level dictionary of the training sentences: the vocab_size most frequent entries."""
    counts = Counter(w for s, t in corpus.train for w in (*s, *t))
    d = Dictionary()
    for word, n in counts.most_common():
        d.add_symbol(word, n=n)
    d.finalize(nwords=vocab_size, padding_factor=8)
    return d


def encode(d: Dictionary, words: list[str]) -> torch.Tensor:
    return d.encode_line(" ".join(words), add_if_not_exist=False, append_eos=True).long()


@dataclass
class Batches:
    train: list[dict]  # fairseq samples (collated LanguagePairDataset batches)
    decode: list[dict]
    train_target_tokens: int
    decode_sentences: int


def make_batches(corpus: Corpus, d: Dictionary, opts) -> Batches:
    """The fixed training and decoding batches every model of a run sees."""
    rng = random.Random(opts.seed)
    pairs = rng.sample(corpus.train, min(len(corpus.train), max(2000, 64 * opts.train_batches)))
    src = [encode(d, s) for s, _ in pairs]
    tgt = [encode(d, t) for _, t in pairs]
    dataset = LanguagePairDataset(src, [len(x) for x in src], d, tgt, [len(x) for x in tgt], d)
    # fairseq's own batching: sort by length, fill up to --max-tokens (padded source or target)
    batches = data_utils.batch_by_size(
        dataset.ordered_indices(), dataset.num_tokens, max_tokens=opts.max_tokens, required_batch_size_multiple=1
    )
    batches = [b for b in batches if len(b) > 1]
    rng.shuffle(batches)
    train = [dataset.collater([dataset[i] for i in b]) for b in batches[: opts.train_batches]]
    if len(train) < opts.train_batches:
        raise BenchmarkError(f"--train-batches {opts.train_batches}: the corpus gives only {len(train)} batches")

    sources = [encode(d, s) for s in corpus.test_sources[: opts.decode_sentences]]
    test = LanguagePairDataset(sources, [len(x) for x in sources], d)
    order = test.ordered_indices()  # by length, as fairseq-generate batches
    decode = [test.collater([test[int(i)] for i in order[k : k + opts.decode_batch_size]])
              for k in range(0, len(order), opts.decode_batch_size)]  # fmt: skip
    return Batches(train, decode, sum(s["ntokens"] for s in train), len(sources))


# ------------------------------------------------------------------------------------------ contenders


def shape_args(opts) -> list[str]:
    """Command-line width overrides (the presets' widths otherwise)."""
    out = []
    for option, value in (("embed-dim", opts.embed_dim), ("ffn-embed-dim", opts.ffn_dim), ("attention-heads", opts.heads)):
        if value is not None:
            out += [f"--encoder-{option}", str(value), f"--decoder-{option}", str(value)]
    return out


def family_args(family: str) -> tuple[list[str], str | None]:
    """The family's extra training options, and a note when one of them cannot be used yet."""
    args = list(FAMILY_ARGS.get(family, []))
    if "--criterion" in args:
        criterion = args[args.index("--criterion") + 1]
        if criterion not in CRITERION_REGISTRY:
            i = args.index("--criterion")
            del args[i : i + 2]
            return args, f"criterion {criterion} not registered: trained with label_smoothed_cross_entropy"
    return args, None


@dataclass
class Contender:
    """One model of a depth's line-up: its trainer, its decoding copy and its measurements."""

    name: str  # family name, or the baseline's
    arch: str
    trainer: Trainer
    task: object
    decode_model: torch.nn.Module
    generator: object
    cfg: object
    criterion: str
    note: str | None
    train_s: list[float] = field(default_factory=list)  # wall-clock seconds per measurement
    decode_s: list[float] = field(default_factory=list)
    train_cpu_s: list[float] = field(default_factory=list)  # this process's CPU seconds, same measurements
    decode_cpu_s: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def build_contender(name: str, arch: str, data_dir: Path, opts) -> Contender:
    extra, note = family_args(name)
    parser = options.get_training_parser()
    options.add_generation_args(parser)
    argv = [
        str(data_dir), "--task", "translation", "--source-lang", SRC, "--target-lang", TGT, "--cpu",
        "--arch", arch, "--share-all-embeddings", "--seed", str(opts.seed),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(opts.max_tokens), "--num-workers", "0",
        # decoding: beam search with a forced length (see the module docstring)
        "--beam", str(opts.beam), "--max-len-a", "0", "--max-len-b", str(opts.decode_len),
        "--min-len", str(opts.decode_len),
        *shape_args(opts), *extra,
    ]  # fmt: skip
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(opts.seed)
    model = task.build_model(cfg.model)
    decode_model = copy.deepcopy(model)
    decode_model.prepare_for_inference_(cfg)  # what fairseq-generate does (beamable cross-attention)
    decode_model.eval()
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    generator = task.build_generator([decode_model], cfg.generation)
    return Contender(name, arch, trainer, task, decode_model, generator, cfg, cfg.criterion._name, note)


def settle() -> None:
    """Collect the garbage of the last measurement, then freeze what survives: no collection of
    long-lived objects lands inside the next timing, and this one only walks the last step's objects."""
    gc.collect()
    gc.freeze()


def train_once(c: Contender, samples: Sequence[dict]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds for one training step on each sample."""
    settle()
    with metrics.aggregate(new_root=True):
        start, cpu = time.perf_counter(), time.process_time()
        for sample in samples:
            c.trainer.train_step([sample])
        return time.perf_counter() - start, time.process_time() - cpu


def decode_once(c: Contender, samples: Sequence[dict], decode_len: int) -> tuple[float, float]:
    """Wall-clock and process CPU seconds to beam-decode every sample; checks that every hypothesis has the
    forced length."""
    settle()
    start, cpu = time.perf_counter(), time.process_time()
    outputs = [c.task.inference_step(c.generator, [c.decode_model], s) for s in samples]
    seconds = time.perf_counter() - start, time.process_time() - cpu
    lengths = {len(h["tokens"]) for out in outputs for hyps in out for h in hyps}
    if lengths != {decode_len + 1}:
        raise RuntimeError(f"{c.arch}: decoded lengths {sorted(lengths)}, expected {decode_len + 1}")
    return seconds


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def peak_train_memory(c: Contender, sample: dict) -> dict:
    """Bytes live at the peak of one training step (see the module docstring), by part."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    c.trainer.zero_grad()  # the previous step's gradients go now: the profiled step allocates its own
    settle()
    params = list(c.trainer.model.parameters())
    state = [v for s in c.trainer.optimizer.optimizer.state.values() for v in s.values()]
    persistent = _storage_bytes(params) + _storage_bytes(state)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, metrics.aggregate(new_root=True):
        c.trainer.train_step([sample])
    events = []  # (time, address, bytes allocated (+) or freed (-))
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        stack.extend(node.children)
    # replay the step's own blocks only: the allocator's running total (total_allocated) is process-wide and
    # remembers blocks of earlier profiled steps, so a free of an older block would read as a spurious dip
    live: dict[int, int] = {}
    running = peak = 0
    for _, ptr, size in sorted(events):
        if size > 0:
            live[ptr] = size
            running += size
            peak = max(peak, running)
        elif ptr in live:
            running -= live.pop(ptr)
    return {"peak_bytes": persistent + peak, "parameters_and_optimizer_bytes": persistent, "step_bytes": peak}


def counted_train_flops(c: Contender, sample: dict) -> int:
    """Matmul FLOPs of one real training step, as torch's FlopCounterMode counts them."""
    counter = FlopCounterMode(display=False)
    with counter, metrics.aggregate(new_root=True):
        c.trainer.train_step([sample])
    return counter.get_total_flops()


def model_train_flops(sample: dict, d: int, f: int, layers: tuple[int, int], vocab: int) -> float:
    """Model FLOPs of one training step by the formula of the module docstring."""
    enc, dec = layers
    b, s = sample["net_input"]["src_tokens"].shape
    t = sample["net_input"]["prev_output_tokens"].shape[1]
    forward = 2 * (b * s * (enc * (4 * d * d + 2 * d * f) + dec * 2 * d * d) + b * t * (dec * (6 * d * d + 2 * d * f) + d * vocab))
    forward += 4 * d * b * (enc * s * s + dec * (t * t + t * s))
    return 3.0 * forward


def matmul_peak(repeats: int, n: int = 2048) -> float:
    """Best float32 matmul FLOP/s of repeats timings of an n x n x n product, on the current threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2.0 * n**3 / best


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------- the run


def spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_depth(depth: str, families: list[str], data_dir: Path, batches: Batches, opts, log) -> dict:
    """Build the baseline and every family at one depth, measure them interleaved, return the results."""
    line_up = [(BASELINE, f"{BASELINE}_{opts.width_infix}{depth}")]
    skipped = {}
    for family in families:
        arch = f"{family}_{opts.width_infix}{depth}"
        if arch in PRESETS:
            line_up.append((family, arch))
        else:
            skipped[family] = f"no preset {arch}"
    contenders = [build_contender(name, arch, data_dir, opts) for name, arch in line_up]
    try:
        measure(depth, contenders, batches, opts, log)
        base = contenders[0]
        shape = {"d": base.cfg.model.encoder_embed_dim, "f": base.cfg.model.encoder_ffn_embed_dim,
                 "layers": DEPTHS[depth], "vocab": len(base.task.target_dictionary)}  # fmt: skip
        rows = {c.name: result_row(c, base, batches, shape) for c in contenders}
        profiles = profile_contenders(depth, contenders, rows, batches, opts, log)
    finally:
        contenders.clear()
        gc.unfreeze()  # settle() froze the models; let them go
        gc.collect()
    return {"depth": depth, "layers": list(shape["layers"]), "embed_dim": shape["d"], "ffn_dim": shape["f"],
            "vocab": shape["vocab"], "baseline": rows.pop(BASELINE), "families": rows, "skipped": skipped,
            "profiles": profiles}  # fmt: skip


def largest_batch(batches: Batches) -> dict:
    return max(batches.train, key=lambda s: s["net_input"]["src_tokens"].numel() + s["target"].numel())


def measure(depth: str, contenders: list[Contender], batches: Batches, opts, log) -> None:
    """Warm up, take the one-off measurements, then the interleaved rounds (into each contender)."""
    largest = largest_batch(batches)
    log(f"{depth}: warm-up of {', '.join(c.arch for c in contenders)}")
    for c in contenders:
        for _ in range(opts.warmup):
            train_once(c, batches.train)
            if not opts.no_decode:
                decode_once(c, batches.decode[:1], opts.decode_len)
        c.extra["parameters"] = sum(p.numel() for p in c.trainer.model.parameters())
        if not opts.no_flop_count:
            c.extra["counted_matmul_flops_per_step"] = counted_train_flops(c, largest)
        if not opts.no_memory:
            c.extra["memory"] = peak_train_memory(c, largest)

    for r in range(opts.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            wall, cpu = train_once(c, batches.train)
            c.train_s.append(wall)
            c.train_cpu_s.append(cpu)
        if not opts.no_decode:
            for c in order:
                wall, cpu = decode_once(c, batches.decode, opts.decode_len)
                c.decode_s.append(wall)
                c.decode_cpu_s.append(cpu)
        log(f"{depth}: round {r + 1}/{opts.rounds}: train tok/s "
            + ", ".join(f"{c.name} {batches.train_target_tokens / c.train_s[-1]:.0f}" for c in contenders)
            + ("" if opts.no_decode else "; decode sent/s "
               + ", ".join(f"{c.name} {batches.decode_sentences / c.decode_s[-1]:.1f}" for c in contenders)))  # fmt: skip


def ratios(base_s: Sequence[float], s: Sequence[float], base_cpu_s: Sequence[float], cpu_s: Sequence[float]) -> dict:
    """Speed ratios to the baseline (time ratios base/model), round by round: median, min, max of the
    wall-clock ones; ``best``, the ratio of the best wall-clock times (noise only ever adds time); ``cpu``,
    the median ratio of process CPU times, which time spent descheduled by other load does not inflate
    (with one thread; with more, OpenMP's spinning threads count too, so it is less telling)."""
    per_round_cpu = [b / t for b, t in zip(base_cpu_s, cpu_s, strict=True)]
    return spread([b / t for b, t in zip(base_s, s, strict=True)]) | {
        "best": min(base_s) / min(s), "cpu": statistics.median(per_round_cpu)}  # fmt: skip


def result_row(c: Contender, base: Contender, batches: Batches, shape: dict) -> dict:
    model_flops = sum(model_train_flops(s, shape["d"], shape["f"], shape["layers"], shape["vocab"])
                      for s in batches.train)  # fmt: skip
    row = {
        "arch": c.arch, "criterion": c.criterion, "note": c.note,
        "parameters": c.extra["parameters"],
        "train_tokens_per_s": spread([batches.train_target_tokens / t for t in c.train_s]),
        "train_seconds": c.train_s,
        "train_cpu_seconds": c.train_cpu_s,
        "model_flops_per_target_token": model_flops / batches.train_target_tokens,
        "model_tflops_per_s": spread([model_flops / t / 1e12 for t in c.train_s]),
        "counted_matmul_flops_per_step": c.extra.get("counted_matmul_flops_per_step"),
        "formula_flops_per_step": model_train_flops(largest_batch(batches), shape["d"], shape["f"],
                                                    shape["layers"], shape["vocab"]),
    }  # fmt: skip
    if c.decode_s:
        row["decode_sentences_per_s"] = spread([batches.decode_sentences / t for t in c.decode_s])
        row["decode_seconds"] = c.decode_s
        row["decode_cpu_seconds"] = c.decode_cpu_s
    if "memory" in c.extra:
        row["memory"] = c.extra["memory"]
    if c is not base:
        row["train_ratio"] = ratios(base.train_s, c.train_s, base.train_cpu_s, c.train_cpu_s)
        if c.decode_s:
            row["decode_ratio"] = ratios(base.decode_s, c.decode_s, base.decode_cpu_s, c.decode_cpu_s)
        if "memory" in c.extra:
            row["memory_ratio"] = c.extra["memory"]["peak_bytes"] / base.extra["memory"]["peak_bytes"]
        row["parameter_ratio"] = c.extra["parameters"] / base.extra["parameters"]
    return row


# the metrics whose rows hold per-round ratios (a dict with a median) and that a profile can explain; memory
# is one deterministic ratio, and its breakdown is in the memory measurement itself
THROUGHPUT_METRICS = ("train", "decode")


def missed_metrics(family: str, depth: str, row: dict) -> list[str]:
    """The throughput metrics (train, decode) on which ``row`` misses one of the family's targets."""
    return [t.metric for t in TARGETS
            if t.family == family and t.metric in THROUGHPUT_METRICS and t.depth in (None, depth)
            and f"{t.metric}_ratio" in row and not t.holds(row[f"{t.metric}_ratio"]["median"])]  # fmt: skip


def op_times(fn: Callable[[], object]) -> dict[str, tuple[float, int]]:
    """{operator: (self CPU milliseconds, calls)} of one call of fn, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    settle()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: (e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()}


def best_op_times(fns: Sequence[Callable[[], object]], repeats: int) -> list[dict[str, tuple[float, int]]]:
    """op_times of each fn, profiled ``repeats`` times interleaved; per operator the least time seen
    (load from other processes only ever adds time; the call counts do not change)."""
    runs = [[op_times(fn) for fn in fns] for _ in range(repeats)]
    best = []
    for i in range(len(fns)):
        names = set().union(*(run[i] for run in runs))
        best.append({n: (min(run[i].get(n, (0.0, 0))[0] for run in runs), runs[0][i].get(n, (0.0, 0))[1])
                     for n in names})  # fmt: skip
    return best


def profile_contenders(depth: str, contenders: list[Contender], rows: dict, batches: Batches, opts, log) -> dict:
    """--profile: one training step (largest batch) and one decoding batch of the baseline and of each chosen
    family under torch.profiler; per family the operators that cost it most time over the baseline."""
    if opts.profile == "none":
        return {}
    base = contenders[0]
    chosen: list[tuple[Contender, list[str]]] = []
    for c in contenders[1:]:
        metrics_ = ["train", "decode"] if opts.profile == "all" else missed_metrics(c.name, depth, rows[c.name])
        if opts.no_decode:
            metrics_ = [m for m in metrics_ if m != "decode"]
        if metrics_:
            chosen.append((c, metrics_))
    if not chosen:
        return {}
    largest = largest_batch(batches)
    work = {"train": lambda c: (lambda: c.trainer.train_step([largest])),
            "decode": lambda c: (lambda: c.task.inference_step(c.generator, [c.decode_model], batches.decode[0]))}  # fmt: skip
    out = {}
    for c, metrics_ in chosen:
        for metric in metrics_:
            log(f"{depth}: profiling {c.name} {metric} against the baseline, {opts.profile_repeats} times each")
            ops, ref = best_op_times([work[metric](c), work[metric](base)], opts.profile_repeats)
            names = sorted(set(ops) | set(ref), key=lambda n: ops.get(n, (0, 0))[0] - ref.get(n, (0, 0))[0], reverse=True)
            out[f"{c.name} {metric}"] = {
                "total_ms": [sum(v[0] for v in ops.values()), sum(v[0] for v in ref.values())],
                "top": [{"op": n, "ms": ops.get(n, (0, 0))[0], "calls": ops.get(n, (0, 0))[1],
                         "baseline_ms": ref.get(n, (0, 0))[0], "baseline_calls": ref.get(n, (0, 0))[1]}
                        for n in names[: opts.profile_top]],
            }  # fmt: skip
    return out


def check_targets(results: list[dict]) -> list[dict]:
    """Every target of a measured family, with its value, verdict and whether the spread settles it."""
    verdicts = []
    by_family: dict[str, list[tuple[dict, dict]]] = {}
    for res in results:
        for family, row in res["families"].items():
            by_family.setdefault(family, []).append((res, row))
    for target in TARGETS:
        measured = by_family.get(target.family, [])
        if target.metric == "train_flat":
            if len(measured) < 2:
                continue
            ordered = sorted(measured, key=lambda rr: sum(rr[0]["layers"]))
            first, last = (rr[1]["train_ratio"]["median"] for rr in (ordered[0], ordered[-1]))
            value = last / first
            verdicts.append({"target": target, "depth": f"{ordered[-1][0]['depth']} / {ordered[0][0]['depth']}",
                             "value": value, "pass": target.holds(value), "settled": True})  # fmt: skip
            continue
        for res, row in measured:
            if target.depth not in (None, res["depth"]):
                continue
            if target.metric == "memory":
                if "memory_ratio" not in row:
                    continue
                value, settled = row["memory_ratio"], True
            else:
                key = f"{target.metric}_ratio"
                if key not in row:
                    continue
                value = row[key]["median"]
                settled = target.holds(row[key]["min"]) == target.holds(row[key]["max"])
            verdict = {"target": target, "depth": res["depth"], "value": value, "pass": target.holds(value),
                       "settled": settled}
            if target.metric == "train":  # model TFLOP/s of the family and of its baseline (MFU = / peak)
                verdict["model_tflops_per_s"] = [row["model_tflops_per_s"]["median"],
                                                 res["baseline"]["model_tflops_per_s"]["median"]]  # fmt: skip
            verdicts.append(verdict)
    return verdicts


# ------------------------------------------------------------------------------------------- reports


def _ratio(row: dict, key: str) -> str:
    cell = row.get(key)
    return f"**{cell['median']:.2f}** ({cell['min']:.2f}-{cell['max']:.2f}; CPU {cell['cpu']:.2f})" if cell else "-"


def _table_row(depth: str, name: str, row: dict, base: dict, peak_flops: float) -> str:
    is_base = row is base
    flops, base_flops = row["counted_matmul_flops_per_step"], base["counted_matmul_flops_per_step"]
    memory = row.get("memory", {}).get("peak_bytes")
    decode = row.get("decode_sentences_per_s")
    cells = [
        depth.upper(),
        f"`{name}`",
        "1" if is_base else _ratio(row, "train_ratio"),
        "1" if is_base and decode else _ratio(row, "decode_ratio"),
        "1" if is_base and memory else (f"{row['memory_ratio']:.2f}" if "memory_ratio" in row else "-"),
        f"{row.get('parameter_ratio', 1.0):.2f}",
        f"{flops / base_flops:.2f}" if flops and base_flops else "-",
        f"{row['train_tokens_per_s']['median']:.0f}",
        f"{decode['median']:.2f}" if decode else "-",
        f"{memory / 2**20:.0f}" if memory else "-",
        f"{row['model_tflops_per_s']['median'] * 1e12 / peak_flops:.1%}" if peak_flops else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    header = (
        f"Ratios to the matched `{BASELINE}_*` (fairseq's transformer, Pre-LN) measured in the same run: "
        f"median over {s['rounds']} interleaved rounds of wall-clock throughput (min-max; CPU: median ratio "
        f"of process CPU times, immune to time lost to other processes). Width {s['width']}; {s['threads']} "
        f"thread(s) on {m['cpu']} ({m['cpus']} CPUs), torch {m['torch']}; {report['corpus']}, "
        f"{s['train_batches']} training batch(es) of <= {s['max_tokens']} tokens; beam {s['beam']}, "
        f"{s['decode_sentences']} sentences decoded to exactly {s['decode_len']} tokens; "
        + (f"float32 matmul peak {m['matmul_peak_gflops']:.1f} GFLOP/s" if m["matmul_peak_gflops"] else "")
        + (f"; DCA's GRNs: {m['grn_kernels']}." if m.get("grn_kernels") else ".")
    )
    if report.get("command"):
        header += (f" Made by `OMP_NUM_THREADS={s['threads']} {report['command']}` in "
                   f"{report.get('seconds', 0) / 60:.0f} minutes.")  # fmt: skip
    lines = [
        header,
        "",
        "| depth | family | train ratio | decode ratio | peak-memory ratio | params ratio | FLOPs ratio | train tok/s | decode sent/s | peak memory MiB | MFU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    peak_flops = (m["matmul_peak_gflops"] or 0) * 1e9
    checks: list[str] = []
    for res in report["results"]:
        base = res["baseline"]
        lines.append(_table_row(res["depth"], BASELINE, base, base, peak_flops))
        for name, row in res["families"].items():
            lines.append(_table_row(res["depth"], name, row, base, peak_flops))
        for family, why in res["skipped"].items():
            lines.append(f"| {res['depth'].upper()} | `{family}` | skipped: {why} | | | | | | | | |")
        if base["counted_matmul_flops_per_step"]:
            checks.append(f"{res['depth'].upper()} {base['counted_matmul_flops_per_step'] / base['formula_flops_per_step']:.3f}")
    lines += ["", "FLOPs ratio: matmul FLOPs of one training step as FlopCounterMode counts them, over the "
              "baseline's (the work a family adds). MFU: the docstring's model-FLOPs formula (the same for a "
              "family and its baseline) per second over the matmul peak; counted/formula FLOPs for the "
              f"baseline: {', '.join(checks)}." if checks else ""]
    notes = sorted({f"`{name}`: {row['note']}" for res in report["results"]
                    for name, row in res["families"].items() if row["note"]})  # fmt: skip
    notes += [f"`{family}` not benchmarked: no preset at these depths (it has {', '.join(archs)})"
              for family, archs in report["not_benchmarked"].items()]  # fmt: skip
    lines += ["", *[f"Note: {n}." for n in notes]] if notes else []
    lines += ["", "| target | depth | measured | MFU (baseline's) | verdict |", "|---|---|---:|---:|---|"]
    for v in report["targets"]:
        t = v["target"]
        verdict = ("PASS" if v["pass"] else "FAIL") + ("" if v["settled"] else " (within spread)")
        mfu = "-"
        if "model_tflops_per_s" in v and peak_flops:
            family_mfu, base_mfu = (tf * 1e12 / peak_flops for tf in v["model_tflops_per_s"])
            mfu = f"{family_mfu:.1%} ({base_mfu:.1%})"
        lines.append(f"| `{t['family']}` {t['metric']} {t['op']} {t['bound']:.2f} | {v['depth']} | "
                     f"{v['value']:.2f} | {mfu} | {verdict} |")  # fmt: skip
    if not report["targets"]:
        lines.append("| (no target applies to the measured families) | | | | |")
    if any("model_tflops_per_s" in v for v in report["targets"]):
        lines += ["", ("MFU beside a training target: the family's and (in brackets) its baseline's, from the "
                       "same model-FLOPs formula, so their quotient is the throughput ratio of the medians; the aim "
                       "is a family within 5% of its baseline.")]
    for res in report["results"]:
        for name, prof in res.get("profiles", {}).items():
            total, base_total = prof["total_ms"]
            what = "training step, largest batch" if name.endswith("train") else "decoding batch"
            title = (f"Profile, {res['depth'].upper()} `{name}` (one {what}; per operator the least self CPU ms "
                     f"of {report['settings']['profile_repeats']} interleaved profiles, and its calls): {total:.0f} ms "
                     f"against the baseline's {base_total:.0f} ms; operators by extra time:")  # fmt: skip
            lines += ["", title, "", "| operator | ms | calls | baseline ms | baseline calls | extra ms |",
                      "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
            lines += [f"| `{o['op']}` | {o['ms']:.1f} | {o['calls']} | {o['baseline_ms']:.1f} | {o['baseline_calls']} | "
                      f"{o['ms'] - o['baseline_ms']:+.1f} |" for o in prof["top"]]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- main

WIDTH_NAMES = {(infix.rstrip("_") or "base"): infix for infix in WIDTHS}


def registered_families() -> list[str]:
    """Every family of the preset table but the baseline, in registration order."""
    return list(dict.fromkeys(p.family for p in PRESETS.values() if p.family not in NOT_BENCHMARKED))


def _bounded(kind: type, low: float, high: float | None = None) -> Callable[[str], object]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", action="append", metavar="NAME",
                   help="benchmark only this family (repeatable; default every registered family but "
                   f"{BASELINE}, the baseline)")  # fmt: skip
    p.add_argument("--depth", action="append", metavar="EnDm",
                   help=f"depths (repeatable) from {', '.join(DEPTHS)} (default {' '.join(DEFAULT_DEPTHS)})")
    p.add_argument("--width", choices=sorted(WIDTH_NAMES), default="iwslt",
                   help="preset width: iwslt (256 model, 1024 FFN, 4 heads) or base (512, 2048, 8); default iwslt")
    p.add_argument("--embed-dim", type=_bounded(int, 8, 8192), help="override the model width (any size)")
    p.add_argument("--ffn-dim", type=_bounded(int, 8, 32768), help="override the FFN width")
    p.add_argument("--heads", type=_bounded(int, 1, 128), help="override the number of attention heads")
    p.add_argument("--threads", type=_bounded(int, 1, os.cpu_count() or 1), default=1,
                   help="torch.set_num_threads for every measurement, 1..CPUs (default 1: the project's main "
                   "job trains its models side by side with one thread each on the 2-core machine, and with "
                   "one thread the CPU-time ratios are immune to other load, while 2 threads on a shared "
                   "machine lose half their speed at OpenMP barriers; see docs/benchmark.md)")
    p.add_argument("--rounds", type=_bounded(int, 1, 100), default=5,
                   help="interleaved measurement rounds per depth, 1..100 (default 5)")
    p.add_argument("--warmup", type=_bounded(int, 0, 20), default=1,
                   help="unmeasured passes over the training batches (and one decoding batch) per model (default 1)")
    p.add_argument("--max-tokens", type=_bounded(int, 64, 65536), default=1024,
                   help="tokens per training batch, fairseq's --max-tokens (default 1024)")
    p.add_argument("--train-batches", type=_bounded(int, 1, 64), default=2,
                   help="training batches per measurement (default 2)")
    p.add_argument("--decode-sentences", type=_bounded(int, 1, 1000), default=32,
                   help="test sentences decoded per measurement (default 32)")
    p.add_argument("--decode-batch-size", type=_bounded(int, 1, 1000), default=16,
                   help="sentences per decoding batch (default 16)")
    p.add_argument("--decode-len", type=_bounded(int, 1, 200), default=16,
                   help="every hypothesis is forced to exactly this many tokens (min_len = max_len_b; "
                   "default 16, about a Multi30k English sentence in these word tokens)")
    p.add_argument("--beam", type=_bounded(int, 1, 64), default=5, help="beam size (default 5)")
    p.add_argument("--vocab-size", type=_bounded(int, 16, 100000), default=8000,
                   help="joint word-level dictionary size, special symbols included (default 8000)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="Multi30k raw files (train/test_2016_flickr .de/.en .gz); default $MULTI30K_DIR or "
                   "../shared/data/multi30k next to the repository")
    p.add_argument("--synthetic", action="store_true", help="random sentences instead of Multi30k (smoke runs)")
    p.add_argument("--no-decode", action="store_true", help="skip decoding")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--no-flop-count", action="store_true",
                   help="skip counting each model's matmul FLOPs with FlopCounterMode (one extra step each)")
    p.add_argument("--peak-repeats", type=_bounded(int, 0, 50), default=5,
                   help="timings of the 2048^3 matmul for the FLOP/s peak, at start and end, 0..50 "
                   "(default 5; 0: no peak, no MFU)")
    p.add_argument("--profile", choices=["none", "misses", "all"], default="none",
                   help="after the rounds of a depth, run torch.profiler on one training step and one decoding "
                   "batch of the baseline and of the families that miss a throughput target there (misses) or "
                   "of every family (all), and report the operators that cost each most over the baseline "
                   "(self CPU time and calls); default none")
    p.add_argument("--profile-top", type=_bounded(int, 1, 100), default=12,
                   help="operators listed per profile, 1..100 (default 12)")
    p.add_argument("--profile-repeats", type=_bounded(int, 1, 20), default=3,
                   help="profiles of each model, interleaved; per operator the least time is kept, 1..20 (default 3)")
    p.add_argument("--seed", type=_bounded(int, 0), default=1, help="model and batch seed (default 1)")
    p.add_argument("--json", type=Path, help="write the full results (every timing) as JSON here")
    p.add_argument("--markdown", type=Path, help="write the Markdown report here (it is printed anyway)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def resolve(opts) -> None:
    """Check option combinations; fill in the defaults that depend on the registry."""
    known = registered_families()
    families = opts.family or known
    unknown = [f for f in families if f not in known]
    if unknown:
        raise BenchmarkError(f"--family {', '.join(unknown)}: not a registered family; choose from {', '.join(known)}")
    opts.families = list(dict.fromkeys(families))
    depths = opts.depth or list(DEFAULT_DEPTHS)
    bad = [d for d in depths if d not in DEPTHS]
    if bad:
        raise BenchmarkError(f"--depth {', '.join(bad)}: unknown; choose from {', '.join(DEPTHS)}")
    opts.depths = list(dict.fromkeys(depths))
    opts.width_infix = WIDTH_NAMES[opts.width]
    width = WIDTHS[opts.width_infix]
    embed, heads = opts.embed_dim or width.embed_dim, opts.heads or width.heads
    if embed % heads:
        raise BenchmarkError(f"--embed-dim {embed} is not divisible by --heads {heads}")
    # a family with no preset at any requested depth: an error if asked for, otherwise left out and listed
    opts.unmatched = {}
    for family in list(opts.families):
        if not any(f"{family}_{opts.width_infix}{d}" in PRESETS for d in opts.depths):
            if opts.family:
                raise BenchmarkError(f"--family {family} has no preset at --depth {' '.join(opts.depths)} "
                                     f"(--width {opts.width})")  # fmt: skip
            opts.families.remove(family)
            opts.unmatched[family] = sorted(p.arch for p in PRESETS.values() if p.family == family)
    opts.decode_batch_size = min(opts.decode_batch_size, opts.decode_sentences)


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only settable before the first inter-op parallel work
        torch.set_num_interop_threads(1)


def run_benchmark(opts, corpus: Corpus, log: Callable[[str], None] = lambda _: None) -> dict:
    """The whole benchmark for resolved options: a report dict (see markdown())."""
    set_threads(opts.threads)
    dictionary = build_dictionary(corpus, opts.vocab_size)
    batches = make_batches(corpus, dictionary, opts)
    peak_start = matmul_peak(opts.peak_repeats) if opts.peak_repeats else None
    log(f"matmul peak {(peak_start or 0) / 1e9:.1f} GFLOP/s on {opts.threads} thread(s); "
        f"{batches.train_target_tokens} target tokens per training measurement")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for lang in (SRC, TGT):  # the translation task reads its dictionaries from the data directory
            dictionary.save(str(Path(tmp) / f"dict.{lang}.txt"))
        for depth in opts.depths:
            results.append(run_depth(depth, opts.families, Path(tmp), batches, opts, log))
    peak_end = matmul_peak(opts.peak_repeats) if opts.peak_repeats else None
    width = WIDTHS[opts.width_infix]
    report = {
        "machine": {
            "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "threads": opts.threads, "torch": torch.__version__,
            "matmul_peak_gflops": max(peak_start, peak_end) / 1e9 if peak_start else None,
            "matmul_peak_gflops_start_end": [peak_start / 1e9, peak_end / 1e9] if peak_start else None,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "grn_kernels": grn_kernels_status(),
        },
        "settings": {
            "width": f"{opts.embed_dim or width.embed_dim}/{opts.ffn_dim or width.ffn_dim}/"
                     f"{opts.heads or width.heads} (model/FFN/heads)",
            "threads": opts.threads, "rounds": opts.rounds, "warmup": opts.warmup, "max_tokens": opts.max_tokens,
            "train_batches": opts.train_batches, "train_target_tokens": batches.train_target_tokens,
            "decode_sentences": batches.decode_sentences, "decode_batch_size": opts.decode_batch_size,
            "decode_len": opts.decode_len, "beam": opts.beam, "vocab": len(dictionary), "seed": opts.seed,
            "decode": not opts.no_decode, "memory": not opts.no_memory, "profile": opts.profile,
            "profile_repeats": opts.profile_repeats,
        },
        "corpus": corpus.source,
        "results": results,
        "not_benchmarked": opts.unmatched,
    }  # fmt: skip
    report["targets"] = [dict(v, target=vars(v["target"]) | {}) for v in check_targets(results)]
    return report


def grn_kernels_status() -> str:
    """Which GRN code DCA ran: the fused CPU kernels, or the PyTorch code and why."""
    from fairseq_plugins.kernels import grn_kernel

    if grn_kernel.library() is not None:
        return "fused CPU kernels"
    return f"PyTorch code ({grn_kernel.failure or 'kernels turned off by ' + grn_kernel.ENV_SWITCH + '=0'})"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def quiet_libraries() -> None:
    """fairseq, hydra and torch deprecation chatter would bury the progress lines; errors still show."""
    for name in ("fairseq", "hydra"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for category in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    quiet_libraries()
    start = time.time()
    log = (lambda _: None) if opts.quiet else (lambda msg: print(f"[benchmark {time.time() - start:6.0f}s] {msg}",
                                                                 file=sys.stderr, flush=True))  # fmt: skip
    try:
        resolve(opts)
        corpus = synthetic_corpus() if opts.synthetic else load_multi30k(opts.data_dir or default_data_dir())
        report = run_benchmark(opts, corpus, log)
    except BenchmarkError as err:
        parser.error(str(err))
    report["machine"]["cpu"] = _cpu_name()
    report["command"] = "python scripts/benchmark/benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report["seconds"] = time.time() - start
    text = markdown(report)
    print(text)
    if opts.markdown:
        opts.markdown.write_text(text)
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=1) + "\n")
    log(f"done in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
