"""Every combination of axis choices and whether it can be built (the grid of docs/grid.md and its test).

``combinations()`` enumerates the product of the four axis tables; ``refusal(combo)`` is None for a
combination ``residual_axes`` builds, else the one error message the build raises (``check_compatible``,
which names both choices and the reason). Only the axes decide: every choice's own options at their defaults.
"""

import itertools

from . import IncompatibleChoices, Plan, check_compatible, tables

AXES = ("residual", "depth_aggregation", "tying", "norm")


def combinations() -> list[dict[str, str]]:
    t = tables()
    return [dict(zip(AXES, names, strict=True)) for names in itertools.product(*(list(t[a]) for a in AXES))]


def refusal(combo: dict[str, str]) -> str | None:
    t = tables()
    plan = Plan(*(t[axis][combo[axis]] for axis in AXES))
    try:
        check_compatible(plan)
    except IncompatibleChoices as err:
        return str(err)
    return None


def _pairs(combo: dict[str, str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    items = sorted(combo.items())
    return {(a, b) for i, a in enumerate(items) for b in items[i + 1 :]}


def _names(message: str, axis: str, name: str) -> bool:
    label = f"--{axis.replace('_', '-')} {name}"
    return f"{label} " in message or f"{label}:" in message


def covering() -> list[dict[str, str]]:
    """A deterministic subset of ``combinations()`` for CI: every pair of choices from two axes that some working
    combination contains appears in a working combination of the subset (a pairwise covering array, greedy as
    AETG: each step takes the combination covering the most uncovered pairs, the first in product order on a tie),
    plus, for every pair of choices that is refused, one combination refused naming that pair."""
    combos = combinations()
    reasons = [refusal(c) for c in combos]
    working = [(c, _pairs(c)) for c, r in zip(combos, reasons, strict=True) if r is None]
    uncovered = set().union(*(p for _, p in working))
    chosen = []
    while uncovered:
        best, pairs = max(working, key=lambda w: len(w[1] & uncovered))  # max keeps the first on a tie
        chosen.append(best)
        uncovered -= pairs
    refused_pairs = set()
    for combo, reason in zip(combos, reasons, strict=True):
        if reason is None:
            continue
        named = tuple(sorted((a, n) for a, n in combo.items() if _names(reason, a, n)))
        if len(named) == 2 and named not in refused_pairs:
            refused_pairs.add(named)
            chosen.append(combo)
    return chosen
