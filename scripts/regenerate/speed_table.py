"""docs/speed.md's table of every family's CPU-time ratios, rendered from the benchmark's merged report
(docs/benchmark_all.json), so that each ratio lives in that one results file."""

import json

from .markdown import REPO, table

REPORT = "docs/benchmark_all.json"
DEPTHS = ("e6d6", "e12d12", "e18d18", "e36d6")
MEMORY_AT = "e18d18"


def _cpu(row: dict | None, key: str) -> str:
    return f"{row[key]['cpu']:.2f}" if row and row.get(key) else "-"


def speed_table() -> str:
    """One row per family (in the report's order): the median CPU-time ratio to Pre-LN of training and of
    decoding at each depth, and the peak-memory ratio of a training step at E18D18; '-' where not measured."""
    report = json.loads((REPO / REPORT).read_text(encoding="utf-8"))
    cells: dict[str, dict[str, dict]] = {}
    for result in report["results"]:
        for name, row in result["families"].items():
            cells.setdefault(name, {})[result["depth"]] = row
    rows = []
    for name, by_depth in cells.items():
        at = [by_depth.get(d) for d in DEPTHS]
        memory = by_depth.get(MEMORY_AT, {}).get("memory_ratio")
        rows.append([f"`{name}`", " / ".join(_cpu(r, "train_ratio") for r in at),
                     " / ".join(_cpu(r, "decode_ratio") for r in at), f"{memory:.2f}" if memory else "-"])  # fmt: skip
    depths = " / ".join(d.upper() for d in DEPTHS)
    header = ["family", f"train {depths}", f"decode {depths}", f"peak memory {MEMORY_AT.upper()}"]
    name = REPORT.split("/")[-1]
    intro = (f"CPU-time ratios to Pre-LN from [{name}]({name}) (median of its rounds; >1 is faster), and the peak "
             f"memory of a training step at {MEMORY_AT.upper()}:")
    lines = [intro, "", *table(header, rows)]
    lines[3] = "|---|---|---|---:|"  # the memory column right-aligned
    return "\n".join(lines) + "\n"
