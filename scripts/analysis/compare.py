#!/usr/bin/env python
"""Collect training and evaluation runs into one comparison: a Markdown table (architecture, layers,
parameters, BLEU, chrF, training time, tokens/s) and plots (validation loss against updates and against wall
time; BLEU against parameters).

Inputs:
- ``--log [RUN=]PATH``: a fairseq-train log (its stdout/stderr or ``--log-file``), in ``--log-format json`` or
  the default ``simple`` format (``tqdm`` writes the same end-of-epoch lines). From it: the architecture and
  depths (the configuration fairseq prints first), the parameter count ("num. shared model params"), the
  validation losses, the training time ("done training in X seconds", summed over resumed segments in one
  file; else the last "wall") and the training speed (fairseq's ``wps``, target tokens per second, averaged
  over the epoch summaries). A validation record's wall time is the "wall" of the last training record before
  it plus the log-time between the two. The run is named RUN, else after the architecture.
- ``--eval PATH``: evaluation results as JSON: one object, a list of objects, or one object per line, each

      {"arch": "residual_iwslt_e6d6", "run": "optional name, default: arch", "bleu": 35.1, "chrf": 60.2,
       "params": 11100000, "encoder_layers": 6, "decoder_layers": 6, "train_seconds": 1320, ...}

  where only "arch" (or "run") is required. Keys are matched case-insensitively ("BLEU", "chrF"), a score
  may be sacrebleu's JSON object ({"name": "BLEU", "score": 35.1, ...}), and the recipes' own outputs are
  read as they are: recipes/main_job.sh's ``results.json`` (its "models" list; "parameters", "num_updates",
  "valid_loss" are understood) and scripts/training/evaluate_recipe.py's ``results.json`` (the scores of its one
  average, else of its one test set, else the mean over its test sets; the architecture and training facts
  from the checkpoint's save directory and the ``train_summary.json`` train_recipe.py writes there).
  Records are matched to logs by run name; the last record of a run wins; a log's measurements win over a
  record's. "best valid loss" is the best of the log's validation losses, or the recipes' last one.

    python -m scripts.analysis.compare --log checkpoints/residual_iwslt_e6d6/train.log --eval results.json --out cmp
"""

import argparse
import json
import re
from datetime import datetime
from pathlib import Path

from scripts.analysis.analysis_common import (
    pyplot,
    save_figure,
    with_suffix,
    write_csv,
    write_json,
    write_text,
)

LINE = re.compile(r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,\d+)? \| \w+ \| (?P<tag>[\w.]+) \| (?P<body>.*)$")
ARCH = re.compile(r"""\barch['"]?\s*[=:]\s*['"]([\w.-]+)['"]""")
LAYERS = re.compile(r"""\b(encoder|decoder)_layers['"]?\s*[=:]\s*(\d+)""")
PARAMS = re.compile(r"num\. shared model params: ([\d,]+)")
DONE = re.compile(r"done training in ([\d.]+) seconds")
SCORES = ("bleu", "chrf")
# the recipes' key -> this schema's key (scripts/training/train_recipe.py's train_summary.json, main_job's results.json)
ALIASES = {"parameters": "params", "num_updates": "updates", "valid_loss": "last_valid_loss"}


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def parse_stats(tag: str, body: str) -> dict | None:
    """The stats of one fairseq progress record, json or simple format; keys without the tag prefix."""
    body = body.strip()
    if body.startswith("{"):
        try:
            raw = json.loads(body)
        except json.JSONDecodeError:
            return None
        prefix = tag + "_"
        return {k.removeprefix(prefix): _number(v) for k, v in raw.items()}
    if tag == "train_inner":  # "epoch 001:     20 / 113 loss=7.1, nll_loss=7.0, ..., wall=12"
        pairs = (item.split("=", 1) for item in body.split(", ") if "=" in item)
        stats = {k.strip().split()[-1]: _number(v) for k, v in pairs}
    else:  # "epoch 001 | valid on 'valid' subset | loss 6.5 | nll_loss 6.4 | ... | num_updates 4"
        pairs = (item.rsplit(" ", 1) for item in body.split(" | ") if " " in item)
        stats = {k.strip(): _number(v) for k, v in pairs}
    return stats if "num_updates" in stats else None


def parse_log(path: Path, run: str | None = None) -> dict:
    """Everything compare needs from one fairseq-train log."""
    out = {"run": run, "arch": None, "log": str(path), "encoder_layers": None, "decoder_layers": None,
           "params": None, "valid": [], "train_wps": [], "inner_wps": [], "done_seconds": [], "last_wall": None}
    last_train = None  # (time, wall) of the latest training record
    for line in path.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if not match:
            continue
        tag, body = match["tag"], match["body"]
        time = datetime.strptime(match["time"], "%Y-%m-%d %H:%M:%S")
        if tag == "fairseq_cli.train":
            _read_setup(body, out)
            continue
        if tag not in ("train", "train_inner") and not tag.startswith("valid"):
            continue
        stats = parse_stats(tag, body)
        if stats is None:
            continue
        if tag.startswith("valid"):
            since = (time - last_train[0]).total_seconds() if last_train else 0.0
            wall = (last_train[1] if last_train else 0.0) + since
            out["valid"].append({"subset": tag, "updates": stats["num_updates"], "loss": stats.get("loss"),
                                 "wall": wall})
            continue
        if stats.get("wall") is not None:
            last_train = (time, stats["wall"])
            out["last_wall"] = stats["wall"]
        if stats.get("wps") is not None:
            out["train_wps" if tag == "train" else "inner_wps"].append(stats["wps"])
    if out["arch"] is None:
        raise SystemExit(f"--log {path}: no fairseq-train configuration found (is it a fairseq-train log?)")
    out["run"] = out["run"] or out["arch"]
    return out


def _read_setup(body: str, out: dict) -> None:
    if out["arch"] is None and (arch := ARCH.search(body)):
        out["arch"] = arch.group(1)
        for side, layers in LAYERS.findall(body):
            out[f"{side}_layers"] = int(layers)
    if params := PARAMS.search(body):
        out["params"] = int(params.group(1).replace(",", ""))
    if done := DONE.search(body):
        out["done_seconds"].append(float(done.group(1)))


def load_evals(path: Path) -> list[dict]:
    """Evaluation records from a JSON object, a JSON list or JSON lines, in the normalized schema."""
    text = path.read_text()
    try:
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise SystemExit(f"--eval {path}: record {i} is not a JSON object")
        if isinstance(record.get("models"), list):  # recipes/main_job.sh's results.json
            out += [normalize_record(r, path, f"models[{j}]") for j, r in enumerate(record["models"])]
        else:
            out.append(normalize_record(record, path, f"record {i}"))
    return out


def normalize_record(record: dict, path: Path, where: str) -> dict:
    """Lower-case keys, the recipes' names mapped to the schema's, scores as numbers."""
    record = {k.lower(): v for k, v in record.items()}
    if isinstance(record.get("tests"), dict):  # scripts/training/evaluate_recipe.py's results.json
        record = {**_from_evaluate_recipe(record), **{k: v for k, v in record.items() if k in ("arch", "run")}}
    for alias, key in ALIASES.items():
        if record.get(key) is None and record.get(alias) is not None:
            record[key] = record[alias]
    for score in SCORES:
        if isinstance(record.get(score), dict):  # sacrebleu's JSON output
            record[score] = record[score].get("score")
    if not (record.get("run") or record.get("arch")):
        raise SystemExit(f"--eval {path}: {where} names neither 'arch' nor 'run'")
    record["run"] = record.get("run") or record["arch"]
    return record


def _from_evaluate_recipe(result: dict) -> dict:
    """Scores of evaluate_recipe.py's results.json: its one average (WMT years, OPUS-100), else its one test
    set, else the mean over its test sets; the arch and training facts from the save directory of the
    checkpoint (checkpoints/.../ARCH/checkpoint_best.pt and train_recipe.py's train_summary.json there)."""
    groups = result.get("averages") or result["tests"]
    scores = list(groups.values())
    out = {s: sum(x[s] for x in scores) / len(scores) for s in SCORES if scores and all(s in x for x in scores)}
    checkpoint = Path(result.get("checkpoint", ""))
    summary_file = checkpoint.parent / "train_summary.json"
    if summary_file.is_file():
        summary = {k.lower(): v for k, v in json.loads(summary_file.read_text()).items()}
        out.update({k: summary[k] for k in ("arch", "parameters", "train_seconds", "num_updates", "valid_loss")
                    if k in summary})
    out.setdefault("arch", checkpoint.parent.name or None)
    return out


def preset_layers(arch: str | None) -> tuple[int | None, int | None]:
    if not arch:
        return None, None
    from fairseq_plugins.models.presets import PRESETS

    preset = PRESETS.get(arch)
    return (preset.encoder_layers, preset.decoder_layers) if preset else (None, None)


def combine(logs: list[dict], evals: list[dict]) -> list[dict]:
    """One row per run: the log's measurements and the run's last evaluation record."""
    by_run = {e["run"]: e for e in evals}
    rows = []
    for run in dict.fromkeys([*(log["run"] for log in logs), *by_run]):
        log = next((lg for lg in logs if lg["run"] == run), {})
        ev = by_run.get(run, {})
        arch = log.get("arch") or ev.get("arch")
        enc, dec = preset_layers(arch)
        wps = log.get("train_wps") or log.get("inner_wps") or []
        done = log.get("done_seconds") or []
        best = min((v["loss"] for v in log.get("valid", []) if v["loss"] is not None), default=None)
        rows.append({
            "run": run, "arch": arch,
            "encoder_layers": log.get("encoder_layers") or ev.get("encoder_layers") or enc,
            "decoder_layers": log.get("decoder_layers") or ev.get("decoder_layers") or dec,
            "params": log.get("params") or ev.get("params"),
            "bleu": ev.get("bleu"), "chrf": ev.get("chrf"),
            "train_seconds": (sum(done) if done else log.get("last_wall")) or ev.get("train_seconds"),
            "tokens_per_second": sum(wps) / len(wps) if wps else ev.get("tokens_per_second"),
            "updates": max((v["updates"] for v in log.get("valid", [])), default=None) or ev.get("updates"),
            "best_valid_loss": best if best is not None else ev.get("last_valid_loss"),
        })  # fmt: skip
    return rows


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown_table(rows: list[dict]) -> str:
    header = ("| run | arch | layers (E/D) | parameters | BLEU | chrF | training time | tokens/s | updates | "
              "best valid loss |")
    lines = [header, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        layers = f"{r['encoder_layers']}/{r['decoder_layers']}" if r["encoder_layers"] else ""
        seconds = r["train_seconds"]
        minutes = "" if seconds is None else f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
        lines.append(f"| {r['run']} | `{r['arch']}` | {layers} | {_fmt(r['params'], ',')} | "
                     f"{_fmt(r['bleu'], '.2f')} | {_fmt(r['chrf'], '.2f')} | {minutes} | "
                     f"{_fmt(r['tokens_per_second'], ',.0f')} | {_fmt(r['updates'], '.0f')} | "
                     f"{_fmt(r['best_valid_loss'], '.3f')} |")
    return "\n".join(lines) + "\n"


def plot(logs: list[dict], rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, (ax_u, ax_t, ax_b) = plt.subplots(1, 3, figsize=(15, 4.2))
    for log in logs:
        valid = [v for v in log["valid"] if v["loss"] is not None and v["subset"] == "valid"] or \
                [v for v in log["valid"] if v["loss"] is not None]
        ax_u.plot([v["updates"] for v in valid], [v["loss"] for v in valid], marker=".", label=log["run"])
        ax_t.plot([v["wall"] / 60 for v in valid], [v["loss"] for v in valid], marker=".", label=log["run"])
    ax_u.set(xlabel="updates", ylabel="validation loss (base 2)", title="validation loss against updates")
    ax_t.set(xlabel="wall time (min)", ylabel="validation loss (base 2)", title="... against wall time")
    scored = [r for r in rows if r["bleu"] is not None and r["params"]]
    for r in scored:
        ax_b.scatter(r["params"] / 1e6, r["bleu"])
        ax_b.annotate(r["run"], (r["params"] / 1e6, r["bleu"]), fontsize=7, xytext=(3, 3),
                      textcoords="offset points")
    ax_b.set(xlabel="parameters (M)", ylabel="BLEU", title="BLEU against parameters")
    if logs:
        ax_u.legend(fontsize=7)
    save_figure(fig, path)


def parse_log_option(text: str) -> tuple[str | None, Path]:
    run, sep, path = text.partition("=")
    if not sep:
        run, path = None, text
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"--log: no such file {path!r} (give PATH or RUN=PATH)")
    return run or None, Path(path)


def existing_file(text: str) -> Path:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"--eval: no such file {text!r}")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=parse_log_option, action="append", default=[],
                   help="fairseq-train log, as PATH or RUN=PATH (repeatable)")
    p.add_argument("--eval", type=existing_file, action="append", default=[],
                   help="evaluation JSON (see above; repeatable)")
    p.add_argument("--out", type=Path, default=Path("compare"),
                   help="output prefix: PREFIX.md (table), PREFIX.csv, PREFIX.json and PREFIX.png "
                   "(default ./compare)")
    return p


def main(argv=None) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.log and not args.eval:
        parser.error("give at least one --log or --eval")
    logs = [parse_log(path, run) for run, path in args.log]
    evals = [record for path in args.eval for record in load_evals(path)]
    rows = combine(logs, evals)
    table = markdown_table(rows)
    print(table, end="")
    write_text(with_suffix(args.out, ".md"), table)
    write_csv(with_suffix(args.out, ".csv"), rows)
    write_json(with_suffix(args.out, ".json"), {"runs": rows, "curves": {lg["run"]: lg["valid"] for lg in logs}})
    plot(logs, rows, with_suffix(args.out, ".png"))
    return rows


if __name__ == "__main__":
    main()
