"""The vocabulary of a reading: claims with exact rules, checked against a study's committed results.json.

Prose about a study (the study READMEs, the study index, the README's findings) states its results only as claims
that a test can re-check. A claim is written as an HTML comment after the sentence it supports, so it does not
show when the Markdown is rendered and sits next to the words it binds:

    2-DCA is not shown ahead of Pre-LN. <!-- claim converged_e12d12: not-shown dca_k2_iwslt_e12d12 -->

``STUDY`` is a folder of docs/study (``lm_width_d12/w256``) or a results file in one
(``lr_e12d12/results_leaders.json``). tests/test_claims.py finds every claim under docs/ and in README.md and
fails, naming the file and line, on each that its records do not support.

The kinds (``SYSTEM`` is an architecture of the study, ``ARCH@VARIANT`` for another variant than the first,
``ARCH@VARIANT:self`` for a variant against the architecture's first variant, ``ARCH/OTHER`` for a PAIRS
comparison; comparisons are against the study's baseline, its first architecture, per seed, with the 95% interval of the paired-bootstrap difference SYSTEM - baseline; ``METRIC``
defaults to bleu for translation and ppl for language models, where lower is better):

- ``ahead SYSTEM [METRIC]``: every seed's interval excludes 0 on the better side.
- ``behind SYSTEM [METRIC]``: every seed's interval excludes 0 on the worse side.
- ``level SYSTEM MARGIN [METRIC]``: every seed's interval lies inside [-MARGIN, +MARGIN].
- ``not-shown SYSTEM [MARGIN] [METRIC]``: neither ahead, nor behind, nor level at MARGIN (the study's
  LEVEL_MARGIN if omitted).
- ``seeds-disagree SYSTEM [METRIC]``: the seeds' differences have opposite signs.
- ``ranked A B [METRIC]``: A is better than B: in every seed both have, A's interval against the baseline lies
  wholly on the better side of B's (the intervals separate).
- ``unranked A B [METRIC]``: neither A ranked above B nor B above A.
- ``still-falling RUN`` / ``not-falling RUN``: the report's trend rule for one run (``RUN`` is its name).
- ``stopped RUN HOW``: the run ended by ``patience``, ``updates``, ``time`` or ``diverged`` (a NaN/Inf loss: the
  run has no score and is listed in results.json's ``diverged``).
- ``decided SYSTEM WORD [one-machine-type]``: in a seeds file (scripts/study/study_seeds.py, seeds.json), the
  decision over all seeds, or over the seeds whose two runs trained on one machine type, is WORD: ahead, behind,
  level or undecided (any undecided, including "fewer than 3 seeds").
- ``value PATH NUMBER``: a number of the records, rounded to NUMBER's decimals, equals NUMBER. ``PATH`` is
  ``models.SYSTEM.KEY`` (the model row at its chosen setting: bleu, chrf, valid_loss, ppl, ...),
  ``runs.RUN.KEY`` (best_valid_loss, bleu, updates, ...), ``diff.SYSTEM.SEED.KEY`` (the comparison SYSTEM names, in
  seed SEED: bleu_diff, bleu_p, ppl_diff, ...; ``bleu_ci.low`` and ``bleu_ci.high`` the bounds of its interval),
  ``count.KIND.METRIC`` (how many systems satisfy a kind) or ``at.KEY.KEY...`` (any number of a results file
  such as seeds.json, by its keys; in a list of rows, the row whose ``arch`` or ``name`` is the key, dots and all;
  in a list of numbers, the item counted from 0).
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

CLAIM = re.compile(r"<!--\s*claim\s+([^:>]+?):\s*(.*?)\s*-->", re.DOTALL)
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "ppl": False, "ll": True}
KINDS = ("ahead", "behind", "level", "not-shown", "seeds-disagree", "ranked", "unranked", "still-falling",
         "not-falling", "stopped", "decided", "value")  # fmt: skip
DECISIONS = ("ahead", "behind", "level", "undecided")  # study_seeds.decide's words


class ClaimError(ValueError):
    """A claim that is malformed or names something its records do not have."""


@dataclass(frozen=True)
class Claim:
    study: str
    kind: str
    args: tuple[str, ...]
    where: str = ""  # file:line, for the test's message

    @property
    def text(self) -> str:
        return f"claim {self.study}: {self.kind} {' '.join(self.args)}".strip()


def find_claims(text: str, where: str = "") -> list[Claim]:
    """Every claim comment of a Markdown text, with its line number."""
    out = []
    for match in CLAIM.finditer(text):
        if match.start() > 0 and text[match.start() - 1] == "`":
            continue  # the syntax shown in a code span, not a claim
        line = text.count("\n", 0, match.start()) + 1
        kind, *args = match.group(2).split()
        out.append(Claim(match.group(1).strip(), kind, tuple(args), f"{where}:{line}"))
    return out


class Records:
    """One study's results.json, read for the claims."""

    def __init__(self, results: dict):
        self.results = results
        self.lm = "ppl" in json.dumps(results.get("comparisons", [])[:1])
        self.baseline = results["models"][0]["arch"] if results.get("models") else None
        self.margin = results.get("settings", {}).get("level_margin", 1.0)

    @classmethod
    def load(cls, study_root: Path, study: str) -> "Records":
        path = study_root / study
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise ClaimError(f"no records at docs/study/{study} (a study folder with results.json, or a results file)")
        return cls(json.loads(path.read_text(encoding="utf-8")))

    def metric(self, given: str | None) -> str:
        metric = given or ("ppl" if self.lm else "bleu")
        if metric not in HIGHER_IS_BETTER:
            raise ClaimError(f"unknown metric {metric!r} (one of {', '.join(HIGHER_IS_BETTER)})")
        return metric

    def _comparisons(self, system: str) -> tuple[list[dict], str]:
        """The comparisons SYSTEM names: ``ARCH`` (against the baseline, first variant), ``ARCH@VARIANT`` (against
        the baseline of that variant), ``ARCH@VARIANT:self`` (that variant against ARCH's first variant) or
        ``ARCH/OTHER`` (a PAIRS comparison of ARCH against OTHER); and what it is compared with."""
        variants = list(dict.fromkeys(m.get("variant", "warmup") for m in self.results.get("models", [])))
        if "/" in system:
            arch, other = system.split("/", 1)
            found = [c for c in (self.results.get("pair_comparisons") or {}).get("comparisons", [])
                     if c["system"] == arch and c["baseline"] == other]  # fmt: skip
            return found, other
        arch, _, variant = system.partition("@")
        if variant.endswith(":self"):
            variant = variant[: -len(":self")]
            found = [c for c in self.results.get("comparisons", [])
                     if c["key"][0] == "variants" and c["key"][1] == arch and c["system"] == variant]  # fmt: skip
            return found, f"{arch}@{variants[0] if variants else '?'}"
        variant = variant or (variants[0] if variants else "warmup")
        found = [c for c in self.results.get("comparisons", []) if c["system"] == arch and c["key"][0] == variant]
        return found, self.baseline

    def intervals(self, system: str, metric: str) -> dict[int, tuple[float, float, float]]:
        """seed -> (difference, low, high) of SYSTEM against what it is compared with, oriented so that > 0 is
        better."""
        sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
        out = {}
        found, against = self._comparisons(system)
        for c in found:
            low, high = c[f"{metric}_ci"]
            diff = c[f"{metric}_diff"]
            bounds = sorted((sign * low, sign * high))
            out[int(c["key"][-1])] = (sign * diff, bounds[0], bounds[1])
        if not out:
            raise ClaimError(f"{system} has no comparison with {against} in these records")
        return out

    def run(self, name: str) -> dict:
        for r in self.results.get("runs", []):
            if r["name"] == name:
                return r
        raise ClaimError(f"no run {name} in these records")

    def model(self, system: str) -> dict:
        """The model row of ``ARCH`` (its first variant) or ``ARCH@VARIANT``."""
        arch, _, variant = system.partition("@")
        for m in self.results.get("models", []):
            if m["arch"] == arch and (not variant or m.get("variant") == variant):
                return m
        raise ClaimError(f"no model {system} in these records")


def classify(intervals: dict[int, tuple[float, float, float]], margin: float) -> str:
    """The one word the rules give a system against its baseline (better-oriented intervals per seed)."""
    values = list(intervals.values())
    if all(low > 0 for _, low, _ in values):
        return "ahead"
    if all(high < 0 for _, _, high in values):
        return "behind"
    if all(-margin <= low and high <= margin for _, low, high in values):
        return "level"
    if any(d > 0 for d, _, _ in values) and any(d < 0 for d, _, _ in values):
        return "seeds-disagree"
    return "not-shown"


def _split_metric(args: tuple[str, ...], n: int) -> tuple[tuple[str, ...], str | None]:
    if len(args) == n + 1 and args[-1] in HIGHER_IS_BETTER:
        return args[:n], args[-1]
    if len(args) != n:
        raise ClaimError(f"expected {n} argument(s) and an optional metric, got {' '.join(args) or 'none'}")
    return args, None


def _value(records: Records, path: str) -> float:
    parts = path.split(".")
    head = parts[0]
    try:
        if head == "models" and len(parts) >= 3:
            return records.model(parts[1])[".".join(parts[2:])]
        if head == "runs" and len(parts) >= 3:
            # run names hold dots (lr0.008): the key is the last part
            return records.run(".".join(parts[1:-1]))[parts[-1]]
        if head == "diff" and len(parts) in (4, 5):
            found, against = records._comparisons(parts[1])
            for c in found:
                if str(c["key"][-1]) == parts[2]:
                    return _walk(c[parts[3]], parts[4:], path)
            raise ClaimError(f"no comparison of {parts[1]} with {against} in seed {parts[2]}")
        if head == "at" and len(parts) >= 2:
            return _walk(records.results, parts[1:], path)
        if head == "count" and len(parts) in (2, 3):
            metric = records.metric(parts[2] if len(parts) == 3 else None)
            systems = [m["arch"] for m in records.results["models"][1:]]
            return sum(classify(records.intervals(s, metric), records.margin) == parts[1] for s in systems)
    except KeyError as err:
        raise ClaimError(f"the records have no {err} for {path}") from None
    raise ClaimError(f"unknown path {path!r} (models.ARCH.KEY, runs.RUN.KEY, diff.ARCH.SEED.KEY[.low|.high], "
                     "count.KIND[.METRIC], at.KEY...)")


def _walk(value, keys: list[str], path: str):
    """``value`` followed down ``keys``: a dict's key; in an interval ``[low, high]``, ``low`` or ``high``; in a list
    of rows, the row whose ``arch`` (or ``name``) is the key, or the longest run of keys joined by dots, since run
    names hold dots (``at.runs.ARCH.warmup.lr0.008.wu400.s4.bleu`` in seeds.json); in a list of numbers, the item
    the key counts from 0 (``best_valid_updates.0``)."""
    i = 0
    while i < len(keys):
        key = keys[i]
        i += 1
        if isinstance(value, dict):
            value = value[key]
        elif isinstance(value, list) and len(value) == 2 and key in ("low", "high"):
            value = value[0 if key == "low" else 1]
        elif isinstance(value, list) and key.isdigit() and not any(isinstance(v, dict) for v in value):
            if int(key) >= len(value):
                raise ClaimError(f"{path}: the list has {len(value)} item(s), no item {key}")
            value = value[int(key)]
        elif isinstance(value, list):
            for end in range(len(keys), i - 1, -1):
                name = ".".join(keys[i - 1 : end])
                rows = [row for row in value if isinstance(row, dict) and name in (row.get("arch"), row.get("name"))]
                if len(rows) == 1:
                    value, i = rows[0], end
                    break
            else:
                raise ClaimError(f"no single row {key!r} on the path {path}")
        else:
            raise ClaimError(f"{path} goes past a number at {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClaimError(f"{path} is not a number in the records")
    return value


def check(claim: Claim, records: Records) -> str | None:
    """None when the records support the claim, else why not (one line)."""
    kind, args = claim.kind, claim.args
    if kind in ("ahead", "behind", "seeds-disagree"):
        (system,), metric = _split_metric(args, 1)
        metric = records.metric(metric)
        intervals = records.intervals(system, metric)
        word = classify(intervals, records.margin)
        diffs = [d for d, _, _ in intervals.values()]
        ok = {"ahead": all(lo > 0 for _, lo, _ in intervals.values()),
              "behind": all(hi < 0 for _, _, hi in intervals.values()),
              "seeds-disagree": any(d > 0 for d in diffs) and any(d < 0 for d in diffs)}[kind]  # fmt: skip
        return None if ok else f"{system} vs {records._comparisons(system)[1]} in {metric}: {_describe(intervals)}, which is {word}"
    if kind in ("level", "not-shown"):
        n = 2 if kind == "level" else (2 if len(args) >= 2 and _is_number(args[1]) else 1)
        (system, *rest), metric = _split_metric(args, n)
        margin = float(rest[0]) if rest else records.margin
        metric = records.metric(metric)
        intervals = records.intervals(system, metric)
        word = classify(intervals, margin)
        if kind == "level":
            ok = all(-margin <= lo and hi <= margin for _, lo, hi in intervals.values())
        else:
            ok = word in ("not-shown", "seeds-disagree")
        against = records._comparisons(system)[1]
        return None if ok else f"{system} vs {against} in {metric} (margin {margin:g}): {_describe(intervals)}, which is {word}"
    if kind in ("ranked", "unranked"):
        (first, second), metric = _split_metric(args, 2)
        metric = records.metric(metric)
        a, b = records.intervals(first, metric), records.intervals(second, metric)
        seeds = sorted(set(a) & set(b))
        if not seeds:
            return f"{first} and {second} share no seed"
        if kind == "ranked":
            bad = [s for s in seeds if not a[s][1] > b[s][2]]
            return None if not bad else f"{first}'s interval does not lie above {second}'s in seed(s) {bad}"
        for x, y, name in ((a, b, first), (b, a, second)):
            if all(x[s][1] > y[s][2] for s in seeds):
                return f"{name}'s interval lies above the other's in every seed: they are ranked"
        return None
    if kind in ("still-falling", "not-falling"):
        (name,), _ = _split_metric(args, 1)
        falling = bool((records.run(name).get("trend") or {}).get("falling"))
        return None if falling == (kind == "still-falling") else f"{name}: still falling is {falling}"
    if kind == "stopped":
        (name, how), _ = _split_metric(args, 2)
        diverged = {d["name"] for d in records.results.get("diverged", [])}
        stopped = "diverged" if name in diverged else records.run(name).get("stopped")
        return None if stopped == how else f"{name} stopped by {stopped}, not {how}"
    if kind == "decided":
        if len(args) not in (2, 3) or args[1] not in DECISIONS or args[2:] not in ((), ("one-machine-type",)):
            raise ClaimError(f"decided needs SYSTEM WORD [one-machine-type], WORD one of {', '.join(DECISIONS)}")
        row = records.model(args[0])
        if "decision" not in row:
            raise ClaimError(f"{args[0]} has no decision in these records (decided reads a seeds.json)")
        if args[2:]:
            row = row.get("one_machine_type") or {"decision": "undecided (no seed on one machine type)"}
        actual = row["decision"]
        return None if actual.split(" ")[0] == args[1] else f"{args[0]}: the decision is {actual}, not {args[1]}"
    if kind == "value":
        if len(args) != 2 or not _is_number(args[1]):
            raise ClaimError("value needs PATH NUMBER")
        actual = _value(records, args[0])
        if actual is None:
            return f"{args[0]} is not recorded"
        decimals = len(args[1].split(".")[1]) if "." in args[1] else 0
        want = float(args[1])
        # half-way cases round either way in the prose (38.975 -> 38.97 or 38.98): both are the record's value
        ok = abs(float(actual) - want) <= 0.5 * 10**-decimals + 1e-9
        return None if ok else f"{args[0]} is {actual}, not {args[1]}"
    raise ClaimError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _describe(intervals: dict[int, tuple[float, float, float]]) -> str:
    return "; ".join(f"seed {s} {d:+.2f} [{lo:+.2f}, {hi:+.2f}]" for s, (d, lo, hi) in sorted(intervals.items()))


def claims_of(results: dict) -> list[dict]:
    """The report's claims section: each system's word against the baseline (every metric the records have),
    so that a reading can cite them; the words come from ``classify``, the same rule the test checks."""
    records = Records(results)
    out = []
    metrics = ("ppl",) if records.lm else ("bleu", "chrf")
    models = results.get("models", [])
    first_variant = models[0].get("variant", "warmup") if models else None
    for model in models:
        if model["arch"] == records.baseline:
            continue
        variant = model.get("variant", first_variant)
        system = model["arch"] if variant == first_variant else f"{model['arch']}@{variant}"
        for metric in metrics:
            try:
                intervals = records.intervals(system, metric)
            except ClaimError:
                continue
            out.append({"system": system, "baseline": records.baseline, "metric": metric,
                        "claim": classify(intervals, records.margin), "margin": records.margin,
                        "seeds": sorted(intervals)})  # fmt: skip
    return out
