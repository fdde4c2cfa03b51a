"""What a language-model study reports (study_lm.py): results.json, results.md, curves.png, perplexity.png and
a reading, as study_report.py does for translation, with perplexity for BLEU.

The score is the validation perplexity of checkpoint_best.pt, one sentence per example; the test perplexity
stands beside it. Every comparison gets the p-value of the paired bootstrap on the test sentences'
log-likelihoods and the 95% intervals of the perplexity difference and of the difference in mean
log-likelihood per token (model - baseline); two models are called level only when every seed's interval of
the perplexity difference lies inside ±LEVEL_MARGIN perplexity points.
"""

import shlex

from scripts.study import study_lm, study_plots, study_stats
from scripts.study.study_common import shown_path, write_json, write_text
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
from scripts.study.study_stats import P_SIGNIFICANT, _fmt

SCORES = ("valid_ppl", "test_ppl")


def report(args, study, runs, data, manifest: dict, info: dict, started: str, env_vars: tuple, repo,
           missing=()) -> dict:  # fmt: skip
    """results.json, results.md, curves.png, perplexity.png; returns the context for the console."""
    results, choices, chosen = chosen_results(study, runs, args)
    groups = paired_groups(args, chosen, "scores")
    tests = study_lm.paired_tests(groups, args.bootstrap) if args.bootstrap else {}
    pairs = pair_comparisons(args, chosen, "scores", lambda g: study_lm.paired_tests(g, args.bootstrap))
    rows = study_stats.summarize(results, args.arch_list, args.variant_list, choices, tests, scores=SCORES)
    add_first_valid_loss(rows, chosen)
    out = args.out_dir
    curves_png, ppl_png = out / "curves.png", out / "perplexity.png"
    study_plots.plots(results, rows, choices, curves_png, ppl_png, score="valid_ppl",
                      score_label="validation perplexity (mean ± std over seeds)")  # fmt: skip
    any_result = next(iter(results.values()))
    settings = {key: getattr(args, key) for key in ("task", "arch_list", "seed_list", "variant_list", "lr_list", "arch_settings",
                                                      "warmup_list", "max_update", "train_minutes", "patience",
                                                      "model_args", "jobs", "threads", "valid_every", "bootstrap",
                                                      "level_margin", "falling_last", "falling_slope")}  # fmt: skip
    s = args.setup
    context = {
        **run_context(args, study, info, started, env_vars, results, missing, comparisons_of(tests)),
        "pairs": pairs,
        "data_text": f"{manifest.get('dataset', data.name)}, language modeling (`{shown_path(data, repo)}`)",
        "setup_text": f"`{' '.join(args.model_arg_list) or '(preset width)'}`, packed blocks of {s.tokens_per_sample} "
                      f"tokens, Adam {s.adam_betas}, peak lr {lr_text(args)}, dropout "
                      f"{s.dropout}, weight decay {s.weight_decay}, {s.max_tokens} tokens per update, tied embeddings, "
                      f"validation every {args.valid_every} updates"
                      + (f", extra `{shlex.join(args.extra)}`" if args.extra else "") + " (MODEL_ARGS and extra options win)",
        "sentences": any_result["sentences"], "skipped": max(sum(r["skipped"].values()) for r in results.values()),
        "curves_png": str(curves_png), "ppl_png": str(ppl_png),
    }  # fmt: skip
    context["reading"] = reading(rows, context, missing=len(missing), total=len(runs) + len(missing),
                                 runs=list(results.values()))  # fmt: skip
    write_text(out / "results.md", markdown(rows, choices, context))
    write_json(out / "results.json", results_record(args, study, context, info, settings, shown_path(data, repo), "test",
                                                    rows, choices, results, repo, "scores", task=study_lm.TASK))
    return {**context, "rows": rows}


SCORE = Score(columns=(("valid ppl", "valid_ppl"), ("test ppl", "test_ppl")), p_header="test ppl",
              metrics=(Metric("Δppl", "ppl"), Metric("Δ log-lik/token (nats)", "ll", digits=4, p=False)),
              unit="ppl")  # fmt: skip


def markdown(rows: list[dict], choices: dict, context: dict) -> str:
    lines = heading("Language-model study", context) + [
        (f"Data: {context['data_text']}. Budget: {context['budget_text']}, {context['jobs']} run(s) at a time with "
         f"{context['threads']} thread(s) each. Set-up (every run): {context['setup_text']}. Scored: "
         f"checkpoint_best.pt (lowest valid loss), one sentence per example (--sample-break-mode eos); test set "
         f"{context['sentences']} sentences.")
        + (f" **{context['skipped']} valid/test sentence(s) longer than the model's positions (--tokens-per-sample) "
           "were skipped by fairseq's scorer**: the perplexities are over the others." if context["skipped"] else ""),
        ""] + results_table(rows, SCORE)  # fmt: skip
    lines += partial(context)
    lines += ["", ("Mean ± standard deviation over seeds. Perplexity: exp of the mean negative log-likelihood per "
                   "token (natural log; fairseq-eval-lm's) of checkpoint_best.pt, one sentence per example. Valid loss: "
                   "fairseq's cross-entropy (base 2) at the last validation, on the training's packed blocks. p: paired "
                   f"bootstrap of the test perplexity against the first model of the same variant ({context['bootstrap']} "
                   "resamples of the test sentences, sacrebleu's resampling and p-value), the largest p over seeds; "
                   "Δppl 95% CI: from the lowest to the highest bound of the seeds' intervals of the difference "
                   f"(model - first model). Still falling: runs with a {_trend_text(context)}."), ""]  # fmt: skip
    lines += comparison_sections(rows, context, lambda baseline: (
        f"Per seed, on the test sentences: the difference (model - {baseline}) in perplexity and "
        "in mean log-likelihood per token, their 95% intervals from the same bootstrap resamples, and the "
        f"p-value. Level: the perplexity interval lies inside ±{context['margin']:g} (LEVEL_MARGIN); a p "
        "above 0.05 alone says only that no difference was shown."), SCORE)  # fmt: skip
    lines += claims_section(context)
    lines += runs_and_choices(context, choices)
    lines += provenance_section(context)
    lines += ["## Plots", "", "![learning curves](curves.png)", "", "![validation perplexity](perplexity.png)", "",
              "## Reading", "", context["reading"], ""]  # fmt: skip
    return "\n".join(lines)


def _versus(r: dict, base: dict, margin: float) -> str:
    found = [p for p in r["p_values"] if p]
    if not found:
        return ""
    worst = max(p["ppl_p"] for p in found)
    ci = _envelope(found, "ppl")
    diff = r["test_ppl"] - base["test_ppl"]
    side = "below" if diff < 0 else "above"
    if study_stats.within(found, margin, "ppl"):
        return (f"; its test perplexity is level with {base['arch']}'s (difference {diff:+.2f}, 95% CI "
                f"{_ci_text(ci)}, inside ±{margin:g} in every seed)")  # fmt: skip
    if worst < P_SIGNIFICANT:
        return f"; its test perplexity is {side} {base['arch']}'s significantly (p <= {worst:.3f} in every seed, 95% CI {_ci_text(ci)})"
    return (f"; its test perplexity is {side} {base['arch']}'s but not significantly (p = {worst:.3f}, 95% CI "
            f"{_ci_text(ci)}, reaching beyond ±{margin:g}, so not shown level either)")  # fmt: skip


def reading(rows: list[dict], context: dict, missing: int = 0, total: int = 0, runs: list[dict] = ()) -> str:
    """One paragraph that says what the numbers say, worded from the numbers."""
    if not rows:
        return "No run finished."
    parts = []
    multi = len({r["variant"] for r in rows}) > 1
    for variant in dict.fromkeys(r["variant"] for r in rows):
        group = [r for r in rows if r["variant"] == variant and r["valid_ppl"] is not None]
        if not group:
            continue
        best, base = min(group, key=lambda r: r["valid_ppl"]), group[0]
        sentences = []
        for r in group:
            label = f"{r['arch']}{f' ({variant})' if multi else ''}"
            first = r.get("first_valid_loss")
            if first is not None and r["valid_loss"] is not None and first - r["valid_loss"] < 0.05 * first:
                desc = f"{label} did not train: its valid loss stayed near {r['valid_loss']:.2f} (first validation {first:.2f})"
            else:
                desc = f"{label} reached validation perplexity {r['valid_ppl']:.2f} (test {r['test_ppl']:.2f})"
                if r is not best:
                    desc += f", {r['valid_ppl'] / best['valid_ppl'] - 1:+.1%} against {best['arch']}"
            if r is not base and r["p_values"]:
                desc += _versus(r, base, context["margin"])
            sentences.append(desc)
        parts.append("; ".join(sentences) + ".")
    seeds = max(len(r["seeds"]) for r in rows)
    caveat = (f" {seeds} seed(s); ± is the spread over seeds." if seeds > 1 else
              " One seed: there is no spread to judge noise by.")  # fmt: skip
    caveat += stopping_text(runs)
    trends = [r["trend"] for r in runs if r.get("trend")]
    falling = sum(bool(t["falling"]) for t in trends)
    if falling:
        caveat += (f" The validation loss was still falling at the end in {falling} of {len(trends)} runs (a "
                   f"{_trend_text(context)}): those runs stopped short of convergence.")  # fmt: skip
    caveat += diverged_text(context.get("diverged", ()))
    partial = f"Partial report, {total - missing} of {total} runs. " if missing else ""
    return partial + f"After {context['budget_text']}: " + " ".join(parts) + caveat


def console_table(rows: list[dict]) -> str:
    lines = [f"{'model':<32} {'variant':<8} {'seeds':>5} {'valid ppl':>15} {'test ppl':>15} {'valid loss':>10} {'updates':>7}"]
    for r in rows:
        lines.append(f"{r['arch']:<32} {r['variant']:<8} {len(r['seeds']):>5} {_fmt(r['valid_ppl'], r['valid_ppl_std']):>15} "
                     f"{_fmt(r['test_ppl'], r['test_ppl_std']):>15} {_fmt(r['valid_loss'], None, 3):>10} "
                     f"{r['updates'] or 0:>7.0f}")  # fmt: skip
    return "\n".join(lines)
