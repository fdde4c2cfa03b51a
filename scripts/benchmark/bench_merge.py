#!/usr/bin/env python
"""One report from several benchmark runs (JSON of ``benchmark.py --json``), as if they were the groups of one run.

    python -m scripts.benchmark.bench_merge a.json b.json ... --json docs/x.json --markdown docs/x.md

Runs made side by side (one per core) or one after another each measure their own baseline, as the groups of one
run do (``--group-size``); merged, every family keeps the ratio to the baseline of its own run, the targets are
checked again over all of them, and the report names every run's command. The runs must share the settings that
make their rows comparable (width, batches, decoding, threads, rounds, device, precisions); anything else is an
error naming the setting.
"""

import argparse
import json
import sys
from pathlib import Path

from scripts.benchmark.bench_report import commits_of, publish, target_records

# settings that may differ between merged runs: the ones that only say how a run was split or reported
FREE_SETTINGS = {"group_size", "profile", "profile_repeats", "memory"}


class MergeError(Exception):
    """Reports that cannot be merged: one line naming the file and the setting."""


def merge(reports: list[dict], names: list[str]) -> dict:
    try:
        return _merge(reports, names)
    except (KeyError, TypeError, AttributeError) as err:  # a hand-edited or foreign JSON: say so, no traceback
        raise MergeError(f"one of {', '.join(names)} is not a complete benchmark.py report "
                         f"({type(err).__name__}: {err})") from err


def _merge(reports: list[dict], names: list[str]) -> dict:
    first = reports[0]
    for report, name in zip(reports, names, strict=True):
        if report["settings"].get("task") == "lm":
            raise MergeError(f"{name}: a --task lm report; merging is for translation reports")
        for key in sorted(set(first["settings"]) | set(report["settings"])):
            if key not in FREE_SETTINGS and first["settings"].get(key) != report["settings"].get(key):
                raise MergeError(f"{name}: setting {key} is {report['settings'].get(key)!r}, "
                                 f"{names[0]} has {first['settings'].get(key)!r}; only runs with the same settings merge")
    depths = list(dict.fromkeys(res["depth"] for report in reports for res in report["results"]))
    results = []
    for depth in depths:
        same = [res for report in reports for res in report["results"] if res["depth"] == depth]
        for number, res in enumerate(same, 1):
            results.append({**res, "group": number} if len(same) > 1 else res)
    seen = [family for res in results for family in res["families"]]
    twice = sorted({f for f in seen if seen.count(f) > len(depths)})
    if twice:
        raise MergeError(f"{', '.join(twice)}: measured in more than one of the runs; give each family once")
    peaks = [r["machine"]["matmul_peak_gflops"] for r in reports if r["machine"].get("matmul_peak_gflops")]
    loads = [r["machine"].get("load_average") for r in reports]
    commits = list(dict.fromkeys(c for r in reports for c in commits_of(r["machine"])))
    merged = {
        **first,
        "machine": {**first["machine"], "matmul_peak_gflops": max(peaks) if peaks else None,
                    "load_average": max(loads, key=lambda lo: (lo or [0])[0]), "commit": None,
                    "commits": commits},  # each run's code, in the runs' order
        "results": results,
        "not_benchmarked": {k: v for r in reports for k, v in r.get("not_benchmarked", {}).items()},
        "seconds": sum(r.get("seconds", 0) for r in reports),
        # markdown() puts OMP_NUM_THREADS=N before the command; every run's command gets it
        "command": f"; OMP_NUM_THREADS={first['settings']['threads']} ".join(r["command"] for r in reports
                                                                             if r.get("command")),
    }
    merged["targets"] = target_records(results)
    return merged


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", type=Path, help="JSON reports of benchmark.py --json (translation)")
    p.add_argument("--json", type=Path, help="write the merged report as JSON here")
    p.add_argument("--markdown", type=Path, help="write the merged Markdown report here (it is printed anyway)")
    opts = p.parse_args(argv)
    try:
        reports = []
        for path in opts.reports:
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError) as err:
                raise MergeError(f"{path}: not a readable JSON report ({err})") from err
            if not isinstance(reports[-1], dict) or not {"settings", "results", "machine"} <= set(reports[-1]):
                raise MergeError(f"{path}: not a benchmark.py --json report (no settings/results/machine)")
        merged = merge(reports, [str(path) for path in opts.reports])
    except MergeError as err:
        p.error(str(err))
    publish(merged, opts.markdown, opts.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
