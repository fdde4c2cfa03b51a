"""The benchmark's run: for every depth and precision, build the line-up (the baseline and every family), measure
it in interleaved rounds, optionally profile the families that miss a target, and gather the report dict."""

import contextlib
import gc
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from fairseq_plugins.modules.compiled import compile_ideas
from scripts.benchmark.bench_data import Batches, Corpus, build_dictionary, make_batches
from scripts.benchmark.bench_families import (
    BASELINE,
    DEPTHS,
    PRESETS,
    REPO,
    SRC,
    TGT,
    WIDTHS,
    Contender,
    build_contender,
)
from scripts.benchmark.bench_report import missed_metrics, target_records
from scripts.benchmark.bench_timing import (
    best_op_times,
    counted_train_flops,
    decode_once,
    largest_batch,
    matmul_peak,
    model_train_flops,
    on_device,
    peak_train_memory,
    ratios,
    spread,
    train_once,
)
from scripts.study.study_common import git_commit


def run_depth(depth: str, families: list[str], data_dir: Path, batches: Batches, opts, log) -> dict:
    """Build the baseline and every family at one depth, measure them interleaved, return the results: the
    first precision's as always, any further precision's (each against the baseline in that precision) under
    ``other_precisions``."""
    line_up = [(BASELINE, f"{BASELINE}_{opts.width_infix}{depth}")]
    skipped = {}
    for family in families:
        arch = f"{family}_{opts.width_infix}{depth}"
        if arch in PRESETS:
            line_up.append((family, arch))
        else:
            skipped[family] = f"no preset {arch}"
    precisions = getattr(opts, "precisions", ["fp32"])
    result: dict = {}
    for precision in precisions:
        label = depth if len(precisions) == 1 else f"{depth} {precision}"
        profile = precision == precisions[0] and not precision.endswith(COMPILED)
        shape, rows, profiles = run_line_up(label, line_up, precision, data_dir, batches, opts, log, profile)
        if not result:
            result = {"depth": depth, "layers": list(shape["layers"]), "embed_dim": shape["d"], "ffn_dim": shape["f"],
                      "vocab": shape["vocab"], "baseline": rows.pop(BASELINE), "families": rows, "skipped": skipped,
                      "profiles": profiles}  # fmt: skip
        else:
            result.setdefault("other_precisions", {})[precision] = {"baseline": rows.pop(BASELINE), "families": rows}
    return result


COMPILED = "+compiled"  # a precision's suffix (benchmark.py --compiled): the same line-up with its layers compiled


def run_line_up(label: str, line_up, precision: str, data_dir: Path, batches: Batches, opts, log, profile: bool):
    compiled = precision.endswith(COMPILED)
    precision = precision.removesuffix(COMPILED)
    contenders = [build_contender(name, arch, data_dir, opts, precision) for name, arch in line_up]
    if compiled:
        torch._dynamo.reset()  # the eager line-up's models are gone; so are their graphs
        for c in contenders:  # the training copy and the decoding copy, each compiled in place
            compile_ideas(c.trainer.model, backend=opts.compile_backend)
            compile_ideas(c.decode_model, backend=opts.compile_backend)
    depth = label.split()[0]
    try:
        measure(label, contenders, batches, opts, log)
        base = contenders[0]
        shape = {"d": base.cfg.model.encoder_embed_dim, "f": base.cfg.model.encoder_ffn_embed_dim,
                 "layers": DEPTHS[depth], "vocab": len(base.task.target_dictionary)}  # fmt: skip
        rows = {c.name: result_row(c, base, batches, shape) for c in contenders}
        profiles = profile_contenders(depth, contenders, rows, batches, opts, log) if profile else {}
    finally:
        contenders.clear()
        gc.unfreeze()  # settle() froze the models; let them go
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return shape, rows, profiles


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
    decode_batch = on_device(batches.decode[:1], base.device)[0]
    work = {"train": lambda c: (lambda: c.trainer.train_step([largest])),
            "decode": lambda c: (lambda: c.task.inference_step(c.generator, [c.decode_model], decode_batch))}  # fmt: skip
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


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only settable before the first inter-op parallel work
        torch.set_num_interop_threads(1)


def run_benchmark(opts, corpus: Corpus, log: Callable[[str], None] = lambda _: None) -> dict:
    """The whole benchmark for resolved options: a report dict (see markdown())."""
    set_threads(opts.threads)
    lm = getattr(opts, "task", "translation") == "lm"
    if lm:
        from scripts.benchmark.bench_lm import (  # bench_lm imports this module
            lm_shape,
            make_lm_batches,
            run_lm_depth,
        )
    dictionary = build_dictionary(corpus, opts.vocab_size)
    batches = (make_lm_batches if lm else make_batches)(corpus, dictionary, opts)
    peak_start = matmul_peak(opts.peak_repeats, device=opts.device) if opts.peak_repeats else None
    log(f"matmul peak {(peak_start or 0) / 1e9:.1f} GFLOP/s on {opts.device}, {opts.threads} thread(s); "
        f"{batches.train_target_tokens} target tokens per training measurement")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for lang in (SRC, TGT):  # the translation task reads its dictionaries from the data directory
            dictionary.save(str(Path(tmp) / f"dict.{lang}.txt"))
        dictionary.save(str(Path(tmp) / "dict.txt"))  # the language_modeling task's
        size = getattr(opts, "group_size", None) or len(opts.families) or 1
        groups = [opts.families[i : i + size] for i in range(0, len(opts.families), size)] or [[]]
        for depth in opts.depths:
            for number, group in enumerate(groups, 1):
                result = (run_lm_depth if lm else run_depth)(depth, group, Path(tmp), batches, opts, log)
                if len(groups) > 1:  # the group's own baseline: its row says which group it belongs to
                    result["group"] = number
                results.append(result)
    peak_end = matmul_peak(opts.peak_repeats, device=opts.device) if opts.peak_repeats else None
    width = WIDTHS[opts.width_infix]
    report = {
        "machine": {
            "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "threads": opts.threads, "torch": torch.__version__,
            "matmul_peak_gflops": max(peak_start, peak_end) / 1e9 if peak_start else None,
            "matmul_peak_gflops_start_end": [peak_start / 1e9, peak_end / 1e9] if peak_start else None,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "grn_kernels": grn_kernels_status(opts.device),
            "gpu": torch.cuda.get_device_name() if opts.device == "cuda" else None,
            "commit": git_commit(REPO),  # the code measured ("+dirty": with uncommitted changes)
        },
        "settings": {
            "width": f"{opts.embed_dim or width.embed_dim}/{opts.ffn_dim or width.ffn_dim}/"
                     f"{opts.heads or width.heads} (model/FFN/heads)",
            "threads": opts.threads, "rounds": opts.rounds, "warmup": opts.warmup, "max_tokens": opts.max_tokens,
            "train_batches": opts.train_batches, "train_target_tokens": batches.train_target_tokens,
            "group_size": getattr(opts, "group_size", None),
            "decode_sentences": batches.decode_sentences, "decode_batch_size": opts.decode_batch_size,
            "decode_len": opts.decode_len, "beam": opts.beam, "vocab": len(dictionary), "seed": opts.seed,
            "decode": not opts.no_decode, "memory": not opts.no_memory, "profile": opts.profile,
            "profile_repeats": opts.profile_repeats, "device": opts.device, "precisions": opts.precisions,
        },
        "corpus": corpus.source,
        "results": results,
        "not_benchmarked": opts.unmatched,
    }  # fmt: skip
    if lm:  # issue 15's targets are for the translation models; the language models have none yet
        report["settings"] |= {"task": "lm", "width": "/".join(map(str, lm_shape(opts).values())) + " (model/FFN/heads)",
                               "tokens_per_sample": opts.tokens_per_sample, "lm_prefix_len": opts.lm_prefix_len}
        report["targets"] = []
        return report
    report["targets"] = target_records(results)
    return report


def grn_kernels_status(device: str = "cpu") -> str:
    """Which GRN code DCA ran: the fused CPU kernels, or the PyTorch code and why."""
    from fairseq_plugins.kernels import grn_kernel

    if device != "cpu":
        return "PyTorch code (the fused kernels are CPU float32 only)"
    if grn_kernel.library() is not None:
        return "fused CPU kernels"
    return f"PyTorch code ({grn_kernel.failure or 'kernels turned off by ' + grn_kernel.ENV_SWITCH + '=0'})"
