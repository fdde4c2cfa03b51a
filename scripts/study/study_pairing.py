"""What both study reports (study_report.py, study_lm_report.py) compute before they write: the chosen run of each
setting, the pairs of runs the paired tests compare, the run-level context and the record written to
results.json."""

import itertools
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from scripts.study import study_claims, study_stats
from scripts.study.study_common import (
    as_dict,
    command_line,
    describe_machine,
    portable_command,
)
from scripts.study.study_provenance import provenance
from scripts.study.study_stats import _chosen


def _earlier(out: Path) -> dict:
    """The start and duration of the study that trained the runs, kept when a report is rewritten."""
    try:
        old = json.loads((out / "results.json").read_text(encoding="utf-8"))
        return {"started": old["started"], "total_minutes": old["total_minutes"]}
    except (OSError, ValueError, KeyError):
        return {}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def chosen_results(study, runs: list, args) -> tuple[dict, dict, dict]:
    """Every run's result with its trend, the lr/warm-up choices, and the results at the chosen settings."""
    results = {run: study.result(run) for run in runs}
    for r in results.values():
        r["trend"] = study_stats.trend(r["curves"]["valid"], args.falling_last, args.falling_slope, r.get("stopped"))
    # the diverged runs (no scores) are candidates too: shown as diverged, and bounding the grid's edge
    diverged = {run: study.result(run, evaluated=False) for run in study.diverged_runs}
    choices = study_stats.choose_settings({**results, **diverged}, args.seed_list[0])
    chosen = {run: r for run, r in results.items() if _chosen(run, choices)}
    return results, choices, chosen


def paired_groups(args, chosen: dict, outputs: str) -> dict[tuple, list]:
    """The systems each paired test compares, with their ``outputs`` (a result's key): per variant and seed every
    model against the first, and with several variants each model under each variant against its first."""
    by_seed: dict[tuple, list] = {}
    by_arch: dict[tuple, list] = {}
    for variant in args.variant_list:
        for arch in args.arch_list:
            for run, r in chosen.items():
                if run.group == (arch, variant):
                    by_seed.setdefault((variant, run.seed), []).append((arch, r[outputs]))
                    by_arch.setdefault(("variants", arch, run.seed), []).append((variant, r[outputs]))
    # a seed whose baseline run (or first variant) is missing (a partial report) has nothing to be paired with
    groups = {key: systems for key, systems in by_seed.items() if systems[0][0] == args.arch_list[0]}
    if len(args.variant_list) > 1:  # each model under each variant against itself under the first variant
        groups.update({key: systems for key, systems in by_arch.items() if systems[0][0] == args.variant_list[0]})
    return groups


def pair_comparisons(args, chosen: dict, outputs: str, paired_tests) -> dict | None:
    """PAIRS' comparisons: per pair, variant and seed, SYSTEM against BASELINE, each at its chosen lr/warm-up
    (the runs the report shows), tested by ``paired_tests(groups)``, the score's function that the comparison
    against the first model uses (so the same resamples and statistics). A group is a baseline's outputs
    followed by those of the systems paired with it, as in paired_groups. Returns {"pairs", "comparisons",
    "missing": the (pair, variant, seed) whose system or baseline run has not finished}; None without PAIRS or
    without bootstrap samples (no comparison at all then)."""
    if not args.pair_list or not args.bootstrap:
        return None
    outs = {(run.arch, run.variant, run.seed): r[outputs] for run, r in chosen.items()}
    groups: dict[tuple, list] = {}
    compared, missing = [], []
    grid = itertools.product(args.pair_list, args.variant_list, args.seed_list)
    for (system, baseline), variant, seed in grid:
        pair = {"key": [variant, seed], "system": system, "baseline": baseline}
        absent = [a for a in (system, baseline) if (a, variant, seed) not in outs]
        if absent:
            missing.append({**pair, "unfinished": absent})
            continue
        key = (variant, seed, baseline)
        groups.setdefault(key, [(baseline, outs[(baseline, variant, seed)])])
        groups[key].append((system, outs[(system, variant, seed)]))
        compared.append((pair, (*key, system)))
    tests = paired_tests(groups) if groups else {}
    comparisons = [{**pair, **tests[key]} for pair, key in compared]
    asked = [list(p) for p in args.pair_list]
    return {"pairs": asked, "comparisons": comparisons, "missing": missing}


def add_first_valid_loss(rows: list[dict], chosen: dict) -> None:
    for row in rows:  # the first validation, for the reading's "did not train"
        firsts = [r["first_valid_loss"] for run, r in chosen.items() if run.group == (row["arch"], row["variant"])]
        row["first_valid_loss"] = study_stats.mean_std(firsts)[0]


def comparisons_of(tests: dict) -> list[dict]:
    return [{"key": list(key[:-1]), "system": key[-1], **value} for key, value in tests.items()]


def run_context(args, study, info: dict, started: str, env_vars: tuple, results: dict, missing, comparisons) -> dict:
    """The part of a report's context that does not depend on the task."""
    earlier = _earlier(args.out_dir) if args.report_only else {}
    return {
        "archs": args.arch_list, "command": command_line(env_vars), "machine_text": describe_machine(info),
        "started": earlier.get("started", started), "rewritten": _now() if args.report_only else None,
        "total_minutes": earlier.get("total_minutes", (time.time() - study.start) / 60),
        "budget_text": args.budget.describe(), "jobs": args.jobs, "threads": args.threads,
        "bootstrap": args.bootstrap, "margin": args.level_margin,
        "falling_last": args.falling_last, "falling_slope": args.falling_slope,
        "missing": [run.label for run in missing], "report_only": args.report_only, "comparisons": comparisons,
        "diverged": [{"name": run.name, "updates": study.result(run, evaluated=False)["updates"]}
                     for run in study.diverged_runs],
        "runs": list(results.items()),
        "provenance": provenance(study, results),
    }  # fmt: skip


def lr_text(args) -> str:
    """The peak lr(s) of the set-up line: LRS's grid, and each ARCH_LRS architecture's own setting."""
    own = [f"{arch} {'/'.join(f'{lr:g}' for lr in lrs)}"
           + (f" (warm-up {'/'.join(str(w) for w in warmups)})" if warmups is not None else "")
           for arch, (lrs, warmups) in args.arch_settings.items()]  # fmt: skip
    grid = "/".join(f"{lr:g}" for lr in args.lr_list)
    if not own:
        return grid
    others = f"{grid} (the others), " if len(own) < len(args.arch_list) else ""
    return f"{others}own (ARCH_LRS): {', '.join(own)}"


def results_record(args, study, context: dict, info: dict, settings: dict, data: str, test_set: str, rows: list,
                   choices: dict, results: dict, repo: Path, without: str, task: str | None = None) -> dict:  # fmt: skip
    """results.json: the context's run-level facts, the rows, the choices and every run (``without`` its
    per-sentence outputs)."""
    return {
        "command": context["command"], "machine": info, "started": context["started"],
        **({"task": task} if task else {}),
        # only with PAIRS: a study without them keeps its results.json as it was
        **({"pair_comparisons": context["pairs"]} if context.get("pairs") else {}),
        "total_minutes": round(context["total_minutes"], 1), "budget": as_dict(args.budget),
        "budget_kind": "wall-clock training minutes" if args.budget.minutes else "updates",
        "setup": as_dict(args.setup), "settings": settings, "data": data, "test_set": test_set,
        "models": rows, "reading": context["reading"], "missing": context["missing"], "report_only": args.report_only,
        # only where a run diverged: the other studies' results.json stay as they were
        **({"diverged": context["diverged"]} if context.get("diverged") else {}),
        "choices": [{"arch": a, "variant": v, **c} for (a, v), c in choices.items()],
        "comparisons": context["comparisons"],
        "claims": claims(context),
        "provenance": context["provenance"],
        "runs": [{**as_dict(run), "name": run.name,
                  "command": portable_command(json.loads((study.run_dir(run) / "command.json").read_text())["command"], repo),
                  **{k: v for k, v in r.items() if k != without}} for run, r in results.items()],
    }  # fmt: skip


def claims(context: dict) -> list[dict]:
    """Each system's word against the baseline by the rules of study_claims (ahead, behind, level, seeds
    disagree, not shown): what a reading may cite."""
    variants = list(dict.fromkeys(c["key"][0] for c in context["comparisons"] if c["key"][0] != "variants"))
    record = {"models": [{"arch": a, "variant": v} for v in variants or ["warmup"] for a in context["archs"]],
              "comparisons": context["comparisons"],
              "settings": {"level_margin": context["margin"]}}  # fmt: skip
    return study_claims.claims_of(record)
