#!/usr/bin/env python
"""One check a GPU machine runs unchanged (through gpu_check.sh): does every family train and decode on CUDA?

    bash scripts/benchmark/gpu_check.sh                          # every family, 20 updates, fp16 and bf16
    bash scripts/benchmark/gpu_check.sh --updates 50 --family dca --out gpu_check

For every family (its ``{family}_iwslt_e6d6`` preset, or its shallowest: crossformer_all_e16d6) and every sampled axis combination
(COMBINATIONS), and for each precision (fp16: fairseq's ``--fp16``, half weights with dynamic loss scaling;
bf16: the plugin's autocast, what ``--autocast-dtype bfloat16`` does), on synthetic batches:
- train --updates updates with fairseq's own Trainer (Adam, label-smoothed cross entropy): the last logged
  loss must be finite and at least one update applied (fp16 may skip steps while its loss scale settles);
- decoding: the decoder's logits computed step by step with the incremental cache must equal the full pass
  within a few roundings of the precision (eval mode, same weights);
- record which GRN code DCA ran (the fused kernels are CPU float32 only, so on CUDA: PyTorch), the training
  time of the family over the Pre-LN baseline's in the same precision (``time ratio``, updates after the first:
  > 1 is slower),
  and the peak memory of building and training the model (torch.cuda.max_memory_allocated over the check, less
  what was allocated before it).
Each check runs eager and, with ``--mode compiled``, with the idea modules compiled (``--compile-backend``,
default inductor, which emits Triton kernels on a GPU: fairseq_plugins/modules/compiled.py); on CUDA both modes by
default, so the first GPU measures each family both ways (time ratios to Pre-LN in the same precision and mode).
It writes one report, ``--out``/gpu_check.md and .json, and exits 1 if any check failed, 0 otherwise. On a
machine without CUDA it says so, writes a report saying nothing ran, and exits 0. ``--device cpu`` runs the same
checks on the CPU in bf16 (fp16 training needs CUDA in fairseq 0.12.3): how this script is tested here.
"""

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch
from fairseq.logging import metrics

from fairseq_plugins.modules.compiled import compile_ideas
from scripts.benchmark.bench_data import (
    build_dictionary,
    make_batches,
    synthetic_corpus,
)
from scripts.benchmark.bench_families import (
    BASELINE,
    PRESETS,
    SRC,
    TGT,
    build_contender,
    registered_families,
)
from scripts.benchmark.bench_report import write_report as write_text_atomic
from scripts.benchmark.bench_timing import on_device, synchronize

# Sampled combinations of the axes (wiring x depth reading x tying ...), checked like the families: (name, arch,
# extra fairseq-train options). Empty until the composed model (issue 26) has axis options; then add e.g.
# ("pre+dca+tied", "composed_iwslt_e6d6", ["--wiring", "pre", "--depth-reading", "dca", "--tying", "kq"]).
COMBINATIONS: list[tuple[str, str, list[str]]] = []
TOLERANCE_EPS = {"fp32": 2.0**-20, "bf16": 2.0**-7, "fp16": 2.0**-10}  # spacing of the format's numbers in [1, 2)


def family_arch(family: str) -> str | None:
    """The family's IWSLT-width E6D6 preset, else its shallowest preset (IWSLT width first)."""
    if f"{family}_iwslt_e6d6" in PRESETS:
        return f"{family}_iwslt_e6d6"
    archs = [p.arch for p in PRESETS.values() if p.family == family]
    return min(archs, key=lambda a: ("_iwslt_" not in a, PRESETS[a].encoder_layers + PRESETS[a].decoder_layers),
               default=None)  # fmt: skip


def targets(opts) -> list[tuple[str, str, list[str]]]:
    """(name, arch, extra options) of everything to check: the baseline first, then families, then COMBINATIONS."""
    families = opts.family or [BASELINE, *registered_families()]
    out = [(BASELINE, family_arch(BASELINE), [])] if BASELINE not in families else []
    out += [(f, family_arch(f), []) for f in families if family_arch(f)]
    return out + [c for c in COMBINATIONS if not opts.family]


def grn_code_path(contender) -> str:
    """Which GRN code one training forward ran: kernel, PyTorch, or - (the model has no GRN)."""
    from fairseq_plugins.kernels import grn_kernel

    seen: list[bool] = []
    usable = grn_kernel.usable

    def spy(*args, **kwargs):
        seen.append(bool(usable(*args, **kwargs)))
        return seen[-1]

    grn_kernel.usable = spy
    try:
        sample = contender.extra["sample"]
        with torch.no_grad(), metrics.aggregate(new_root=True):
            contender.trainer.model.train()
            contender.trainer.model(**contender.trainer._prepare_sample(sample)[0]["net_input"])
    finally:
        grn_kernel.usable = usable
    return "-" if not seen else ("kernel" if all(seen) else "PyTorch" if not any(seen) else "mixed")


def decoding_gap(contender, batch: dict) -> tuple[float, float]:
    """Largest |incremental - full| of the decoder's logits on ``batch``, and the largest |logit|."""
    model, device = contender.decode_model, contender.device
    batch = on_device([batch], device)[0]
    net = batch["net_input"]
    d = contender.task.target_dictionary
    g = torch.Generator().manual_seed(0)  # no pads: the incremental path gets no padding mask
    prev = torch.randint(d.nspecial, len(d), (net["src_tokens"].size(0), 8), generator=g).to(net["src_tokens"])
    prev[:, 0] = d.eos()
    with torch.no_grad():
        encoder_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        full, _ = model.decoder(prev, encoder_out=encoder_out)
        state: dict = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0]
                 for t in range(prev.size(1))]  # fmt: skip
    full, inc = full.float(), torch.cat(steps, dim=1).float()
    return (inc - full).abs().max().item(), full.abs().max().item()


def check_one(name: str, arch: str, extra: list[str], precision: str, data_dir: Path, batches, opts,
              mode: str = "eager") -> dict:  # fmt: skip
    """Train, decode and measure one model, eager or with its layers compiled; a dict of the report's row (``ok``
    False on any failure)."""
    row = {"name": name, "arch": arch, "precision": precision, "mode": mode, "ok": False}
    gc.collect()  # the previous check's model, trainer and optimizer state
    before = 0
    if opts.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    try:
        c = build_contender(name, arch, data_dir, opts, precision, extra)
        if mode == "compiled":
            torch._dynamo.reset()  # the previous model's graphs
            compile_ideas(c.trainer.model, backend=opts.compile_backend)
        c.extra["sample"] = batches.train[0]
        row["grn_code"] = grn_code_path(c)
        if c.device == "cuda":
            c.trainer.cuda_env = None  # fairseq would reset the peak inside every train_step
        losses, start = [], time.perf_counter()
        for i in range(opts.updates):
            if i == 1:  # the first update (allocations, kernel selection) is left out of the time
                synchronize(c.device)
                start = time.perf_counter()
            out = c.trainer.train_step([batches.train[i % len(batches.train)]])
            losses.append(None if out is None else float(out["loss"]))
        synchronize(c.device)
        row["train_seconds"] = time.perf_counter() - start
        row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20 if c.device == "cuda" else None
        logged = [x for x in losses if x is not None]
        row["final_loss"] = logged[-1] if logged else None
        row["updates_applied"] = c.trainer.get_num_updates()
        row["finite_loss"] = bool(logged) and math.isfinite(logged[-1]) and row["updates_applied"] > 0
        gap, scale = decoding_gap(c, batches.decode[0])
        row["decode_gap"], row["decode_tolerance"] = gap, 8 * TOLERANCE_EPS[precision] * max(1.0, scale)
        row["incremental_equals_full"] = gap <= row["decode_tolerance"]
        row["ok"] = row["finite_loss"] and row["incremental_equals_full"]
    except Exception as err:  # noqa: BLE001  (one failing family must not hide the others' results)
        row["error"] = f"{type(err).__name__}: {err}"
    return row


def add_time_ratios(rows: list[dict]) -> None:
    """Each row's training time over the baseline's in the same precision and mode (> 1: slower than Pre-LN)."""
    base = {(r["precision"], r.get("mode")): r.get("train_seconds") for r in rows if r["name"] == BASELINE}
    for r in rows:
        b = base.get((r["precision"], r.get("mode")))
        r["time_ratio"] = r["train_seconds"] / b if b and r.get("train_seconds") else None


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict) -> str:
    lines = [f"# GPU check\n\n{report['summary']}\n"]
    if not report["rows"]:
        return "\n".join(lines)
    lines += [("| check | arch | precision | mode | final loss | updates applied | incremental vs full (tolerance) | GRN code "
              "| time ratio to Pre-LN | peak MiB | result |"), "|---|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in report["rows"]:
        gap = (f"{r['decode_gap']:.2e} ({r['decode_tolerance']:.2e})" if r.get("decode_gap") is not None else "-")
        result = "PASS" if r["ok"] else "FAIL" + (f": {r['error']}" if r.get("error") else "")
        lines.append(f"| `{r['name']}` | `{r['arch']}` | {r['precision']} | {r.get('mode', 'eager')} | "
                     f"{_fmt(r.get('final_loss'), '.3f')} | "
                     f"{_fmt(r.get('updates_applied'))} | {gap} | {r.get('grn_code', '-')} | "
                     f"{_fmt(r.get('time_ratio'), '.2f')} | {_fmt(r.get('peak_mib'), '.0f')} | {result} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> None:
    write_text_atomic(out / "gpu_check.md", markdown(report))
    write_text_atomic(out / "gpu_check.json", json.dumps(report, indent=1) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", action="append", metavar="NAME",
                   help="check only this family (repeatable; default every family and COMBINATIONS)")
    p.add_argument("--precision", action="append", choices=["fp16", "bf16", "fp32"],
                   help="repeatable; default fp16 and bf16 on CUDA, bf16 on the CPU")
    p.add_argument("--updates", type=int, default=20, help="training updates per model and precision (default 20)")
    p.add_argument("--max-tokens", type=int, default=1024, help="tokens per training batch (default 1024)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default; without CUDA nothing runs and the exit status is 0) or cpu (tests)")
    p.add_argument("--embed-dim", type=int, help="override the presets' width (tests use a tiny one)")
    p.add_argument("--ffn-dim", type=int, help="override the presets' FFN width")
    p.add_argument("--heads", type=int, help="override the presets' attention heads")
    p.add_argument("--mode", action="append", choices=["eager", "compiled"],
                   help="repeatable; default eager and compiled on CUDA, eager on the CPU (compiled: the idea modules "
                        "through torch.compile, fairseq_plugins/modules/compiled.py)")
    p.add_argument("--compile-backend", default="inductor", choices=["inductor", "aot_eager", "eager"],
                   help="torch.compile backend of --mode compiled (default inductor: Triton kernels on a GPU)")
    p.add_argument("--out", type=Path, default=Path("gpu_check"), help="report directory (default ./gpu_check)")
    p.add_argument("--seed", type=int, default=1)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.updates < 1:
        parser.error(f"--updates must be >= 1, got {opts.updates}")
    known = [BASELINE, *registered_families()]
    unknown = [f for f in opts.family or [] if f not in known]
    if unknown:
        parser.error(f"--family {', '.join(unknown)}: not a registered family; choose from {', '.join(known)}")
    if opts.device == "cuda" and not torch.cuda.is_available():
        summary = (f"No CUDA device is available (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
                   "nothing was checked. Run this on a GPU machine.")  # fmt: skip
        print(summary)
        write_report({"summary": summary, "cuda": False, "rows": []}, opts.out)
        return 0
    precisions = opts.precision or (["fp16", "bf16"] if opts.device == "cuda" else ["bf16"])
    if opts.device == "cpu" and "fp16" in precisions:
        parser.error("--precision fp16 needs --device cuda (fairseq's --fp16 trainer calls .cuda() on an overflow)")
    modes = opts.mode or (["eager", "compiled"] if opts.device == "cuda" else ["eager"])
    opts.beam, opts.decode_len = 1, 8  # read by build_contender (generation options it parses)
    corpus = synthetic_corpus(n_train=1000, n_test=16)
    dictionary = build_dictionary(corpus, 512)
    batch_opts = argparse.Namespace(seed=opts.seed, train_batches=4, max_tokens=opts.max_tokens,
                                    decode_sentences=8, decode_batch_size=8)  # fmt: skip
    batches = make_batches(corpus, dictionary, batch_opts)
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for lang in (SRC, TGT):
            dictionary.save(str(Path(tmp) / f"dict.{lang}.txt"))
        for name, arch, extra in targets(opts):
            for precision in precisions:
                for mode in modes:
                    rows.append(check_one(name, arch, extra, precision, Path(tmp), batches, opts, mode))
                    print(f"{name} {precision} {mode}: {'PASS' if rows[-1]['ok'] else 'FAIL'}", file=sys.stderr, flush=True)
    add_time_ratios(rows)
    failed = [f"{r['name']} {r['precision']} {r['mode']}" for r in rows if not r["ok"]]
    device = torch.cuda.get_device_name() if opts.device == "cuda" else "CPU"
    summary = (f"{len(rows) - len(failed)} of {len(rows)} checks passed on {device} (torch {torch.__version__}), "
               f"{opts.updates} updates each" + (f"; FAILED: {', '.join(failed)}." if failed else "."))  # fmt: skip
    report = {"summary": summary, "cuda": opts.device == "cuda", "device": device, "updates": opts.updates, "rows": rows}
    write_report(report, opts.out)
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
