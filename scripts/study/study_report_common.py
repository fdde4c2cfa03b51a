"""What the translation report (study_report.py) and the language-model report (study_lm_report.py) share: the
pairing of runs for the tests, the run-level context and record, and the sections of results.md whose wording
does not depend on the score (the score-specific tables and sentences stay in each report)."""

import itertools
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from scripts.study import study_claims, study_stats
from scripts.study.study_common import (
    as_dict,
    command_line,
    describe_machine,
    portable_command,
)
from scripts.study.study_stats import _chosen, _fmt


def _earlier(out: Path) -> dict:
    """The start and duration of the study that trained the runs, kept when a report is rewritten."""
    try:
        old = json.loads((out / "results.json").read_text(encoding="utf-8"))
        return {"started": old["started"], "total_minutes": old["total_minutes"]}
    except (OSError, ValueError, KeyError):
        return {}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _trend_text(context: dict) -> str:
    return (f"valid-loss slope over the last {context['falling_last']} validations below "
            f"-{context['falling_slope']:g} per 100 updates")


def stopping_text(runs: list[dict]) -> str:
    """How many runs early stopping ended: those stopped improving by its rule, the others ran to the budget."""
    stops = sum(r.get("stopped") == "patience" for r in runs)
    if not stops:
        return ""
    which = "every run" if stops == len(runs) else f"{stops} of {len(runs)} runs (the rest ran to the budget's end)"
    return f" Early stopping ended {which}: no lower valid loss in PATIENCE validations in a row."


def _envelope(entries: list[dict], metric: str) -> tuple[float, float] | None:
    found = [e for e in entries if e and f"{metric}_ci" in e]
    if not found:
        return None
    return min(e[f"{metric}_ci"][0] for e in found), max(e[f"{metric}_ci"][1] for e in found)


def _ci_text(ci, digits: int = 2) -> str:
    return "-" if ci is None else f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"


def _share(count: int, total: int) -> str:
    return f"{count}/{total}" if total else "-"


def chosen_results(study, runs: list, args) -> tuple[dict, dict, dict]:
    """Every run's result with its trend, the lr/warm-up choices, and the results at the chosen settings."""
    results = {run: study.result(run) for run in runs}
    for r in results.values():
        r["trend"] = study_stats.trend(r["curves"]["valid"], args.falling_last, args.falling_slope, r.get("stopped"))
    choices = study_stats.choose_settings(results, args.seed_list[0])
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
        "choices": [{"arch": a, "variant": v, **c} for (a, v), c in choices.items()],
        "comparisons": context["comparisons"],
        "claims": claims(context),
        "provenance": context["provenance"],
        "runs": [{**as_dict(run), "name": run.name,
                  "command": portable_command(json.loads((study.run_dir(run) / "command.json").read_text())["command"], repo),
                  **{k: v for k, v in r.items() if k != without}} for run, r in results.items()],
    }  # fmt: skip


MACHINE_KEYS = ("cpu", "family", "model", "avx512", "cores")  # what makes two machines one type for a comparison


def _machine_type(entry: dict) -> str:
    machine = entry.get("machine", {})
    return ", ".join(f"{k} {machine[k]}" for k in MACHINE_KEYS if k in machine)


def provenance(study, results: dict) -> dict:
    """Each run's attempts from its provenance.json (study_run.Study._record_provenance), and the flags the
    report raises: a run resumed across machines or commits, and a comparison (a run and the baseline's run of
    the same variant and seed) whose arms ran on different machine types. Runs trained before the tool recorded
    provenance are listed as unrecorded, not flagged."""
    attempts, flags, unrecorded = {}, [], []
    for run in results:
        path = study.run_dir(run) / "provenance.json"
        if not path.is_file():
            unrecorded.append(run.name)
            continue
        entries = json.loads(path.read_text(encoding="utf-8"))
        attempts[run.name] = entries
        machines = {_machine_type(e) for e in entries}
        commits = {e.get("commit") for e in entries}
        if len(machines) > 1:
            flags.append(f"{run.name} resumed across machines ({'; '.join(sorted(machines))})")
        if len(commits) > 1:
            flags.append(f"{run.name} resumed across commits ({', '.join(sorted(map(str, commits)))})")
    archs = list(dict.fromkeys(run.arch for run in results))
    for run in results:
        if run.arch == archs[0] or run.name not in attempts:
            continue
        base = next((b for b in results if b.arch == archs[0] and b.variant == run.variant and b.seed == run.seed
                     and b.name in attempts), None)  # fmt: skip
        if base is None:
            continue
        mine = {_machine_type(e) for e in attempts[run.name]}
        theirs = {_machine_type(e) for e in attempts[base.name]}
        if mine != theirs:
            flags.append(f"{run.name} and its baseline {base.name} ran on different machines")
    return {"runs": attempts, "flags": flags, "unrecorded": unrecorded}


def provenance_section(context: dict) -> list[str]:
    """results.md's provenance: how many runs recorded it, and every flag."""
    record = context.get("provenance")
    if not record:
        return []
    total = len(record["runs"]) + len(record["unrecorded"])
    lines = ["## Provenance", "", (f"{len(record['runs'])} of {total} runs record each attempt's commit, machine and "
                                   "resume point (runs/*/provenance.json)"
                                   + (f"; {len(record['unrecorded'])} were trained before the study tool recorded it."
                                      if record["unrecorded"] else "."))]  # fmt: skip
    if record["flags"]:
        lines += ["", "Flags:", ""] + [f"- {flag}" for flag in record["flags"]]
    elif record["runs"]:
        lines += ["", "No run resumed across machines or commits, and every recorded comparison's arms ran on one machine type."]
    return lines + [""]


def claims(context: dict) -> list[dict]:
    """Each system's word against the baseline by the rules of study_claims (ahead, behind, level, seeds
    disagree, not shown): what a reading may cite."""
    variants = list(dict.fromkeys(c["key"][0] for c in context["comparisons"] if c["key"][0] != "variants"))
    record = {"models": [{"arch": a, "variant": v} for v in variants or ["warmup"] for a in context["archs"]],
              "comparisons": context["comparisons"],
              "settings": {"level_margin": context["margin"]}}  # fmt: skip
    return study_claims.claims_of(record)


def claims_section(context: dict) -> list[str]:
    found = claims(context)
    if not found:
        return []
    lines = ["## Claims", "", ("Each model against the first by the rules of scripts/study/study_claims.py: ahead or "
                               "behind when every seed's 95% interval of the difference excludes 0 on one side; level "
                               f"when every interval lies inside ±{context['margin']:g}; seeds disagree when the seeds' "
                               "differences have opposite signs; otherwise not shown. Prose cites them as "
                               "`<!-- claim STUDY: KIND SYSTEM -->` (tests/test_claims.py re-checks every one)."), "",
             "| model | metric | claim | seeds |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {c['system']} | {c['metric']} | {c['claim']} | {len(c['seeds'])} |" for c in found]
    return lines + [""]


def heading(title: str, context: dict) -> list[str]:
    """results.md's first lines: the title, the command, the machine and when."""
    rewritten = f" Report rewritten {context['rewritten']} without training (REPORT_ONLY)." if context.get("rewritten") else ""
    return [f"# {title}: {', '.join(context['archs'])}", "", f"Command: `{context['command']}`", "",
            f"Machine: {context['machine_text']}. Started {context['started']}, {context['total_minutes']:.1f} min in all."
            + rewritten, ""]  # fmt: skip


def reach_text(r: dict) -> str:
    """The table's 'to baseline's loss' cell."""
    reach = "-"
    if r["compared"]:
        reach = f"{r['reach_updates']:.0f} upd, {r['reach_seconds'] / 60:.1f} min" if r["reached"] else "not reached"
        if 0 < r["reached"] < r["compared"]:
            reach += f" ({r['reached']}/{r['compared']} seeds)"
    return reach


def minutes_text(r: dict) -> str:
    """The table's 'train time' cell."""
    minutes = None if r["train_seconds"] is None else r["train_seconds"] / 60
    minutes_std = None if r["train_seconds_std"] is None else r["train_seconds_std"] / 60
    return f"{_fmt(minutes, minutes_std, 1)} min"


def partial(context: dict) -> list[str]:
    if not context.get("missing"):
        return []
    return ["", f"**Partial**: {len(context['missing'])} run(s) of the grid have not finished: "
                + ", ".join(f"`{name}`" for name in context["missing"]) + "."]  # fmt: skip


@dataclass(frozen=True)
class Metric:
    """One difference a comparison reports: the comparison's ``{key}_diff``, ``{key}_ci`` and ``{key}_p``."""

    header: str  # its column, e.g. "ΔBLEU"
    key: str
    digits: int = 2
    p: bool = True  # False: the bootstrap gives no p-value of its own (a second view of the same test)


@dataclass(frozen=True)
class Score:
    """What a report's tables say about its score: translation's BLEU and chrF, a language model's perplexity."""

    columns: tuple[tuple[str, str], ...]  # the results table's score columns: (header, the row's key)
    p_header: str  # what the results table's p column tests
    metrics: tuple[Metric, ...]  # the comparisons' differences; the first decides "level" and the 95% CI column
    unit: str  # LEVEL_MARGIN's unit


def _p_text(p_values: list | None, score: Score) -> str:
    if p_values is None:
        return "baseline"
    found = [p for p in p_values if p is not None]
    if not found:
        return "-"
    return " / ".join(f"{max(p[f'{m.key}_p'] for p in found):.3f}" for m in score.metrics if m.p)


def results_table(rows: list[dict], score: Score) -> list[str]:
    """results.md's table: one line per model and variant at its chosen setting."""
    level = score.metrics[0].key
    lines = [("| model | variant | lr | warm-up | seeds | parameters | "
              + "".join(f"{header} | " for header, _ in score.columns)
              + f"valid loss | updates | train time | to baseline's loss | p ({score.p_header}) | Δ{score.unit} 95% CI | "
              "still falling | best = last |"),
             "|---|---|" + "---:|" * (12 + len(score.columns))]  # fmt: skip
    for r in rows:
        ci = _ci_text(_envelope(r["p_values"] or [], level)) if r["p_values"] is not None else "baseline"
        lines.append(f"| {r['arch']} | {r['variant']} | {r['lr']:g}{' (tuned)' if r['tuned'] else ''} | "
                     f"{r['warmup'] if r['variant'] != 'nowarmup' else 0} | {len(r['seeds'])} | {r['parameters'] or 0:,} | "
                     + "".join(f"{_fmt(r[key], r[f'{key}_std'])} | " for _, key in score.columns)
                     + f"{_fmt(r['valid_loss'], r['valid_loss_std'], 3)} | {_fmt(r['updates'], None, 0)} | "
                     f"{minutes_text(r)} | {reach_text(r)} | {_p_text(r['p_values'], score)} | {ci} | "
                     f"{_share(r['still_falling'], len(r['seeds']))} | {_share(r['best_is_last'], len(r['seeds']))} |")  # fmt: skip
    return lines


def comparison_table(entries: list[dict], first: str, margin: float, score: Score) -> list[str]:
    """One line per comparison and seed: each metric's difference, its 95% CI (and p), and whether level."""
    header = "".join(f" {m.header} | 95% CI |" + (" p |" if m.p else "") for m in score.metrics)
    columns = sum(3 if m.p else 2 for m in score.metrics)
    lines = [f"| {first} | seed |{header} level (±{margin:g} {score.unit}) |", "|---|" + "---:|" * (1 + columns) + "---|"]
    for e in entries:
        level = "yes" if study_stats.within([e], margin, score.metrics[0].key) else "no"
        cells = "".join(f" {e[f'{m.key}_diff']:+.{m.digits}f} | {_ci_text(e[f'{m.key}_ci'], m.digits)} |"
                        + (f" {e[f'{m.key}_p']:.3f} |" if m.p else "") for m in score.metrics)  # fmt: skip
        lines.append(f"| {e['label']} | {e['seed']} |{cells} {level} |")
    return lines


def comparison_sections(rows: list[dict], context: dict, intro, score: Score) -> list[str]:
    """The sections of paired comparisons: against the first model, between PAIRS' chosen models, and, with
    several variants, against each model's first variant. ``intro(baseline)`` is the score's explanation,
    ``score`` names the differences the tables show."""

    def table(entries: list[dict], first: str, margin: float) -> list[str]:
        return comparison_table(entries, first, margin, score)

    lines = []
    compared = [c for c in context["comparisons"] if c["key"][0] != "variants"]
    if compared:
        text = intro(context["archs"][0])
        lines += ["## Paired comparisons against the first model", "", text, ""]
        lines += table([{**c, "label": f"{c['system']} ({c['key'][0]})", "seed": c["key"][1]} for c in compared],
                       "model (variant)", context["margin"]) + [""]  # fmt: skip
    lines += _pair_section(context, intro, table)
    variants = [c for c in context["comparisons"] if c["key"][0] == "variants"]
    if variants:
        first = rows[0]["variant"] if rows else ""
        lines += [f"## Each model's variants against its {first} variant", ""]
        lines += table([{**c, "label": f"{c['key'][1]}: {c['system']} - {first}", "seed": c["key"][2]}
                        for c in variants], "model: variant", context["margin"]) + [""]  # fmt: skip
    return lines


def _pair_section(context: dict, intro, table) -> list[str]:
    pairs = context.get("pairs")
    if not pairs:
        return []
    lines = ["## Paired comparisons between chosen models", "",
             "The pairs of PAIRS (SYSTEM:BASELINE), each model's runs at its chosen lr/warm-up (those of the table "
             "above), on the same bootstrap resamples as against the first model. " + intro("baseline"), ""]  # fmt: skip
    entries = [{**c, "label": f"{c['system']} - {c['baseline']} ({c['key'][0]})", "seed": c["key"][1]}
               for c in pairs["comparisons"]]  # fmt: skip
    if entries:
        lines += table(entries, "model - baseline (variant)", context["margin"]) + [""]
    # a seed that one of the two has not finished: named, as the partial report names the missing runs
    unpaired = [f"{m['system']} - {m['baseline']} ({m['key'][0]}) seed {m['key'][1]} "
                f"({' and '.join(m['unfinished'])} missing)" for m in pairs["missing"]]  # fmt: skip
    if unpaired:
        lines += [f"**Not compared** (a run has not finished): {', '.join(unpaired)}."]
        lines += [""]
    return lines


CHECK_TOLERANCE = 0.0015  # bits: training and fairseq-validate both log the loss to 3 decimals


def validation_check(runs: list) -> list[str]:
    """The runs whose best valid loss was recomputed by fairseq-validate in a new process (study_run's
    _check_validation), and every one that differs from what training logged."""
    checked = [(run, r) for run, r in runs if "checked_valid_loss" in r]
    if not checked:
        return []
    differ = [(run, r) for run, r in checked if r["checked_valid_loss"] is None or r["best_valid_loss"] is None
              or abs(r["checked_valid_loss"] - r["best_valid_loss"]) > CHECK_TOLERANCE]  # fmt: skip
    text = (f"Validation check: fairseq-validate recomputed the best valid loss on checkpoint_best.pt in a new process "
            f"for {len(checked)} of {len(runs)} runs (eval/valid_check.json)")
    if not differ:
        return [f"{text}: every one within {CHECK_TOLERANCE} bits of what training logged.", ""]
    lines = [(f"{text}. **{len(differ)} differ** from what training logged (the model's evaluation in training did "
              "not see the checkpoint's parameters, or the check did not run): their valid losses and the checkpoint "
              "chosen by them are in doubt."), "", "| run | logged in training | fairseq-validate |", "|---|---:|---:|"]
    for run, r in differ:
        lines.append(f"| {run.name} | {_fmt(r['best_valid_loss'], None, 3)} | {_fmt(r['checked_valid_loss'], None, 3)} |")
    return lines + [""]


def runs_and_choices(context: dict, choices: dict) -> list[str]:
    """results.md's sections on every run's trend and on every lr/warm-up candidate (translation and LM alike)."""
    lines = ["## Runs: was the validation loss still falling at the end?", "",
              (f"Slope: least-squares slope of the valid loss over the last {context['falling_last']} validations, per "
               f"100 updates; still falling below -{context['falling_slope']:g} (FALLING_LAST, FALLING_SLOPE). "
               "Best: the lowest valid loss and its update (the evaluated checkpoint_best.pt: of equal lowest "
               "losses the last, which fairseq saves over the earlier)."), "",
              "| run | updates | stopped by | best valid loss (update) | last valid loss | slope | still falling | best = last |",
              "|---|---:|---|---:|---:|---:|---|---|"]  # fmt: skip
    for run, r in context["runs"]:
        t = r["trend"]
        falling = "-" if t["falling"] is None else ("yes" if t["falling"] else "no")
        best = "-" if r["best_valid_loss"] is None else f"{r['best_valid_loss']:.3f} ({r['best_valid_update']})"
        lines.append(f"| {run.name} | {r['updates']} | {r.get('stopped') or 'updates'} | {best} | "
                     f"{_fmt(r['valid_loss'], None, 3)} | {_fmt(t['slope'], None, 3)} | {falling} | "
                     f"{'yes' if t['best_is_last'] else 'no'} |")  # fmt: skip
    lines += [""] + validation_check(context["runs"])
    tuned = {g: c for g, c in choices.items() if len(c["candidates"]) > 1}
    if tuned:
        lines += ["## Learning rate and warm-up, chosen on validation loss (first seed)", "",
                  "Every candidate of the grid; the choice is the lowest best valid loss (that of the evaluated checkpoint).", ""]
        for (arch, variant), choice in tuned.items():
            lines += [f"### {arch} ({variant})", "", "| lr | warm-up | final valid loss | best valid loss | chosen |",
                      "|---:|---:|---:|---:|---|"]  # fmt: skip
            for c in choice["candidates"]:
                mark = "yes" if (c["lr"], c["warmup"]) == (choice["lr"], choice["warmup"]) else ""
                lines.append(f"| {c['lr']:g} | {c['warmup']} | {_fmt(c['valid_loss'], None, 3)} | "
                             f"{_fmt(c['best_valid_loss'], None, 3)} | {mark} |")  # fmt: skip
            lines += [""] + [f"**Edge of the grid**: the choice is {note}." for note in choice.get("edges", [])]
            lines += [""] if choice.get("edges") else []
    return lines
