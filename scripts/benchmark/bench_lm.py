"""``--task lm``: the plugin's language models (``{family}_lm_{width}d{depth}``, fairseq_plugins/lm/) against
fairseq's own ``transformer_lm`` of the same shape, measured in one process exactly as the translation line-ups
(bench_run.measure: warm-up, one-off memory and FLOPs, interleaved rounds, per-round ratios).

The baseline is fairseq's named LM arch ``transformer_lm_big`` given the preset's width, FFN, heads and depth
on the command line: fairseq's named LM archs run ``base_lm_architecture``, i.e. Pre-LN with a final LayerNorm
(fairseq's plain ``--arch transformer_lm`` takes its dataclass defaults instead, Post-LN without a final
LayerNorm), so it is the Pre-LN transformer LM with no plugin code; ``transformer_preln_lm_*`` equals it to the
bit (tests/test_lm_model.py) and is a family row here, a control for the plugin's LM wrapper.

Data: the corpus's target-side training sentences (each ending in EOS) as one token stream, cut by fairseq's
``TokenBlockDataset`` (``--sample-break-mode none``) into blocks of --tokens-per-sample tokens and collated by
``MonolingualDataset`` (next-token targets), as fairseq-train --task language_modeling batches it;
--max-tokens // --tokens-per-sample blocks per training batch. Generation: fairseq's SequenceGenerator through
``LanguageModelingTask.inference_step`` on --decode-sentences prefixes of --lm-prefix-len tokens (the first
tokens of blocks after the training ones), beam --beam; min_len = max_len_b = prefix + --decode-len and
max_len_a = 0, so every model continues every prefix by exactly --decode-len tokens.
"""

import argparse
import copy
import gc
import random
from pathlib import Path

import torch
from fairseq import options, tasks
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.data import MonolingualDataset, TokenBlockDataset
from fairseq.trainer import Trainer

from fairseq_plugins.lm import LM_FAMILIES, LM_PRESETS
from fairseq_plugins.lm.presets import LM_DEPTHS, LM_WIDTHS
from fairseq_plugins.precision import enable_autocast
from scripts.benchmark.bench_data import Batches, Corpus, encode
from scripts.benchmark.bench_families import (
    AUTOCAST,
    BenchmarkError,
    Contender,
    namespace_to_config,
    precision_args,
)
from scripts.benchmark.bench_run import measure, result_row

LM_BASELINE_ARCH = "transformer_lm_big"  # fairseq's; reshaped by the --decoder-* options below
LM_BASELINE = "fairseq transformer_lm"  # how the report names it
LM_DEPTH_NAMES = tuple(f"d{n}" for n in LM_DEPTHS)
LM_WIDTH_NAMES = {(infix.rstrip("_") or "base"): infix for infix in LM_WIDTHS}
# the LM criterion of fairseq's language_modeling examples and the DCA paper (no label smoothing)
LM_FAMILY_ARGS = {"crossformer_sg": ["--criterion", "label_smoothed_cross_entropy_with_guidance", "--label-smoothing", "0.0"]}


def lm_families() -> list[str]:
    """Every family with LM presets, the plugin's Pre-LN transformer included: a control, it is the baseline's model
    (equal to the bit, tests/test_lm_model.py), so its ratios show the cost of the plugin's LM wrapper alone."""
    return list(LM_FAMILIES)


def lm_family_args(family: str) -> tuple[list[str], str | None]:
    """The family's extra LM training options, and a note when its criterion is not registered yet."""
    args = list(LM_FAMILY_ARGS.get(family, []))
    if "--criterion" in args and args[args.index("--criterion") + 1] not in CRITERION_REGISTRY:
        return [], f"criterion {args[args.index('--criterion') + 1]} not registered: trained with cross_entropy"
    return args, None


def lm_shape(opts) -> dict[str, int]:
    width = LM_WIDTHS[LM_WIDTH_NAMES[opts.lm_width]]
    return {"decoder-embed-dim": opts.embed_dim or width.embed_dim, "decoder-ffn-embed-dim": opts.ffn_dim or width.ffn_dim,
            "decoder-attention-heads": opts.heads or width.heads}  # fmt: skip


def make_lm_batches(corpus: Corpus, d, opts) -> Batches:
    """Fixed training blocks and generation prefixes (see the module docstring), the same for every model."""
    rng = random.Random(opts.seed)
    block = opts.tokens_per_sample
    per_batch = max(1, opts.max_tokens // block)
    needed = (opts.train_batches * per_batch + 2 * opts.decode_sentences) * block  # prefixes: see below
    sentences = [encode(d, t) for _, t in rng.sample(corpus.train, len(corpus.train))]
    stream, total = [], 0
    for s in sentences:  # only as much of the corpus as the blocks need
        stream.append(s)
        total += len(s)
        if total > needed:
            break
    blocks = TokenBlockDataset(stream, [len(s) for s in stream], block, pad=d.pad(), eos=d.eos(), break_mode="none",
                               include_targets=True)  # fmt: skip
    dataset = MonolingualDataset(blocks, blocks.sizes, d, d, add_eos_for_other_targets=False, shuffle=False,
                                 targets=["future"])  # fmt: skip
    full = [i for i in range(len(dataset)) if blocks.sizes[i] == block]
    if len(full) < opts.train_batches * per_batch + 1:
        raise BenchmarkError(f"--train-batches {opts.train_batches}, --decode-sentences {opts.decode_sentences}: "
                             f"the corpus gives only {len(full)} blocks of {block} tokens")  # fmt: skip
    train = [dataset.collater([dataset[i] for i in full[k * per_batch : (k + 1) * per_batch]])
             for k in range(opts.train_batches)]  # fmt: skip
    # prefixes from the blocks after the training ones, without their EOS tokens (a forced EOS would end a
    # hypothesis inside its prefix)
    rest = torch.cat([dataset[i]["target"] for i in full[opts.train_batches * per_batch :]])
    rest = rest[rest != d.eos()]
    if len(rest) < opts.decode_sentences * opts.lm_prefix_len:
        raise BenchmarkError(f"--decode-sentences {opts.decode_sentences}: the corpus is too short for the prefixes")
    prefixes = rest[: opts.decode_sentences * opts.lm_prefix_len].view(opts.decode_sentences, opts.lm_prefix_len)
    decode = [{"id": torch.arange(k, k + len(p)), "nsentences": len(p), "ntokens": p.numel(),
               "net_input": {"src_tokens": p, "src_lengths": torch.full((len(p),), p.size(1))}, "target": None}
              for k in range(0, len(prefixes), opts.decode_batch_size)
              for p in [prefixes[k : k + opts.decode_batch_size]]]  # fmt: skip
    return Batches(train, decode, sum(s["ntokens"] for s in train), len(prefixes))


def build_lm_contender(name: str, arch: str, data_dir: Path, opts, precision: str = "fp32") -> Contender:
    extra, note = lm_family_args(name)
    device = getattr(opts, "device", "cpu")
    parser = options.get_training_parser()
    options.add_generation_args(parser)
    forced = opts.lm_prefix_len + opts.decode_len
    argv = [
        str(data_dir), "--task", "language_modeling", "--tokens-per-sample", str(opts.tokens_per_sample),
        "--sample-break-mode", "none", *(["--cpu"] if device == "cpu" else []),
        "--arch", arch, "--decoder-layers", str(opts.lm_layers[arch]), "--seed", str(opts.seed),
        *(a for k, v in lm_shape(opts).items() for a in (f"--{k}", str(v))),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--criterion", "cross_entropy",
        "--max-tokens", str(opts.max_tokens), "--num-workers", "0",
        "--beam", str(opts.beam), "--max-len-a", "0", "--max-len-b", str(forced), "--min-len", str(forced),
        *precision_args(precision, device), *extra,
    ]  # fmt: skip
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = namespace_to_config(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(opts.seed)
    model = enable_autocast(task.build_model(cfg.model), AUTOCAST.get(precision))
    decode_model = copy.deepcopy(model)
    decode_model.prepare_for_inference_(cfg)
    if precision == "fp16":
        decode_model.half()
    decode_model.to(device).eval()
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    generator = task.build_generator([decode_model], cfg.generation)
    return Contender(name, arch, trainer, task, decode_model, generator, cfg, cfg.criterion._name, note, precision, device)


def run_lm_depth(depth: str, families: list[str], data_dir: Path, batches: Batches, opts, log) -> dict:
    """The baseline and every family's LM preset at one depth, measured interleaved (first precision only)."""
    infix = LM_WIDTH_NAMES[opts.lm_width]
    layers = int(depth[1:])
    line_up = [(LM_BASELINE, LM_BASELINE_ARCH)]
    skipped = {}
    for family in families:
        arch = f"{family}_lm_{infix}{depth}"
        if arch in LM_PRESETS:
            line_up.append((family, arch))
        else:
            skipped[family] = f"no preset {arch}"
    opts.lm_layers = {arch: layers for _, arch in line_up}
    precision = opts.precisions[0]
    contenders = [build_lm_contender(name, arch, data_dir, opts, precision) for name, arch in line_up]
    # measure() checks every hypothesis against decode_len + 1 tokens: here the prefix is part of the hypothesis
    forced = argparse.Namespace(**{**vars(opts), "decode_len": opts.lm_prefix_len + opts.decode_len})
    try:
        measure(depth, contenders, batches, forced, log)
        base = contenders[0]
        shape = {"d": base.cfg.model.decoder_embed_dim, "f": base.cfg.model.decoder_ffn_embed_dim,
                 "layers": (0, layers), "vocab": len(base.task.target_dictionary)}  # fmt: skip
        rows = {c.name: result_row(c, base, batches, shape) for c in contenders}
    finally:
        contenders.clear()
        gc.unfreeze()  # settle() froze the models; let them go
        gc.collect()
    return {"depth": depth, "layers": [0, layers], "embed_dim": shape["d"], "ffn_dim": shape["f"], "vocab": shape["vocab"],
            "baseline_name": LM_BASELINE, "baseline_arch": LM_BASELINE_ARCH,
            "baseline": rows.pop(LM_BASELINE), "families": rows, "skipped": skipped, "profiles": {}}  # fmt: skip
