"""Which working combinations of the axes grid (fairseq_plugins/axes/grid.py) a test that trains or exports real
models runs: all of them with ALL_FAMILIES=1, else a small deterministic sample in which every choice of every
axis appears at least once, beside what the test already covers (e.g. CI's trained families, whose own choices
need no second run). Greedy set cover in the grid's enumeration order, so the sample only changes when the axes
do (a new choice adds at most one combination)."""

import functools
import os

from fairseq_plugins.axes.grid import AXES, combinations, refusal


@functools.cache
def _working() -> tuple[dict[str, str], ...]:
    # every test module that samples the grid asks for it at collection (5,100 refusal checks a time): once a process
    return tuple(c for c in combinations() if refusal(c) is None)


def working() -> list[dict[str, str]]:
    return [dict(c) for c in _working()]


def choices_of(combo: dict[str, str]) -> set[tuple[str, str]]:
    return {(axis, combo[axis]) for axis in AXES}


def covering_sample(covered: set[tuple[str, str]] = frozenset()) -> list[dict[str, str]]:
    """Working combinations that together hold every choice some working combination holds, not in ``covered``:
    each step takes the first combination with the most choices still missing."""
    return [dict(c) for c in _covering_sample(frozenset(covered))]


@functools.cache  # several test modules ask for the same sample at collection
def _covering_sample(covered: frozenset[tuple[str, str]]) -> tuple[dict[str, str], ...]:
    grid = working()
    missing = set().union(*map(choices_of, grid)) - covered
    sample = []
    while missing:
        best = max(grid, key=lambda c: len(choices_of(c) & missing))  # max keeps the first of equals
        sample.append(best)
        missing -= choices_of(best)
    return tuple(sample)


def grid_sample(covered: set[tuple[str, str]] = frozenset(), limit: int | None = None) -> list[dict[str, str]]:
    """The whole working grid with ALL_FAMILIES=1; else the covering sample, cut to its first ``limit``
    combinations (those that add the most choices) where a test costs a subprocess run per combination."""
    if os.environ.get("ALL_FAMILIES") == "1":
        return working()
    return covering_sample(covered)[:limit]


def family_choices(archs) -> set[tuple[str, str]]:
    """The axis choices the presets ``archs`` build (their family's row of models/families.py)."""
    return set().union(*map(_arch_choices, archs))


@functools.cache  # test_distributed and test_resume parse the same presets at collection
def _arch_choices(arch: str) -> frozenset[tuple[str, str]]:
    from .helpers import parse_model_args

    return frozenset(choices_of(vars(parse_model_args(arch))))


@functools.cache
def options_beside_the_axes(arch: str) -> dict[str, tuple] | None:
    """The model options preset ``arch`` sets otherwise than ``residual_axes`` with the same axis choices and depth
    ({option: (the preset's value, residual_axes's)}: value_residual's ``--value-residual``, hybridnorm_star's
    ``--hybrid-first-layer``, crossformer_sg's soft guidance; {} for a preset that sets only axis choices, whatever
    its model), None for a model without the axes (fairseq's transformer)."""
    from .helpers import parse_model_args

    preset = vars(parse_model_args(arch))
    if not all(axis in preset for axis in AXES):
        return None
    depth = ["--encoder-layers", str(preset["encoder_layers"]), "--decoder-layers", str(preset["decoder_layers"])]
    axes = vars(parse_model_args("residual_axes", depth + axis_flags({axis: preset[axis] for axis in AXES})))
    differ = (preset.keys() | axes.keys()) - {"arch", "_name"}
    return {k: (preset.get(k), axes.get(k)) for k in sorted(differ) if preset.get(k) != axes.get(k)}


def axis_flags(combo: dict[str, str]) -> list[str]:
    """``--residual R --depth-aggregation A --tying T --norm N`` for ``--arch residual_axes``."""
    return [f for axis, name in combo.items() for f in ("--" + axis.replace("_", "-"), name)]


def combo_id(combo: dict[str, str]) -> str:
    return "/".join(combo.values())


def one_choice_each() -> list[dict[str, str]]:
    """Every choice alone, the other axes at ``residual_axes``'s defaults, where that combination works: what
    each choice does by itself."""
    from fairseq_plugins.axes import tables

    from .helpers import parse_model_args

    args = parse_model_args("residual_axes")
    defaults = {axis: getattr(args, axis) for axis in AXES}
    grid = working()
    star = [{**defaults, axis: name} for axis, table in tables().items() for name in table]
    return [c for i, c in enumerate(star) if c in grid and c not in star[:i]]


def choice_sample() -> list[dict[str, str]]:
    """``one_choice_each`` and then ``covering_sample``'s combinations of several choices (the whole grid with
    ALL_FAMILIES=1): for tests that state per choice what happens and check that combinations follow."""
    if os.environ.get("ALL_FAMILIES") == "1":
        return working()
    star = one_choice_each()
    return star + [c for c in covering_sample() if c not in star]


def family_settings(family: str) -> set[tuple[str, str]]:
    """What a preset family sets: its legacy model's axis defaults and its rows' settings (models/families.py)."""
    from fairseq_plugins.models import PRESETS
    from fairseq_plugins.models.families import FAMILIES

    preset = next(p for p in PRESETS.values() if p.family == family)
    return {(k, str(v)) for k, v in {**FAMILIES.get(preset.model, {}), **preset.settings}.items()}


def choice_families(families) -> list[str]:
    """``families`` (preset family names, in their order) but those whose every setting the ones kept before them
    hold, taking the fewest settings first: a combination of choices each measured alone (families.COMBINATIONS,
    e.g. tfixup_kq = tfixup's wiring + crossformer_hg's key-query tying) runs no module of its own. Every family
    with ALL_FAMILIES=1."""
    families = list(families)
    if os.environ.get("ALL_FAMILIES") == "1":
        return families
    held, kept = set(), set()
    for family in sorted(families, key=lambda f: len(family_settings(f))):  # sorted is stable: table order next
        if not family_settings(family) <= held:
            kept.add(family)
            held |= family_settings(family)
    return [f for f in families if f in kept]
