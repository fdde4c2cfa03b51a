"""What a study reports (scripts/study/study.py): results.json, results.md, the plots and a reading of the
numbers in words (the numbers themselves: study_stats).

Every comparison gets its p-value and the 95% confidence interval of the difference (system - baseline) in BLEU
and chrF; two models are called level only when every seed's interval of the BLEU difference lies inside
±LEVEL_MARGIN, a non-significant difference alone is not a statement of equality. Every run gets the slope of
its last validations and whether its best checkpoint is its last, so a budget that stopped short of
convergence shows. Where LRS/WARMUPS offered several settings, every candidate is listed, with a warning when
the choice lands on the edge of the grid.
"""

import shlex
from pathlib import Path

from scripts.study import study_claims, study_plots, study_stats
from scripts.study.study_common import (
    Run,
    read_lines,
    shown_path,
    write_json,
    write_text,
)
from scripts.study.study_pairing import (
    add_first_valid_loss,
    chosen_results,
    comparisons_of,
    lr_text,
    pair_comparisons,
    paired_groups,
    results_record,
    run_context,
)
from scripts.study.study_provenance import provenance_section
from scripts.study.study_report_common import (
    Metric,
    Score,
    _ci_text,
    _envelope,
    _trend_text,
    claims_section,
    comparison_sections,
    diverged_text,
    heading,
    partial,
    results_table,
    runs_and_choices,
    stopping_text,
)


def report(args, study, runs: list[Run], data: Path, manifest: dict, info: dict, started: str, env_vars: tuple,
           repo: Path, missing: list[Run] = ()) -> dict:  # fmt: skip
    """results.json, results.md, curves.png, bleu.png; returns the context (with the reading) for the console."""
    results, choices, chosen = chosen_results(study, runs, args)
    groups = paired_groups(args, chosen, "hyps")
    references = read_lines(data / study.test_set["reference"])
    tests = study_stats.paired_tests(groups, references, args.bootstrap) if args.bootstrap else {}
    pairs = pair_comparisons(args, chosen, "hyps", lambda g: study_stats.paired_tests(g, references, args.bootstrap))
    rows = study_stats.summarize(results, args.arch_list, args.variant_list, choices, tests)
    add_first_valid_loss(rows, chosen)
    out = args.out_dir
    curves_png, bleu_png = out / "curves.png", out / "bleu.png"
    study_plots.plots(results, rows, choices, curves_png, bleu_png)
    any_result = next(iter(results.values()))
    settings = {key: getattr(args, key) for key in ("arch_list", "seed_list", "variant_list", "lr_list", "arch_settings", "warmup_list",
                                                      "max_update", "train_minutes", "patience", "model_args",
                                                      "train_lines", "jobs", "threads", "valid_every", "bootstrap",
                                                      "level_margin", "falling_last", "falling_slope")}  # fmt: skip
    context = {
        **run_context(args, study, info, started, env_vars, results, missing, comparisons_of(tests)),
        "pairs": pairs,
        "data_text": f"{manifest.get('dataset', data.name)} {manifest['source_lang']}->{manifest['target_lang']} "
                     f"(`{shown_path(data, repo)}`{', first ' + str(args.train_lines) + ' training pairs' if args.train_lines else ''})",
        "setup_text": f"`{' '.join(args.model_arg_list) or '(preset width)'}`, Adam {args.setup.adam_betas}, peak lr "
                      f"{lr_text(args)}, dropout {args.setup.dropout}, label smoothing "
                      f"{args.setup.label_smoothing}, weight decay {args.setup.weight_decay}, {args.setup.max_tokens} "
                      f"tokens per update, validation every {args.valid_every} updates"
                      + (f", extra `{shlex.join(args.extra)}`" if args.extra else ""),
        "test_set": study.test_set["name"], "sentences": any_result["sentences"], "beam": any_result["beam"],
        "signature": any_result["signature"], "curves_png": str(curves_png), "bleu_png": str(bleu_png),
    }  # fmt: skip
    context["reading"] = reading(rows, context["budget_text"], missing=len(missing), total=len(runs) + len(missing),
                                 margin=args.level_margin, runs=list(results.values()), choices=choices,
                                 trend_text=_trend_text(context), diverged=context["diverged"])  # fmt: skip
    write_text(out / "results.md", markdown(rows, choices, context))
    write_json(out / "results.json", results_record(args, study, context, info, settings, shown_path(data, repo),
                                                    study.test_set["name"], rows, choices, results, repo, "hyps"))
    return {**context, "rows": rows}


SCORE = Score(columns=(("sacreBLEU", "bleu"), ("chrF", "chrf")), p_header="BLEU / chrF",
              metrics=(Metric("ΔBLEU", "bleu"), Metric("ΔchrF", "chrf")), unit="BLEU")  # fmt: skip


def markdown(rows: list[dict], choices: dict, context: dict) -> str:
    """results.md: how it was run, the table, the comparisons, the runs, the choices, the plots, the reading."""
    lines = heading("Study", context) + [
        (f"Data: {context['data_text']}. Budget: {context['budget_text']}, {context['jobs']} run(s) at a time with "
         f"{context['threads']} thread(s) each. Set-up (every run): {context['setup_text']}. Test set "
         f"{context['test_set']} ({context['sentences']} sentences), beam {context['beam']}, "
         f"checkpoint_best.pt (lowest valid loss)."), ""] + results_table(rows, SCORE)  # fmt: skip
    lines += partial(context)
    lines += ["", ("Mean ± standard deviation over seeds. Valid loss: fairseq's label-smoothed loss (base 2) at the "
              "last validation. p: sacrebleu's paired bootstrap resampling against the first model of the same "
              f"variant ({context['bootstrap']} samples), the largest p over seeds; ΔBLEU 95% CI: from the lowest to "
              "the highest bound of the seeds' intervals of the difference (model - first model), from the same "
              "resamples. Train time counts fairseq's start-up; 'to baseline's loss' is the first validation at or "
              "below the baseline's final valid loss (same seed). Still falling: runs with a "
              f"{_trend_text(context)}; best = last: runs whose lowest valid loss is at their last validation."), ""]  # fmt: skip
    lines += comparison_sections(rows, context, lambda baseline: (
        f"Per seed: the difference (model - {baseline}) in corpus BLEU and chrF, the 95% "
        "confidence interval of the difference from sacrebleu's paired bootstrap resamples, and its p-value. "
        f"Level: the interval lies inside ±{context['margin']:g} BLEU (LEVEL_MARGIN); a p above 0.05 alone "
        "says only that no difference was shown."), SCORE)  # fmt: skip
    lines += claims_section(context)
    lines += runs_and_choices(context, choices)
    lines += provenance_section(context)
    # the plots sit beside results.md: relative links keep a copied or committed study folder readable
    lines += ["## Plots", "", f"![learning curves]({Path(context['curves_png']).name})", "",
              f"![BLEU]({Path(context['bleu_png']).name})", "",
              f"sacreBLEU signature: `{context['signature']}`", "", "## Reading", "", context["reading"], ""]  # fmt: skip
    return "\n".join(lines)


def _bleu_text(r: dict, base: dict, margin: float | None) -> str:
    """The comparison's words, by the rules of study_claims (the words a README may cite), over the seeds that
    have a comparison: with one seed the sentence says so instead of "every seed"."""
    found = [p for p in r["p_values"] if p]
    if not found:
        return ""
    worst = max(p["bleu_p"] for p in found)
    diff = r["bleu"] - base["bleu"]
    ci = _envelope(found, "bleu")
    ci_text = f", 95% CI of the difference {_ci_text(ci)}" if ci else ""
    seeds = "in its one seed" if len(found) == 1 else f"in each of its {len(found)} seeds"
    intervals = {i: (p["bleu_diff"], *p["bleu_ci"]) for i, p in enumerate(found)}
    word = study_claims.classify(intervals, margin if margin is not None else 0.0)
    if word == "level" and margin is not None:
        return (f"; its BLEU is level with {base['arch']}'s (difference {diff:+.2f}{ci_text}, inside ±{margin:g} "
                f"{seeds})")  # fmt: skip
    if word in ("ahead", "behind"):
        return (f"; its BLEU is {'above' if word == 'ahead' else 'below'} {base['arch']}'s: the interval of the "
                f"difference excludes 0 {seeds} (paired bootstrap p <= {worst:.3f}{ci_text})")  # fmt: skip
    if word == "seeds-disagree":
        return (f"; the seeds disagree on the side of {base['arch']}'s BLEU it lies on (mean difference {diff:+.2f}, "
                f"p up to {worst:.3f}{ci_text})")  # fmt: skip
    beyond = f"; the interval reaches beyond ±{margin:g}, so they are not shown level either" if ci and margin else ""
    return (f"; its BLEU is {'above' if diff > 0 else 'below'} {base['arch']}'s but not shown so "
            f"(p = {worst:.3f}{ci_text}{beyond})")  # fmt: skip


def reading(rows: list[dict], budget_text: str, missing: int = 0, total: int = 0, margin: float | None = None,
            runs: list[dict] = (), choices: dict | None = None, trend_text: str = "", diverged: list[dict] = ()) -> str:  # fmt: skip
    """One paragraph that says what the numbers say, with wording chosen from the numbers themselves."""
    if not rows:
        return "No run finished."
    parts = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        group = [r for r in rows if r["variant"] == variant and r["valid_loss"] is not None]
        if not group:
            continue
        best = min(group, key=lambda r: r["valid_loss"])
        base = group[0]
        label = f" ({variant})" if len({r["variant"] for r in rows}) > 1 else ""
        sentences = []
        for r in group:
            first = r.get("first_valid_loss")
            stuck = first is not None and first - r["valid_loss"] < 0.05 * first
            desc = f"{r['arch']}{label} reached valid loss {r['valid_loss']:.2f} and {r['bleu']:.1f} BLEU"
            if stuck:
                desc = (f"{r['arch']}{label} did not train: its valid loss stayed near {r['valid_loss']:.2f} "
                        f"(first validation {first:.2f}), {r['bleu']:.1f} BLEU")  # fmt: skip
            elif r is not best:
                gap = r["valid_loss"] - best["valid_loss"]
                how = "within 0.1 in loss of" if gap < 0.1 else ("behind" if gap < 0.5 else "far behind")
                desc += f", {how} {best['arch']} ({gap:+.2f} in loss)"
            if r is not base and r["p_values"]:
                desc += _bleu_text(r, base, margin)
            if r is not base and r["compared"]:
                desc += (f"; it reached {base['arch']}'s final valid loss after {r['reach_updates']:.0f} updates"
                         if r["reached"] == r["compared"] else f"; it did not reach {base['arch']}'s final valid loss"
                         + (f" in every seed ({r['reached']}/{r['compared']})" if r["reached"] else ""))  # fmt: skip
            sentences.append(desc)
        parts.append("; ".join(sentences) + ".")
    counts = {len(r["seeds"]) for r in rows}
    seeds = max(counts)
    stops = sum(r.get("stopped") == "patience" for r in runs)
    caveat = (f" This is {budget_text} with one seed: "
              + ("it shows the early phase of training at this budget, not converged quality, and " if not stops else "")
              + "there is no spread to judge noise by." if seeds == 1
              else f" This is {budget_text} with {seeds} seeds" + ("" if len(counts) == 1 else " at most (the seeds "
                   "column: fewer where a run has no score, unfinished or diverged)") + "; ± is the spread over seeds.")  # fmt: skip
    caveat += stopping_text(runs)
    trends = [r["trend"] for r in runs if r.get("trend")]
    falling = sum(bool(t["falling"]) for t in trends)
    last = sum(t["best_is_last"] for t in trends)
    if falling:
        caveat += (f" The validation loss was still falling at the end in {falling} of {len(trends)} runs (a {trend_text})"
                   f" and the best checkpoint was the last in {last}: "
                   + ("every run stopped short of convergence." if falling == len(trends) else
                      "those runs stopped short of convergence."))  # fmt: skip
    edges = [f"{arch} ({variant}): {note}" for (arch, variant), c in (choices or {}).items() for note in c.get("edges", [])]
    if edges:
        caveat += " The learning-rate/warm-up choice lies on the edge of its grid for " + "; ".join(edges) + "."
    caveat += diverged_text(diverged)
    partial = (f"Partial report, {total - missing} of {total} runs: the means are over the seeds each model has "
               "so far (the seeds column), the significance tests over the seeds its baseline has too. " if missing else "")
    return partial + f"After {budget_text}: " + " ".join(parts) + caveat
