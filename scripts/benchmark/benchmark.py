#!/usr/bin/env python
"""Hold every plugin family against fairseq's own transformer: training and decoding speed, peak memory,
parameters and model FLOPs utilisation, at matched depth and width, measured in one process.

    python -m scripts.benchmark.benchmark                                  # every family, E6D6 E12D12 E18D18 E36D6
    python -m scripts.benchmark.benchmark --family residual --depth e18d18 --rounds 3 --threads 1
    python -m scripts.benchmark.benchmark --width base --embed-dim 384 --ffn-dim 1536 --heads 6   # any size
    python -m scripts.benchmark.benchmark --device cuda --threads 1       # on a GPU: fp32, fp16 and bf16 columns
    python -m scripts.benchmark.benchmark --task lm --depth d6 --family dca  # language models, see bench_lm.py

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

Targets (TARGETS in bench_families.py, ratios to the matched baseline of the same run) are printed as PASS/FAIL, never
asserted; "(within spread)" marks a verdict the spread of the rounds does not settle. Families not
registered yet are skipped; a family without a preset at a depth (crossformer_all) is skipped there.

Caveats: timings on a shared or busy machine are noisy (the spread shows how noisy); the ratios are what
matter, and they hold only for the shape, thread count and batch size measured.
On a GPU (--device cuda; an error naming the option when CUDA is not available) the same line-ups run on the
GPU, every timing ends with torch.cuda.synchronize, and each precision of --precision (default fp32, fp16,
bf16 on CUDA; fp32 on the CPU) is measured as its own line-up against the baseline in the same precision:
fp16 is fairseq's --fp16 (half weights, dynamic loss scaling), bf16 the plugin's autocast (float32 weights,
bfloat16 matrix products; fairseq_plugins/precision.py, what --autocast-dtype bfloat16 does, applied to the
baseline too). Peak memory there is torch.cuda.max_memory_allocated over the
step less what was allocated before it, plus parameters and optimizer state (fp16: also the float32 master
copy), so the other models resident on the GPU do not count. The main table shows the first precision; a
second table gives training tok/s, decoding sent/s (each with its ratio) and peak MiB per precision. MFU is
against the float32 (TF32 where torch allows it) matmul peak of the device. The CPU default (fp32 only)
reports exactly as before.

Language models (--task lm, issue 28): every family's LM preset ``{family}_lm_{width}d{depth}`` against fairseq's
own transformer LM of the same shape (``transformer_lm_big`` given the width, FFN, heads and depth: Pre-LN with a
final LayerNorm), on 128-token blocks and prefix-continuing generation; the same rounds, ratios and memory, no
targets. bench_lm.py's docstring says how.

Files: benchmark.py (this command line), bench_lm.py (--task lm), bench_families.py (line-up, targets, precisions, building a model),
bench_data.py (corpus and batches), bench_timing.py (timing, memory, FLOPs, profiles), bench_run.py (the
run), bench_report.py (verdicts and Markdown), bench_merge.py (one report from several runs, e.g. one per core).
The families are measured in groups of --group-size, each against a baseline of its own in the same rounds:
a group's models all live in memory at once.
"""

import argparse
import contextlib
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

# before torch is first imported: the profiled step frees blocks allocated before profiling began, which torch
# reports once per model
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import logging

from scripts.benchmark.bench_data import (  # noqa: F401
    MULTI30K_SOURCE,
    Corpus,
    default_data_dir,
    load_multi30k,
    synthetic_corpus,
)
from scripts.benchmark.bench_families import (  # noqa: F401
    BASELINE,
    DEFAULT_DEPTHS,
    DEFAULT_PRECISIONS,
    DEPTHS,
    DEVICES,
    PRECISIONS,
    PRESETS,
    REPO,
    TARGETS,
    WIDTH_NAMES,
    WIDTHS,
    BenchmarkError,
    Target,
    check_device,
    registered_families,
)
from scripts.benchmark.bench_lm import (
    LM_DEPTH_NAMES,
    LM_WIDTH_NAMES,
    lm_families,
    lm_shape,
)
from scripts.benchmark.bench_report import (  # noqa: F401
    check_targets,
    markdown,
    missed_metrics,
    publish,
    write_report,
)
from scripts.benchmark.bench_run import COMPILED, grn_kernels_status, run_benchmark  # noqa: F401

LM_DEFAULT_DEPTH = "d6"


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
    p.add_argument("--task", choices=["translation", "lm"], default="translation",
                   help="translation (default: the translation presets against fairseq's transformer) or lm (the "
                   "language-model presets {family}_lm_{width}d{depth} of issue 28 against fairseq's transformer_lm "
                   "of the same shape, Pre-LN; see bench_lm.py)")
    p.add_argument("--lm-width", choices=sorted(LM_WIDTH_NAMES), default="base",
                   help="--task lm: the LM preset width, base (512 model, 2048 FFN, 8 heads: fairseq's transformer_lm "
                   "and the DCA paper's), gpt (768, 3072, 12, GELU) or big (1024, 4096, 16); default base")
    p.add_argument("--tokens-per-sample", type=_bounded(int, 8, 4096), default=128,
                   help="--task lm: tokens per block, fairseq's --tokens-per-sample, 8..4096 (default 128, the DCA "
                   "paper's sequence length)")
    p.add_argument("--lm-prefix-len", type=_bounded(int, 1, 512), default=16,
                   help="--task lm: prefix tokens each generation continues, 1..512 (default 16)")
    p.add_argument("--family", action="append", metavar="NAME",
                   help="benchmark only this family (repeatable; default every registered family but "
                   f"{BASELINE}, the baseline)")  # fmt: skip
    p.add_argument("--depth", action="append", metavar="EnDm",
                   help=f"depths (repeatable) from {', '.join(DEPTHS)} (default {' '.join(DEFAULT_DEPTHS)}); "
                   f"--task lm: from {', '.join(LM_DEPTH_NAMES)} (default {LM_DEFAULT_DEPTH})")
    p.add_argument("--width", choices=sorted(WIDTH_NAMES), default="iwslt",
                   help="preset width: iwslt (256 model, 1024 FFN, 4 heads) or base (512, 2048, 8); default iwslt")
    p.add_argument("--embed-dim", type=_bounded(int, 8, 8192), help="override the model width (any size)")
    p.add_argument("--ffn-dim", type=_bounded(int, 8, 32768), help="override the FFN width")
    p.add_argument("--heads", type=_bounded(int, 1, 128), help="override the number of attention heads")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="cpu (default) or cuda (the first GPU; an error if CUDA is not available)")
    p.add_argument("--precision", action="append", choices=sorted(PRECISIONS), metavar="P",
                   help="fp32, fp16 (fairseq's --fp16) or bf16 (the plugin's bfloat16 autocast, precision.py), repeatable; "
                   "each is a line-up against the baseline in the same precision (default: fp32 on cpu; fp32, "
                   "fp16, bf16 on cuda)")
    p.add_argument("--threads", type=_bounded(int, 1, os.cpu_count() or 1), default=1,
                   help="torch.set_num_threads for every measurement, 1..CPUs (default 1: the project's main "
                   "job trains its models side by side with one thread each on the 2-core machine, and with "
                   "one thread the CPU-time ratios are immune to other load, while 2 threads on a shared "
                   "machine lose half their speed at OpenMP barriers; see docs/benchmark.md)")
    p.add_argument("--group-size", type=_bounded(int, 1, 1000), default=8,
                   help="families measured together against one baseline, 1..1000 (default 8): a group's models "
                   "all live in memory during its rounds (on the CPU about 1 GB per model at E12D12 width 256, "
                   "more deeper: 22 families at E12D12 took 19 GB), so every family in one group does not fit "
                   "24 GB; each group has its own baseline, measured in the same rounds")
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
    p.add_argument("--compiled", action="store_true",
                   help="measure every precision a second time with each model's layers compiled (torch.compile of the "
                   "idea modules, fairseq_plugins/modules/compiled.py; the baseline's fairseq layers too), reported "
                   "beside eager as PRECISION+compiled, each against the baseline compiled alike; on the CPU "
                   "compiling takes minutes per model with inductor")
    p.add_argument("--compile-backend", choices=["inductor", "aot_eager", "eager"], default="inductor",
                   help="the torch.compile backend of --compiled (default inductor: C++ on the CPU, Triton on a GPU)")
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


def resolve_lm(opts) -> None:
    """resolve() for --task lm: the families with LM presets, the LM depths."""
    known = lm_families()
    unknown = [f for f in opts.family or [] if f not in known]
    if unknown:
        raise BenchmarkError(f"--family {', '.join(unknown)}: no language model; choose from {', '.join(known)}")
    opts.families = list(dict.fromkeys(opts.family or known))
    depths = opts.depth or [LM_DEFAULT_DEPTH]
    bad = [d for d in depths if d not in LM_DEPTH_NAMES]
    if bad:
        raise BenchmarkError(f"--depth {', '.join(bad)}: not an LM depth; choose from {', '.join(LM_DEPTH_NAMES)}")
    opts.depths = list(dict.fromkeys(depths))
    shape = lm_shape(opts)
    if shape["decoder-embed-dim"] % shape["decoder-attention-heads"]:
        raise BenchmarkError(f"--embed-dim {shape['decoder-embed-dim']} is not divisible by --heads "
                             f"{shape['decoder-attention-heads']}")  # fmt: skip
    if opts.tokens_per_sample > opts.max_tokens:
        raise BenchmarkError(f"--tokens-per-sample {opts.tokens_per_sample} exceeds --max-tokens {opts.max_tokens}")
    if opts.lm_prefix_len + opts.decode_len >= opts.tokens_per_sample:
        raise BenchmarkError(f"--lm-prefix-len {opts.lm_prefix_len} + --decode-len {opts.decode_len} must stay below "
                             f"--tokens-per-sample {opts.tokens_per_sample} (the model's positions)")  # fmt: skip
    if opts.profile != "none":
        raise BenchmarkError("--profile: not available with --task lm yet (it explains misses of translation targets)")
    opts.unmatched = {}
    opts.width_infix = WIDTH_NAMES[opts.width]  # unused by the LM run; the report's width is the LM shape


def resolve(opts) -> None:
    """Check option combinations; fill in the defaults that depend on the registry."""
    if opts.task == "lm":
        resolve_lm(opts)
        opts.decode_batch_size = min(opts.decode_batch_size, opts.decode_sentences)
        check_device(opts.device)
        opts.precisions = list(dict.fromkeys(opts.precision or DEFAULT_PRECISIONS[opts.device][:1]))
        if opts.device == "cpu" and "fp16" in opts.precisions:
            raise BenchmarkError("--precision fp16 needs --device cuda (fairseq's --fp16 trainer calls .cuda())")
        if len(opts.precisions) > 1:
            raise BenchmarkError("--task lm measures one --precision per run")
        if opts.compiled:
            raise BenchmarkError("--compiled is measured for translation (--task translation) only")
        return
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
    check_device(opts.device)
    opts.precisions = list(dict.fromkeys(opts.precision or DEFAULT_PRECISIONS[opts.device]))
    if opts.compiled:  # the same line-ups once more, compiled: eager and compiled side by side in one run
        opts.precisions += [f"{p}{COMPILED}" for p in opts.precisions]
    if opts.device == "cpu" and "fp16" in opts.precisions:
        # fairseq 0.12.3's trainer moves a tensor to CUDA when a float16 step overflows (trainer.py, train_step)
        raise BenchmarkError("--precision fp16 needs --device cuda: fairseq's --fp16 trainer calls .cuda() when a "
                             "step overflows; on the CPU use --precision bf16")


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


def portable_command(argv: Sequence[str]) -> str:
    """The command line as a report prints it: a path inside the repository relative to it, any other absolute
    path as its last component behind ``<dir>/`` (committed reports name no directory of the machine)."""
    words = []
    for word in map(str, argv):
        path = Path(word)
        if path.is_absolute():
            try:
                word = str(path.resolve().relative_to(REPO))
            except ValueError:
                word = f"<dir>/{path.name}"
        words.append(word)
    return " ".join(words)


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
    report["command"] = "python -m scripts.benchmark.benchmark " + portable_command(sys.argv[1:] if argv is None else argv)
    report["seconds"] = time.time() - start
    publish(report, opts.markdown, opts.json)
    log(f"done in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
