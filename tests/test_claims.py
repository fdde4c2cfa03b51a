"""Readings bound to their records (issue 55): the rules of scripts/study/study_claims.py on small records, then
every claim written in the README and under docs/ re-checked against the committed results.json it names.

A sentence of a reading that states a comparison or a number carries a claim comment
(``<!-- claim STUDY: KIND ARGS -->``); when the records do not support it, this test fails and names the file,
the line, the claim and what the records say instead. The README's findings must carry claims (one per bullet
at least): prose there without a claim fails too. So does a study README whose reading, its one
``## What the numbers say`` section, has a paragraph or bullet without a claim."""

import re

import pytest

from scripts.study import study_claims as sc

from .helpers import REPO

STUDY_ROOT = REPO / "docs" / "study"


def _records(*comparisons, lm=False, margin=1.0):
    """Records with one baseline 'pre' and the given comparisons: (system, seed, diff, low, high)."""
    metric = "ppl" if lm else "bleu"
    systems = list(dict.fromkeys(c[0] for c in comparisons))
    return sc.Records({
        "models": [{"arch": "pre"}] + [{"arch": s, metric: 1.0} for s in systems],
        "settings": {"level_margin": margin},
        "comparisons": [{"key": ["warmup", seed], "system": s, f"{metric}_diff": d, f"{metric}_ci": [lo, hi],
                         f"{metric}_p": 0.01} for s, seed, d, lo, hi in comparisons],
        "runs": [{"name": "pre.warmup.lr0.001.wu400.s1", "trend": {"falling": True}, "stopped": "updates",
                  "best_valid_loss": 3.9314}],
    })  # fmt: skip


def _check(records, text):
    (claim,) = sc.find_claims(f"<!-- claim x: {text} -->")
    return sc.check(claim, records)


def test_ahead_and_behind_need_every_seed_on_one_side():
    records = _records(("a", 1, 2.0, 1.0, 3.0), ("a", 2, 0.5, 0.1, 0.9), ("b", 1, 2.0, 1.0, 3.0), ("b", 2, 0.5, -0.1, 1.1))
    assert _check(records, "ahead a") is None
    assert "which is level" in _check(records, "ahead b") or "not-shown" in _check(records, "ahead b")
    assert _check(records, "behind a") is not None
    assert _check(records, "not-shown b 0.5") is None  # its seed 1 interval reaches beyond ±0.5


def test_level_is_about_intervals_inside_the_margin():
    records = _records(("a", 1, 0.1, -0.4, 0.6), ("a", 2, -0.2, -0.9, 0.5))
    assert _check(records, "level a 1") is None and _check(records, "level a 0.5") is not None
    assert sc.classify(records.intervals("a", "bleu"), 1.0) == "level"


def test_seeds_that_disagree_are_named_so():
    records = _records(("a", 1, 1.6, 0.6, 2.6), ("a", 2, -1.0, -1.9, -0.1))
    assert sc.classify(records.intervals("a", "bleu"), 1.0) == "seeds-disagree"
    assert _check(records, "seeds-disagree a") is None and _check(records, "ahead a") is not None


def test_lower_perplexity_is_ahead():
    records = _records(("a", 1, -3.0, -4.0, -2.0), ("a", 2, -2.5, -3.0, -1.0), lm=True)
    assert _check(records, "ahead a") is None and _check(records, "behind a ppl") is not None


def test_ranked_needs_separated_intervals():
    records = _records(("a", 1, 3.0, 2.0, 4.0), ("b", 1, 1.0, 0.0, 1.9), ("c", 1, 1.5, 0.5, 2.5))
    assert _check(records, "ranked a b") is None and _check(records, "ranked a c") is not None


def test_values_match_to_the_digits_written():
    records = _records(("a", 1, 1.234, 0.5, 2.0))
    assert _check(records, "value runs.pre.warmup.lr0.001.wu400.s1.best_valid_loss 3.931") is None
    assert _check(records, "value runs.pre.warmup.lr0.001.wu400.s1.best_valid_loss 3.94") is not None
    assert _check(records, "value diff.a.1.bleu_diff 1.23") is None and _check(records, "value diff.a.1.bleu_diff 1.3") is not None
    assert _check(records, "value count.ahead 1") is None
    assert _check(records, "still-falling pre.warmup.lr0.001.wu400.s1") is None
    assert _check(records, "stopped pre.warmup.lr0.001.wu400.s1 patience") is not None
    # a diverged run has no score (not in runs): results.json's diverged list says how it stopped
    records.results["diverged"] = [{"name": "a.warmup.lr0.016.wu400.s1", "updates": 50}]
    assert _check(records, "stopped a.warmup.lr0.016.wu400.s1 diverged") is None
    assert _check(records, "stopped pre.warmup.lr0.001.wu400.s1 diverged") is not None


def test_values_reach_interval_bounds_and_any_results_file():
    records = _records(("a", 1, 1.234, 0.5, 2.0))
    assert _check(records, "value diff.a.1.bleu_ci.low 0.5") is None and _check(records, "value diff.a.1.bleu_ci.high 2") is None
    assert _check(records, "value diff.a.1.bleu_ci.high 2.1") is not None
    seeds = sc.Records({"models": [{"arch": "m", "detectable": {"5": 1.549}, "ci": [-2.19, 0.24]}]})
    assert _check(seeds, "value at.models.m.detectable.5 1.55") is None and _check(seeds, "value at.models.m.ci.low -2.19") is None
    for text in ("value at.models.nobody.ci.low 1", "value at.models.m.ci 1", "value diff.a.1.bleu_ci.middle 1"):
        with pytest.raises(sc.ClaimError):
            _check(seeds if "at." in text else records, text)


def test_a_path_names_a_row_whose_name_holds_dots_and_an_item_of_a_list():
    """seeds.json lists every scored run by its name, and run names hold dots (lr0.008): the path joins keys; a list
    of numbers (the updates that reached the best loss) is indexed from 0."""
    seeds = sc.Records({"runs": [{"name": "m.warmup.lr0.008.wu400.s4", "bleu": 38.7, "best_valid_updates": [2160]},
                                 {"name": "m.warmup.lr0.008.wu400.s5", "bleu": 37.1}]})  # fmt: skip
    assert _check(seeds, "value at.runs.m.warmup.lr0.008.wu400.s4.bleu 38.70") is None
    assert _check(seeds, "value at.runs.m.warmup.lr0.008.wu400.s4.best_valid_updates.0 2160") is None
    with pytest.raises(sc.ClaimError):
        _check(seeds, "value at.runs.m.warmup.lr0.008.wu400.s4.best_valid_updates.1 2160")
    assert _check(seeds, "value at.runs.m.warmup.lr0.008.wu400.s5.bleu 38.70") is not None
    for text in ("value at.runs.m.warmup.lr0.008.wu400.s6.bleu 1", "value at.runs.m.warmup.bleu 1"):
        with pytest.raises(sc.ClaimError):
            _check(seeds, text)


def test_decisions_are_read_from_a_seeds_file():
    seeds = sc.Records({"baseline": "pre", "models": [
        {"arch": "a", "decision": "ahead", "one_machine_type": {"decision": "undecided (fewer than 3 seeds)"}},
        {"arch": "b", "decision": "undecided (fewer than 3 seeds)", "one_machine_type": None}]})  # fmt: skip
    assert _check(seeds, "decided a ahead") is None and "not level" in _check(seeds, "decided a level")
    assert _check(seeds, "decided a undecided one-machine-type") is None
    assert _check(seeds, "decided b undecided") is None and _check(seeds, "decided b undecided one-machine-type") is None
    assert _check(seeds, "decided b ahead one-machine-type") is not None
    for bad in ("decided a", "decided a better", "decided a ahead some-machines"):
        with pytest.raises(sc.ClaimError):
            _check(seeds, bad)
    with pytest.raises(sc.ClaimError, match="no decision"):
        _check(_records(("a", 1, 2.0, 1.0, 3.0)), "decided a ahead")


def test_malformed_claims_are_errors_not_passes():
    records = _records(("a", 1, 1.0, 0.5, 2.0))
    for text in ("ahaed a", "ahead", "ahead nobody", "value models.a 1", "level a"):
        with pytest.raises(sc.ClaimError):
            _check(records, text)


def _documents():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _all_claims():
    return [c for path in _documents()
            for c in sc.find_claims(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))]  # fmt: skip


def test_every_written_claim_holds_on_its_committed_records():
    claims = _all_claims()
    assert len(claims) >= 20, "the README's findings cite their claims"
    failures, cache = [], {}
    for claim in claims:
        try:
            if claim.study not in cache:  # not setdefault: its argument would read the study's records every time
                cache[claim.study] = sc.Records.load(STUDY_ROOT, claim.study)
            records = cache[claim.study]
            why = sc.check(claim, records)
        except sc.ClaimError as err:
            why = f"malformed: {err}"
        if why:
            failures.append(f"{claim.where}: <!-- {claim.text} --> does not hold: {why}")
    assert not failures, "\n".join(failures)


def test_the_readmes_findings_carry_claims():
    """Every bullet of the README's findings cites at least one claim, so none is prose alone."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Findings in brief", 1)[1].split("\n## ", 1)[0]
    bullets = [b for b in re.split(r"\n- ", section)[1:]]
    assert bullets
    bare = [b.split("\n", 1)[0] for b in bullets if not sc.find_claims(b)]
    assert not bare, f"findings without a claim: {bare}"


def test_the_study_index_cites_a_claim_for_every_study():
    """Every row of docs/study/README.md's table (one study each) states its status with cited claims."""
    rows = [line for line in (STUDY_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and "/README.md) |" in line]  # fmt: skip
    assert len(rows) >= 13
    bare = [row.split(" | ")[1] for row in rows if not sc.find_claims(row)]
    assert not bare, f"study rows without a claim: {bare}"


READING = re.compile(r"^## What the numbers say( \(.+\))?$")
STUDY_READMES = sorted(STUDY_ROOT.glob("*/README.md"))


def _reading_units(text: str) -> list[str]:
    """The prose units of a study README's reading: every paragraph (consecutive non-blank lines) and every bullet
    under ``## What the numbers say`` up to the next ``## `` heading. Tables and fenced code blocks are not prose
    and are left out; a paragraph that holds only claim comments is not prose either (it needs no claim), and it
    lends none to its neighbours: each paragraph carries its own."""
    lines = text.split("## What the numbers say", 1)[1].split("\n")[1:]
    units, current, fenced = [], [], False
    for line in lines:
        if line.startswith("## "):
            break
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("|"):
            continue
        if not line.strip():
            current = []
            continue
        if re.match(r"\s*([-*+]|\d+[.)])\s", line) or not current:
            current = [line]
            units.append(current)
        else:
            current.append(line)
    texts = ["\n".join(unit) for unit in units]
    return [u for u in texts if sc.CLAIM.sub("", u).strip()]


@pytest.mark.parametrize("readme", STUDY_READMES, ids=[p.parent.name for p in STUDY_READMES])
def test_every_study_reading_is_bound_to_claims(readme):
    """A study README has one reading, ``## What the numbers say`` (a parenthesis may follow), and every paragraph
    and bullet of it carries at least one claim comment: a sentence with no claim cannot be re-checked."""
    text = readme.read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## What the numbers say")]
    assert len(headings) == 1 and READING.match(headings[0]), f"one '## What the numbers say' heading, not {headings}"
    bare = [u.strip().split("\n", 1)[0][:100] for u in _reading_units(text) if not sc.find_claims(u)]
    assert not bare, f"reading paragraphs or bullets without a claim: {bare}"


def test_a_reading_paragraph_without_a_claim_is_found():
    text = ("# t\n\n## What the numbers say (x)\n\nBound. <!-- claim s: ahead a -->\n\n- bullet one\n  goes on\n"
            "- bullet two <!-- claim s: behind b -->\n\n<!-- claim s: level c 1 -->\n\n| table | 1 |\n\n```\ncode\n```\n"
            "\n## Next\n\nUnbound after the reading.\n")  # fmt: skip
    bare = [u for u in _reading_units(text) if not sc.find_claims(u)]
    assert bare == ["- bullet one\n  goes on"]
