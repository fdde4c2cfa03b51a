"""docs/grid.md (every combination of the axes: works, or the refusal ``check_compatible`` gives, and every
choice's declared capabilities) and the README's residual x depth-aggregation table."""

from fairseq_plugins import axes
from fairseq_plugins.axes import grid

from .markdown import GENERATED, flag, table


def grid_cells() -> tuple[dict[tuple, str], dict[str, int]]:
    """(axis names of a combination -> "works" or its reason number, reason -> number)."""
    reasons: dict[str, int] = {}
    cells = {}
    for combo in grid.combinations():
        message = grid.refusal(combo)
        if message is None:
            cells[tuple(combo.values())] = "works"
        else:
            reason = message.split(": ", 1)[1]
            cells[tuple(combo.values())] = f"no ({reasons.setdefault(reason, len(reasons) + 1)})"
    return cells, reasons


def grid_md() -> str:
    t = axes.tables()
    cells, reasons = grid_cells()
    works = sum(v == "works" for v in cells.values())
    columns = [(tying, norm) for tying in t["tying"] for norm in t["norm"]]
    lines = [
        "# The grid: every combination of the axes",
        "",
        GENERATED,
        "",
        (
            "From the axis tables (`fairseq_plugins/axes/`, `axes/grid.py`); "
            "`tests/test_axes_grid.py` builds, at tiny width with two layers, a pairwise covering subset in CI "
            "(every pair of choices from two axes in a working combination, and every refused pair) and every "
            f"combination with `ALL_FAMILIES=1`. {works} of {len(cells)} combinations work: one training step with a "
            "finite loss, incremental decoding equal to full decoding, a checkpoint round trip and a float16 step. The "
            "others are refused when the model is built, with one error naming both choices and the reason (numbers "
            "below the tables). Axes and their interfaces: [axes.md](axes.md)."
        ),
        "",
    ]
    header = "| depth aggregation | " + " | ".join(f"{tying} / {norm}" for tying, norm in columns) + " |"
    for residual in t["residual"]:
        lines += [f"## --residual {residual}", "", header, "|" + "---|" * (len(columns) + 1)]
        for aggregation in t["depth_aggregation"]:
            row = [cells[(residual, aggregation, tying, norm)] for tying, norm in columns]
            lines.append(f"| {aggregation} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Why not", ""]
    lines += [f"{n}. {reason}" for reason, n in reasons.items()]
    return "\n".join([*lines, "", *capability_lines()]) + "\n"


def supported(reason: str | None) -> str:
    return "yes" if reason is None else f"no: {reason}"


def capability_lines() -> list[str]:
    """One row per declared choice (the axes and ``--value-residual``): what it supports and why not."""
    rows = []
    for axis, choices in axes.declarations().items():
        for choice in choices.values():
            float32 = [item.__name__ if isinstance(item, type) else item for item in choice.float32]
            speed = [f"{s.metric} {s.op} {s.bound}" + (f" at {s.depth}" if s.depth else "") for s in choice.speed]
            rows.append([f"`{flag(axis)} {choice.name}`", supported(choice.prunes), supported(choice.scripts),
                         supported(choice.activation_checkpointing), supported(choice.double_backward),
                         "; ".join(float32) or "-", ", ".join(speed) or "-",
                         f"`{choice.preset}`" if choice.preset else "-", choice.paper or "-",
                         choice.code or "-"])  # fmt: skip
    return [
        "## What each choice supports",
        "",
        ("Declared on each choice (`fairseq_plugins/axes/`, the capabilities of `axes/__init__.py`) and read by the "
         "tests, `precision.py` and the benchmark's targets: layer pruning (`--*-layers-to-keep`), TorchScript, "
         "activation checkpointing and a double backward (yes, or why not: the error's reason), what stays float32 "
         "under autocast (module classes run in float32; computations the choice's modules keep in float32), the "
         "benchmark's bounds on the ratio to Pre-LN (measured on the preset), the paper and the authors' code. "
         "A combination prunes (scripts) when all its choices do."),
        "",
        *table(["choice", "prunes", "scripts", "activation checkpointing", "double backward", "float32",
                "speed target", "preset", "paper", "code"], rows),
    ]  # fmt: skip


def readme_axes_table() -> str:
    """The residual x depth-aggregation grid at ``--tying none --norm layernorm``, residual rows that agree merged."""
    t = axes.tables()
    aggregations = list(t["depth_aggregation"])
    reasons: dict[str, int] = {}
    rows: dict[tuple, list[str]] = {}
    for residual in t["residual"]:
        marks = []
        for aggregation in aggregations:
            message = grid.refusal({"residual": residual, "depth_aggregation": aggregation, "tying": "none",
                                    "norm": "layernorm"})  # fmt: skip
            marks.append("✓" if message is None else str(reasons.setdefault(message.split(": ", 1)[1],
                                                                             len(reasons) + 1)))  # fmt: skip
        rows.setdefault(tuple(marks), []).append(residual)
    cells, _ = grid_cells()
    works = sum(v == "works" for v in cells.values())
    pairs = {(r, a) for (r, a, _, _), v in cells.items() if v == "works"}
    lines = [
        (f"Which residual and aggregation choices compose (with `--tying none --norm layernorm`; "
        f"{len(pairs)} of {len(t['residual']) * len(aggregations)} pairs build with some tying and norm): a "
        "combination is built, trained a step, decoded incrementally, round-tripped and run in float16 by "
        "`tests/test_axes_grid.py`, or refused when the model is built with one error naming both choices:"),
        "",
    ]
    lines += table(["`--residual` \\ `--depth-aggregation`", *aggregations],
                   [[", ".join(names), *marks] for marks, names in rows.items()])  # fmt: skip
    lines += ["", " ".join(f"{n}: {reason}." for reason, n in reasons.items()), "",
              (f"Over all four axes {works:,} of the {len(cells):,} combinations work (CI builds a pairwise covering "
              "set, `ALL_FAMILIES=1` all of them); the whole grid with every reason: [docs/grid.md](docs/grid.md); "
              "the axes' interfaces and how to add an idea: [docs/axes.md](docs/axes.md).")]  # fmt: skip
    return "\n".join(lines) + "\n"
