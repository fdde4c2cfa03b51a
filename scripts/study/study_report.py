"""What a study reports (scripts/study/study.py): results.json, results.md, the plots and a reading of the
numbers in words (the numbers themselves: study_stats).

Every comparison gets its p-value and the 95% confidence interval of the difference (system - baseline) in BLEU
and chrF; two models are called level only when every seed's interval of the BLEU difference lies inside
±LEVEL_MARGIN, a non-significant difference alone is not a statement of equality. Every run gets the slope of
its last validations and whether its best checkpoint is its last, so a budget that stopped short of
convergence shows. Where LRS/WARMUPS offered several settings, every candidate is listed, with a warning when
the choice lands on the edge of the grid.
"""

import json
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path

import study_plots
import study_stats
from study_common import (
    Run,
    as_dict,
    command_line,
    describe_machine,
    read_lines,
    write_json,
)
from study_stats import P_SIGNIFICANT, _chosen, _fmt


def _shown(path: Path, repo: Path) -> str:
    """A path inside the repository relative to it, so a committed study names no machine's directories."""
    try:
        return str(path.resolve().relative_to(repo.resolve()))
    except ValueError:
        return str(path)


def _portable(cmd: list[str], repo: Path) -> list[str]:
    """A run's command without this machine's places: the interpreter as ``python``, the plugin and
    repository paths relative (the stored command.json keeps them as run, for resuming)."""
    out = []
    for i, token in enumerate(cmd):
        if i == 0 and token.startswith("/"):
            token = "python"
        elif token.startswith("/"):
            shown = _shown(Path(token), repo)
            if shown.startswith("/") and "/fairseq_plugins" in shown:
                shown = "fairseq_plugins" + shown.rsplit("/fairseq_plugins", 1)[1]
            token = shown
        out.append(token)
    return out


def _earlier(out: Path) -> dict:
    """The start and duration of the study that trained the runs, kept when a report is rewritten."""
    try:
        old = json.loads((out / "results.json").read_text(encoding="utf-8"))
        return {"started": old["started"], "total_minutes": old["total_minutes"]}
    except (OSError, ValueError, KeyError):
        return {}


def report(args, study, runs: list[Run], data: Path, manifest: dict, info: dict, started: str, env_vars: tuple,
           repo: Path, missing: list[Run] = ()) -> dict:  # fmt: skip
    """results.json, results.md, curves.png, bleu.png; returns the context (with the reading) for the console."""
    results = {run: study.result(run) for run in runs}
    for r in results.values():
        r["trend"] = study_stats.trend(r["curves"]["valid"], args.falling_last, args.falling_slope)
    choices = study_stats.choose_settings(results, args.seed_list[0])
    chosen = {run: r for run, r in results.items() if _chosen(run, choices)}
    by_seed: dict[tuple, list] = {}
    by_arch: dict[tuple, list] = {}
    for variant in args.variant_list:
        for arch in args.arch_list:
            for run, r in chosen.items():
                if run.group == (arch, variant):
                    by_seed.setdefault((variant, run.seed), []).append((arch, r["hyps"]))
                    by_arch.setdefault(("variants", arch, run.seed), []).append((variant, r["hyps"]))
    # a seed whose baseline run (or first variant) is missing (a partial report) has nothing to be paired with
    groups = {key: systems for key, systems in by_seed.items() if systems[0][0] == args.arch_list[0]}
    if len(args.variant_list) > 1:  # each model under each variant against itself under the first variant
        groups.update({key: systems for key, systems in by_arch.items() if systems[0][0] == args.variant_list[0]})
    references = read_lines(data / study.test_set["reference"])
    tests = study_stats.paired_tests(groups, references, args.bootstrap) if args.bootstrap else {}
    rows = study_stats.summarize(results, args.arch_list, args.variant_list, choices, tests)
    for row in rows:  # the first validation, for the reading's "did not train"
        firsts = [r["first_valid_loss"] for run, r in chosen.items() if run.group == (row["arch"], row["variant"])]
        row["first_valid_loss"] = study_stats.mean_std(firsts)[0]
    out = args.out_dir
    curves_png, bleu_png = out / "curves.png", out / "bleu.png"
    study_plots.plots(results, rows, choices, curves_png, bleu_png)
    budget_text = args.budget.describe()
    any_result = next(iter(results.values()))
    settings = {key: getattr(args, key) for key in ("arch_list", "seed_list", "variant_list", "lr_list", "warmup_list",
                                                      "max_update", "train_minutes", "patience", "model_args",
                                                      "train_lines", "jobs", "threads", "valid_every", "bootstrap",
                                                      "level_margin", "falling_last", "falling_slope")}  # fmt: skip
    earlier = _earlier(out) if args.report_only else {}
    comparisons = [{"key": list(key[:-1]), "system": key[-1], **value} for key, value in tests.items()]
    context = {
        "archs": args.arch_list, "command": command_line(env_vars), "machine_text": describe_machine(info),
        "started": earlier.get("started", started), "rewritten": _now() if args.report_only else None,
        "total_minutes": earlier.get("total_minutes", (time.time() - study.start) / 60),
        "data_text": f"{manifest.get('dataset', data.name)} {manifest['source_lang']}->{manifest['target_lang']} "
                     f"(`{_shown(data, repo)}`{', first ' + str(args.train_lines) + ' training pairs' if args.train_lines else ''})",
        "budget_text": budget_text, "jobs": args.jobs, "threads": args.threads,
        "setup_text": f"`{' '.join(args.model_arg_list) or '(preset width)'}`, Adam {args.setup.adam_betas}, peak lr "
                      f"{'/'.join(f'{lr:g}' for lr in args.lr_list)}, dropout {args.setup.dropout}, label smoothing "
                      f"{args.setup.label_smoothing}, weight decay {args.setup.weight_decay}, {args.setup.max_tokens} "
                      f"tokens per update, validation every {args.valid_every} updates"
                      + (f", extra `{shlex.join(args.extra)}`" if args.extra else ""),
        "test_set": study.test_set["name"], "sentences": any_result["sentences"], "beam": any_result["beam"],
        "bootstrap": args.bootstrap, "signature": any_result["signature"], "margin": args.level_margin,
        "falling_last": args.falling_last, "falling_slope": args.falling_slope,
        "curves_png": str(curves_png), "bleu_png": str(bleu_png),
        "missing": [run.name for run in missing], "report_only": args.report_only, "comparisons": comparisons,
        "runs": [(run, r) for run, r in results.items()],
    }  # fmt: skip
    context["reading"] = reading(rows, budget_text, missing=len(missing), total=len(runs) + len(missing),
                                 margin=args.level_margin, runs=list(results.values()), choices=choices,
                                 trend_text=_trend_text(context))  # fmt: skip
    (out / "results.md").write_text(markdown(rows, choices, context), encoding="utf-8")
    write_json(out / "results.json", {
        "command": context["command"], "machine": info, "started": context["started"],
        "total_minutes": round(context["total_minutes"], 1), "budget": as_dict(args.budget),
        "budget_kind": "wall-clock training minutes" if args.budget.minutes else "updates",
        "setup": as_dict(args.setup), "settings": settings, "data": _shown(data, repo), "test_set": study.test_set["name"],
        "models": rows, "reading": context["reading"], "missing": context["missing"], "report_only": args.report_only,
        "choices": [{"arch": a, "variant": v, **c} for (a, v), c in choices.items()], "comparisons": comparisons,
        "runs": [{**as_dict(run), "name": run.name,
                  "command": _portable(json.loads((study.run_dir(run) / "command.json").read_text())["command"], repo),
                  **{k: v for k, v in r.items() if k not in ("hyps",)}} for run, r in results.items()],
    })  # fmt: skip
    return {**context, "rows": rows}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _trend_text(context: dict) -> str:
    return (f"valid-loss slope over the last {context['falling_last']} validations below "
            f"-{context['falling_slope']:g} per 100 updates")


def _envelope(entries: list[dict], metric: str) -> tuple[float, float] | None:
    found = [e for e in entries if e and f"{metric}_ci" in e]
    if not found:
        return None
    return min(e[f"{metric}_ci"][0] for e in found), max(e[f"{metric}_ci"][1] for e in found)


def _ci_text(ci) -> str:
    return "-" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _p_text(p_values: list | None) -> str:
    if p_values is None:
        return "baseline"
    found = [p for p in p_values if p is not None]
    if not found:
        return "-"
    bleu = max(p["bleu_p"] for p in found)
    chrf = max(p["chrf_p"] for p in found)
    return f"{bleu:.3f} / {chrf:.3f}"


def _share(count: int, total: int) -> str:
    return f"{count}/{total}" if total else "-"


def _comparison_table(entries: list[dict], first: str, margin: float) -> list[str]:
    lines = [f"| {first} | seed | ΔBLEU | 95% CI | p | ΔchrF | 95% CI | p | level (±{margin:g} BLEU) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for e in entries:
        level = "yes" if study_stats.within([e], margin) else "no"
        lines.append(f"| {e['label']} | {e['seed']} | {e['bleu_diff']:+.2f} | {_ci_text(e['bleu_ci'])} | {e['bleu_p']:.3f} | "
                     f"{e['chrf_diff']:+.2f} | {_ci_text(e['chrf_ci'])} | {e['chrf_p']:.3f} | {level} |")  # fmt: skip
    return lines


def markdown(rows: list[dict], choices: dict, context: dict) -> str:
    """results.md: how it was run, the table, the comparisons, the runs, the choices, the plots, the reading."""
    rewritten = f" Report rewritten {context['rewritten']} without training (REPORT_ONLY)." if context.get("rewritten") else ""
    lines = [f"# Study: {', '.join(context['archs'])}", "",
             f"Command: `{context['command']}`", "",
             f"Machine: {context['machine_text']}. Started {context['started']}, {context['total_minutes']:.1f} min in all."
             + rewritten, "",
             (f"Data: {context['data_text']}. Budget: {context['budget_text']}, {context['jobs']} run(s) at a time with "
             f"{context['threads']} thread(s) each. Set-up (every run): {context['setup_text']}. Test set "
             f"{context['test_set']} ({context['sentences']} sentences), beam {context['beam']}, "
             f"checkpoint_best.pt (lowest valid loss)."), "",
             ("| model | variant | lr | warm-up | seeds | parameters | sacreBLEU | chrF | valid loss | updates | "
             "train time | to baseline's loss | p (BLEU / chrF) | ΔBLEU 95% CI | still falling | best = last |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        reach = "-"
        if r["compared"]:
            reach = (f"{r['reach_updates']:.0f} upd, {r['reach_seconds'] / 60:.1f} min" if r["reached"] else "not reached")
            if 0 < r["reached"] < r["compared"]:
                reach += f" ({r['reached']}/{r['compared']} seeds)"
        minutes = None if r["train_seconds"] is None else r["train_seconds"] / 60
        minutes_std = None if r["train_seconds_std"] is None else r["train_seconds_std"] / 60
        ci = _ci_text(_envelope(r["p_values"] or [], "bleu")) if r["p_values"] is not None else "baseline"
        lines.append(f"| {r['arch']} | {r['variant']} | {r['lr']:g}{' (tuned)' if r['tuned'] else ''} | "
                     f"{r['warmup'] if r['variant'] != 'nowarmup' else 0} | {len(r['seeds'])} | {r['parameters'] or 0:,} | "
                     f"{_fmt(r['bleu'], r['bleu_std'])} | {_fmt(r['chrf'], r['chrf_std'])} | "
                     f"{_fmt(r['valid_loss'], r['valid_loss_std'], 3)} | {_fmt(r['updates'], None, 0)} | "
                     f"{_fmt(minutes, minutes_std, 1)} min | {reach} | {_p_text(r['p_values'])} | {ci} | "
                     f"{_share(r['still_falling'], len(r['seeds']))} | {_share(r['best_is_last'], len(r['seeds']))} |")  # fmt: skip
    if context.get("missing"):
        lines += ["", f"**Partial**: {len(context['missing'])} run(s) of the grid have not finished: "
                      + ", ".join(f"`{name}`" for name in context["missing"]) + "."]  # fmt: skip
    lines += ["", ("Mean ± standard deviation over seeds. Valid loss: fairseq's label-smoothed loss (base 2) at the "
              "last validation. p: sacrebleu's paired bootstrap resampling against the first model of the same "
              f"variant ({context['bootstrap']} samples), the largest p over seeds; ΔBLEU 95% CI: from the lowest to "
              "the highest bound of the seeds' intervals of the difference (model - first model), from the same "
              "resamples. Train time counts fairseq's start-up; 'to baseline's loss' is the first validation at or "
              "below the baseline's final valid loss (same seed). Still falling: runs with a "
              f"{_trend_text(context)}; best = last: runs whose lowest valid loss is at their last validation."), ""]  # fmt: skip
    compared = [c for c in context["comparisons"] if c["key"][0] != "variants"]
    if compared:
        lines += ["## Paired comparisons against the first model", "",
                  (f"Per seed: the difference (model - {context['archs'][0]}) in corpus BLEU and chrF, the 95% "
                   "confidence interval of the difference from sacrebleu's paired bootstrap resamples, and its p-value. "
                   f"Level: the interval lies inside ±{context['margin']:g} BLEU (LEVEL_MARGIN); a p above 0.05 alone "
                   "says only that no difference was shown."), ""]  # fmt: skip
        lines += _comparison_table([{**c, "label": f"{c['system']} ({c['key'][0]})", "seed": c["key"][1]} for c in compared],
                                   "model (variant)", context["margin"]) + [""]  # fmt: skip
    variants = [c for c in context["comparisons"] if c["key"][0] == "variants"]
    if variants:
        first = rows[0]["variant"] if rows else ""
        lines += [f"## Each model's variants against its {first} variant", ""]
        lines += _comparison_table([{**c, "label": f"{c['key'][1]}: {c['system']} - {first}", "seed": c["key"][2]}
                                    for c in variants], "model: variant", context["margin"]) + [""]  # fmt: skip
    lines += runs_and_choices(context, choices)
    # the plots sit beside results.md: relative links keep a copied or committed study folder readable
    lines += ["## Plots", "", f"![learning curves]({Path(context['curves_png']).name})", "",
              f"![BLEU]({Path(context['bleu_png']).name})", "",
              f"sacreBLEU signature: `{context['signature']}`", "", "## Reading", "", context["reading"], ""]  # fmt: skip
    return "\n".join(lines)


def runs_and_choices(context: dict, choices: dict) -> list[str]:
    """results.md's sections on every run's trend and on every lr/warm-up candidate (translation and LM alike)."""
    lines = ["## Runs: was the validation loss still falling at the end?", "",
              (f"Slope: least-squares slope of the valid loss over the last {context['falling_last']} validations, per "
               f"100 updates; still falling below -{context['falling_slope']:g} (FALLING_LAST, FALLING_SLOPE). "
               "Best: the lowest valid loss and its update (the evaluated checkpoint_best.pt)."), "",
              "| run | updates | stopped by | best valid loss (update) | last valid loss | slope | still falling | best = last |",
              "|---|---:|---|---:|---:|---:|---|---|"]  # fmt: skip
    for run, r in context["runs"]:
        t = r["trend"]
        falling = "-" if t["falling"] is None else ("yes" if t["falling"] else "no")
        best = "-" if r["best_valid_loss"] is None else f"{r['best_valid_loss']:.3f} ({r['best_valid_update']})"
        lines.append(f"| {run.name} | {r['updates']} | {r.get('stopped') or 'updates'} | {best} | "
                     f"{_fmt(r['valid_loss'], None, 3)} | {_fmt(t['slope'], None, 3)} | {falling} | "
                     f"{'yes' if t['best_is_last'] else 'no'} |")  # fmt: skip
    lines.append("")
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


def _bleu_text(r: dict, base: dict, margin: float | None) -> str:
    found = [p for p in r["p_values"] if p]
    if not found:
        return ""
    worst = max(p["bleu_p"] for p in found)
    diff = r["bleu"] - base["bleu"]
    ci = _envelope(found, "bleu")
    ci_text = f", 95% CI of the difference {_ci_text(ci)}" if ci else ""
    if margin is not None and ci is not None and study_stats.within(found, margin):
        return (f"; its BLEU is level with {base['arch']}'s (difference {diff:+.2f}{ci_text}, inside ±{margin:g} "
                "in every seed)")  # fmt: skip
    if worst < P_SIGNIFICANT:
        return (f"; its BLEU is {'above' if diff > 0 else 'below'} {base['arch']}'s significantly (paired bootstrap "
                f"p <= {worst:.3f} in every seed{ci_text})")  # fmt: skip
    beyond = f"; the interval reaches beyond ±{margin:g}, so they are not shown level either" if ci and margin else ""
    return (f"; its BLEU is {'above' if diff > 0 else 'below'} {base['arch']}'s but not significantly "
            f"(p = {worst:.3f}{ci_text}{beyond})")  # fmt: skip


def reading(rows: list[dict], budget_text: str, missing: int = 0, total: int = 0, margin: float | None = None,
            runs: list[dict] = (), choices: dict | None = None, trend_text: str = "") -> str:  # fmt: skip
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
    seeds = max(len(r["seeds"]) for r in rows)
    caveat = (f" This is {budget_text} with {seeds} seed(s): it shows the early phase of training at this "
              "budget, not converged quality, and with one seed there is no spread to judge noise by." if seeds == 1
              else f" This is {budget_text} with {seeds} seeds; ± is the spread over seeds.")  # fmt: skip
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
    partial = (f"Partial report, {total - missing} of {total} runs: the means are over the seeds each model has "
               "so far (the seeds column), the significance tests over the seeds its baseline has too. " if missing else "")
    return partial + f"After {budget_text}: " + " ".join(parts) + caveat
