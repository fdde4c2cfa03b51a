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
