"""The benchmark's report: the targets' verdicts and the Markdown tables (ratios, absolute throughput, memory,
MFU; per precision when several were measured; the profiles of the families that miss a target)."""

import json
from pathlib import Path

from scripts.benchmark.bench_families import BASELINE, TARGETS

# reports move into place whole: an interrupted run leaves the old one
from scripts.recipe_common import write_text as write_report

# the metrics whose rows hold per-round ratios (a dict with a median) and that a profile can explain; memory
# is one deterministic ratio, and its breakdown is in the memory measurement itself
THROUGHPUT_METRICS = ("train", "decode")


def missed_metrics(family: str, depth: str, row: dict) -> list[str]:
    """The throughput metrics (train, decode) on which ``row`` misses one of the family's targets."""
    return [t.metric for t in TARGETS
            if t.family == family and t.metric in THROUGHPUT_METRICS and t.depth in (None, depth)
            and f"{t.metric}_ratio" in row and not t.holds(row[f"{t.metric}_ratio"]["median"])]  # fmt: skip


def target_records(results: list[dict]) -> list[dict]:
    """check_targets' verdicts as a report's JSON holds them (each target as a plain dict)."""
    return [dict(v, target=dict(vars(v["target"]))) for v in check_targets(results)]


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



def _ratio(row: dict, key: str) -> str:
    cell = row.get(key)
    return f"**{cell['median']:.2f}** ({cell['min']:.2f}-{cell['max']:.2f}; CPU {cell['cpu']:.2f})" if cell else "-"


def _table_row(depth: str, name: str, row: dict, base: dict, peak_flops: float, note: str = "") -> str:
    is_base = row is base
    flops, base_flops = row["counted_matmul_flops_per_step"], base["counted_matmul_flops_per_step"]
    memory = row.get("memory", {}).get("peak_bytes")
    decode = row.get("decode_sentences_per_s")
    cells = [
        depth.upper(),
        f"`{name}`{note}",
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


def commits_of(machine: dict) -> list[str]:
    """The commits of the code a report measured: a merged report's runs' (``commits``), else the run's own."""
    return machine.get("commits") or ([machine["commit"]] if machine.get("commit") else [])


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
        + _device_sentence(report)
    )
    if s.get("task") == "lm":
        header = lm_header(report)
    if report.get("command"):
        header += (f" Made by `OMP_NUM_THREADS={s['threads']} {report['command']}` in "
                   f"{report.get('seconds', 0) / 60:.0f} minutes.")  # fmt: skip
    commits = commits_of(m)
    if commits:  # reports made before the commit was recorded have none
        header += f" Code: commit {', '.join(c[:7] + ('+dirty' if c.endswith('+dirty') else '') for c in commits)}."
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
        group = f" (group {res['group']})" if "group" in res else ""
        lines.append(_table_row(res["depth"], res.get("baseline_name", BASELINE), base, base, peak_flops, group))
        for name, row in res["families"].items():
            lines.append(_table_row(res["depth"], name, row, base, peak_flops))
        for family, why in res["skipped"].items():
            lines.append(f"| {res['depth'].upper()} | `{family}` | skipped: {why} | | | | | | | | |")
        if base["counted_matmul_flops_per_step"] and res.get("group", 1) == 1:
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
    if s.get("task") == "lm":
        return "\n".join([*lines, "", "No targets: issue 15's targets are for the translation models."]) + "\n"
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
    lines += precision_table(report)
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


def lm_header(report: dict) -> str:
    """The header of a --task lm report (bench_lm.py): what was compared with what, on which data."""
    m, s = report["machine"], report["settings"]
    arch = report["results"][0]["baseline_arch"] if report["results"] else "transformer_lm_big"
    return (
        f"Language models (`--task lm`): ratios of each family's LM preset (`{{family}}_lm_*`) to fairseq's own "
        f"transformer LM of the same shape, measured in the same run: fairseq's `{arch}` given the preset's width, "
        f"FFN, heads and depth as `--decoder-*` options, i.e. Pre-LN with a final LayerNorm as all of fairseq's named "
        f"LM archs (its plain `transformer_lm` is Post-LN without one), no plugin code. Median over {s['rounds']} interleaved rounds of wall-clock throughput (min-max; CPU: median ratio of "
        f"process CPU times, immune to time lost to other processes). Width {s['width']}; {s['threads']} thread(s) "
        f"on {m['cpu']} ({m['cpus']} CPUs), torch {m['torch']}; {report['corpus']}, target side, as one token stream "
        f"in blocks of {s['tokens_per_sample']} tokens (fairseq's TokenBlockDataset, next-token targets, cross "
        f"entropy), {s['train_batches']} training batch(es) of {s['max_tokens'] // s['tokens_per_sample']} blocks; "
        f"generation: fairseq's SequenceGenerator, beam {s['beam']}, {s['decode_sentences']} prefixes of "
        f"{s['lm_prefix_len']} tokens continued by exactly {s['decode_len']} tokens (decode sent/s = prefixes/s); "
        + (f"float32 matmul peak {m['matmul_peak_gflops']:.1f} GFLOP/s" if m["matmul_peak_gflops"] else "")
        + (f"; DCA's GRNs: {m['grn_kernels']}." if m.get("grn_kernels") else ".")
        + _device_sentence(report)
        + _load_sentence(m)
    )


def _load_sentence(m: dict) -> str:
    """How busy the machine was: the 1-minute load average at the end of the run, against its CPUs."""
    load = (m.get("load_average") or [None])[0]
    if load is None:
        return ""
    busy = load > 0.75 * m["cpus"]
    return (f" Load average {load:.1f} at the end on {m['cpus']} CPUs" + (": the machine was busy with other work, "
            "so the wall-clock ratios are noisy and the CPU-time ratios are the steadier estimate." if busy else "."))


def _device_sentence(report: dict) -> str:
    """Nothing for the default CPU float32 run (its report reads as it always did), else the device and precisions."""
    s = report["settings"]
    device, precisions = s.get("device", "cpu"), s.get("precisions", ["fp32"])
    if device == "cpu" and precisions == ["fp32"]:
        return ""
    gpu = f" ({report['machine']['gpu']})" if report["machine"].get("gpu") else ""
    return (f" Device {device}{gpu}; precisions {', '.join(precisions)} (fp16: fairseq's --fp16; bf16: the "
            f"plugin's bfloat16 autocast), each against the baseline in the same precision; the main "
            f"table is {precisions[0]}.")  # fmt: skip


def precision_table(report: dict) -> list[str]:
    """One row per depth and model, per precision: training tok/s (ratio), decoding sent/s (ratio), peak MiB."""
    precisions = report["settings"].get("precisions", ["fp32"])
    if len(precisions) < 2:
        return []
    head = ["depth", "family"] + [f"{p} {what}" for p in precisions for what in ("train tok/s (ratio)",
                                                                              "decode sent/s (ratio)", "peak MiB")]
    lines = ["", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (3 * len(precisions))]

    def cells(row: dict | None, is_base: bool) -> list[str]:
        if row is None:
            return ["-", "-", "-"]
        ratio = {k: "1" if is_base else (f"{row[k]['median']:.2f}" if k in row else "-")
                 for k in ("train_ratio", "decode_ratio")}  # fmt: skip
        decode = row.get("decode_sentences_per_s")
        memory = row.get("memory", {}).get("peak_bytes")
        return [f"{row['train_tokens_per_s']['median']:.0f} ({ratio['train_ratio']})",
                f"{decode['median']:.2f} ({ratio['decode_ratio']})" if decode else "-",
                f"{memory / 2**20:.0f}" if memory else "-"]  # fmt: skip

    for res in report["results"]:
        by = {precisions[0]: {"baseline": res["baseline"], "families": res["families"]}, **res.get("other_precisions", {})}
        names = [BASELINE, *res["families"]]
        for name in names:
            row = [res["depth"].upper(), f"`{name}`"]
            for p in precisions:
                part = by.get(p, {})
                row += cells(part.get("baseline") if name == BASELINE else part.get("families", {}).get(name),
                             name == BASELINE)  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    return lines


def publish(report: dict, markdown_path: Path | None, json_path: Path | None) -> None:
    """Print the Markdown report and write it and the JSON where asked (benchmark.py, bench_merge.py)."""
    text = markdown(report)
    print(text)
    if markdown_path:
        write_report(markdown_path, text)
    if json_path:
        write_report(json_path, json.dumps(report, indent=1) + "\n")
