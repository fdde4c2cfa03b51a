"""The sections of results.md that the translation report (study_report.py) and the language-model report
(study_lm_report.py) share, whose wording does not depend on the score (the score-specific tables and sentences
stay in each report). Which runs are compared and the run-level record are in study_pairing.py; where the runs
ran, in study_provenance.py."""

from dataclasses import dataclass

from scripts.study import study_stats
from scripts.study.study_pairing import claims
from scripts.study.study_stats import _fmt


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


def timing_text(context: dict) -> str:
    """When and how long the runs trained, read from the runs: a study trained one run at a time by separate
    commands (lanes, a cluster) and reported by REPORT_ONLY has no command whose own minutes say that. The
    command's own start and minutes follow only when it trained."""
    seconds = [r["seconds"] for _, r in context["runs"] if r.get("seconds") is not None]
    starts = [a["started"] for entries in (context.get("provenance") or {}).get("runs", {}).values()
              for a in entries if a.get("started")]  # fmt: skip
    text = f"{len(seconds)} scored runs trained {sum(seconds) / 60:.1f} min in all (each run's train time, summed)"
    if starts:
        text += f", the earliest recorded start {min(starts)}"  # "YYYY-MM-DD HH:MM UTC" sorts as time does
    if context.get("rewritten"):
        return text + f". Report rewritten {context['rewritten']} without training (REPORT_ONLY)."
    return text + f"; this command started {context['started']} and took {context['total_minutes']:.1f} min."


def heading(title: str, context: dict) -> list[str]:
    """results.md's first lines: the title, the command, the machine and when."""
    return [f"# {title}: {', '.join(context['archs'])}", "", f"Command: `{context['command']}`", "",
            f"Machine: {context['machine_text']}. {timing_text(context)}", ""]


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


def diverged_text(diverged: list[dict]) -> str:
    """The reading's sentence on the runs that diverged (results.json's ``diverged``), or nothing."""
    if not diverged:
        return ""
    return (f" {len(diverged)} run(s) diverged (a NaN/Inf loss stopped fairseq) and have no score: "
            + ", ".join(d["name"] for d in diverged) + ".")  # fmt: skip


def partial(context: dict) -> list[str]:
    """The runs of the grid the tables leave out: unfinished ones, and diverged ones (a result, with no score)."""
    lines = []
    if context.get("missing"):
        lines += ["", f"**Partial**: {len(context['missing'])} run(s) of the grid have not finished: "
                      + ", ".join(f"`{name}`" for name in context["missing"]) + "."]  # fmt: skip
    if context.get("diverged"):
        lines += ["", f"**Diverged**: {len(context['diverged'])} run(s) stopped on a NaN/Inf loss (fairseq's "
                      "FloatingPointError), not evaluated and never chosen: "
                      + ", ".join(f"`{d['name']}` (last logged update {d['updates']})" for d in context["diverged"]) + "."]  # fmt: skip
    return lines


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
                best = f"diverged (last logged update {c['diverged']})" if "diverged" in c else _fmt(c["best_valid_loss"], None, 3)
                lines.append(f"| {c['lr']:g} | {c['warmup']} | {_fmt(c['valid_loss'], None, 3)} | {best} | {mark} |")
            lines += [""] + [f"**Edge of the grid**: the choice is {note}." for note in choice.get("edges", [])]
            lines += [""] if choice.get("edges") else []
    return lines
