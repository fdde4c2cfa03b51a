"""What a study reports (scripts/study/study.py): the learning-rate/warm-up choice, means and standard deviations
over seeds, sacrebleu's paired bootstrap test against the baseline, the time to the baseline's final valid
loss, results.md, the plots, and a reading of the numbers in words.

- The choice: where a group (architecture, variant) tried several (lr, warm-up) settings, each was trained with
  the first seed, and the one with the lowest final validation loss is kept (never a test score); the other
  seeds then run at that setting only. Every candidate's loss is shown.
- Spread: mean and sample standard deviation (n - 1) over seeds; with one seed there is none ("-").
- Significance: sacrebleu's own paired bootstrap resampling (``sacrebleu.significance.PairedTest``,
  ``test_type="bs"``, as ``sacrebleu --paired-bs``), per seed: each model's test translations against the
  baseline's (the first architecture, same variant, same seed) on the same resampled sentences. p < 0.05 in
  every seed is reported as significant.
- Time to the baseline's loss (DeepCrossAttention's measure): for each run, the first validation at which its
  loss is at or below the final validation loss of the baseline run with the same variant and seed, in
  updates and in training seconds (read_curves).
"""

import math
import statistics
from pathlib import Path

from study_common import Run, reached

P_SIGNIFICANT = 0.05


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def choose_settings(results: dict[Run, dict], first_seed: int) -> dict[tuple[str, str], dict]:
    """group -> {"lr", "warmup", "candidates": [{"lr", "warmup", "valid_loss"}]}, chosen on valid loss."""
    by_group: dict[tuple[str, str], list] = {}
    for run, result in results.items():
        if run.seed == first_seed:
            by_group.setdefault(run.group, []).append({"lr": run.lr, "warmup": run.warmup,
                                                       "valid_loss": result["valid_loss"]})  # fmt: skip
    choices = {}
    for group, candidates in by_group.items():
        scored = [c for c in candidates if c["valid_loss"] is not None and math.isfinite(c["valid_loss"])]
        best = min(scored, key=lambda c: c["valid_loss"]) if scored else candidates[0]
        choices[group] = {"lr": best["lr"], "warmup": best["warmup"], "candidates": candidates}
    return choices


def paired_tests(runs_by_seed: dict[tuple[str, int], list[tuple[str, list[str]]]], references: list[str],
                 samples: int) -> dict[tuple[str, int, str], dict]:  # fmt: skip
    """(variant, seed, arch) -> {"bleu_p", "chrf_p"}: sacrebleu's paired bootstrap against the first system."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    out = {}
    for (variant, seed), systems in runs_by_seed.items():
        if len(systems) < 2:
            continue
        test = PairedTest(systems, {"BLEU": BLEU(), "chrF": CHRF()}, [references], test_type="bs",
                          n_samples=samples)  # fmt: skip
        _signatures, scores = test()
        keys = [k for k in scores if k != "System"]  # sacrebleu renames chrF to chrF2
        for index, name in enumerate(scores["System"][1:], start=1):
            out[(variant, seed, name)] = {"bleu_p": scores[keys[0]][index].p_value,
                                          "chrf_p": scores[keys[1]][index].p_value}  # fmt: skip
    return out


def summarize(results: dict[Run, dict], archs: list[str], variants: list[str], choices: dict,
              tests: dict) -> list[dict]:  # fmt: skip
    """One row per (architecture, variant) at its chosen setting: means over seeds and comparisons."""
    rows = []
    for variant in variants:
        baseline = {run.seed: r for run, r in results.items()
                    if run.group == (archs[0], variant) and _chosen(run, choices)}  # fmt: skip
        for arch in archs:
            runs = sorted(((run, r) for run, r in results.items() if run.group == (arch, variant) and _chosen(run, choices)),
                          key=lambda x: x[0].seed)  # fmt: skip
            if not runs:
                continue
            row = {"arch": arch, "variant": variant, "lr": choices[(arch, variant)]["lr"],
                   "warmup": choices[(arch, variant)]["warmup"], "seeds": [run.seed for run, _ in runs],
                   "parameters": runs[0][1]["parameters"], "tuned": len(choices[(arch, variant)]["candidates"]) > 1}  # fmt: skip
            # row keys as scripts/analysis/compare.py reads a results.json's "models" (train_seconds, updates)
            for key, name in (("bleu", "bleu"), ("chrf", "chrf"), ("valid_loss", "valid_loss"), ("updates", "updates"),
                              ("seconds", "train_seconds")):  # fmt: skip
                row[name], row[name + "_std"] = mean_std([r[key] for _, r in runs])
            times, p_values = [], []
            for run, r in runs:
                base = baseline.get(run.seed)
                if base is not None and base["valid_loss"] is not None:
                    times.append(reached(r["curves"]["valid"], base["valid_loss"]))
                if arch != archs[0]:
                    p_values.append(tests.get((variant, run.seed, arch)))
            row["reached"] = sum(t is not None for t in times)
            row["compared"] = len(times)
            row["reach_updates"] = mean_std([t[0] for t in times if t])[0]
            row["reach_seconds"] = mean_std([t[1] for t in times if t])[0]
            row["p_values"] = p_values if arch != archs[0] else None
            rows.append(row)
    return rows


def _chosen(run: Run, choices: dict) -> bool:
    choice = choices.get(run.group)
    return choice is not None and (run.lr, run.warmup) == (choice["lr"], choice["warmup"])


def _fmt(value, std=None, digits=2) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text + (f" ± {std:.{digits}f}" if std is not None else "")


def _p_text(p_values: list | None) -> str:
    if p_values is None:
        return "baseline"
    found = [p for p in p_values if p is not None]
    if not found:
        return "-"
    bleu = max(p["bleu_p"] for p in found)
    chrf = max(p["chrf_p"] for p in found)
    return f"{bleu:.3f} / {chrf:.3f}"


def markdown(rows: list[dict], choices: dict, context: dict) -> str:
    """results.md: how it was run, the table, the choices, the significance and the plots."""
    lines = [f"# Study: {', '.join(context['archs'])}", "",
             f"Command: `{context['command']}`", "",
             f"Machine: {context['machine_text']}. " + (f"Report written {context['started']} without training (REPORT_ONLY): "
                                                        "each run's training time is in the table." if context.get("report_only")
                                                        else f"Started {context['started']}, {context['total_minutes']:.1f} min in all."), "",
             (f"Data: {context['data_text']}. Budget: {context['budget_text']}, {context['jobs']} run(s) at a time with "
             f"{context['threads']} thread(s) each. Set-up (every run): {context['setup_text']}. Test set "
             f"{context['test_set']} ({context['sentences']} sentences), beam {context['beam']}, "
             f"checkpoint_best.pt (lowest valid loss)."), "",
             ("| model | variant | lr | warm-up | seeds | parameters | sacreBLEU | chrF | valid loss | updates | "
             "train time | to baseline's loss | p (BLEU / chrF) |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        reach = "-"
        if r["compared"]:
            reach = (f"{r['reach_updates']:.0f} upd, {r['reach_seconds'] / 60:.1f} min" if r["reached"] else "not reached")
            if 0 < r["reached"] < r["compared"]:
                reach += f" ({r['reached']}/{r['compared']} seeds)"
        minutes = None if r["train_seconds"] is None else r["train_seconds"] / 60
        minutes_std = None if r["train_seconds_std"] is None else r["train_seconds_std"] / 60
        lines.append(f"| {r['arch']} | {r['variant']} | {r['lr']:g}{' (tuned)' if r['tuned'] else ''} | "
                     f"{r['warmup'] if r['variant'] == 'warmup' else 0} | {len(r['seeds'])} | {r['parameters'] or 0:,} | "
                     f"{_fmt(r['bleu'], r['bleu_std'])} | {_fmt(r['chrf'], r['chrf_std'])} | "
                     f"{_fmt(r['valid_loss'], r['valid_loss_std'], 3)} | {_fmt(r['updates'], None, 0)} | "
                     f"{_fmt(minutes, minutes_std, 1)} min | {reach} | {_p_text(r['p_values'])} |")  # fmt: skip
    if context.get("missing"):
        lines += ["", f"**Partial**: {len(context['missing'])} run(s) of the grid have not finished: "
                      + ", ".join(f"`{name}`" for name in context["missing"]) + "."]  # fmt: skip
    lines += ["", ("Mean ± standard deviation over seeds. Valid loss: fairseq's label-smoothed loss (base 2) at the "
              "last validation. p: sacrebleu's paired bootstrap resampling against the first model of the same "
              f"variant ({context['bootstrap']} samples), the largest p over seeds. Train time counts fairseq's "
              "start-up; 'to baseline's loss' is the first validation at or below the baseline's final valid loss "
              "(same seed)."), ""]  # fmt: skip
    tuned = {g: c for g, c in choices.items() if len(c["candidates"]) > 1}
    if tuned:
        lines += ["## Learning rate and warm-up, chosen on validation loss (first seed)", "",
                  "| model | variant | lr | warm-up | valid loss | chosen |", "|---|---|---:|---:|---:|---|"]  # fmt: skip
        for (arch, variant), choice in tuned.items():
            for c in choice["candidates"]:
                mark = "yes" if (c["lr"], c["warmup"]) == (choice["lr"], choice["warmup"]) else ""
                lines.append(f"| {arch} | {variant} | {c['lr']:g} | {c['warmup']} | {_fmt(c['valid_loss'], None, 3)} | {mark} |")
        lines.append("")
    # the plots sit beside results.md: relative links keep a copied or committed study folder readable
    lines += ["## Plots", "", f"![learning curves]({Path(context['curves_png']).name})", "",
              f"![BLEU]({Path(context['bleu_png']).name})", "",
              f"sacreBLEU signature: `{context['signature']}`", "", "## Reading", "", context["reading"], ""]  # fmt: skip
    return "\n".join(lines)


def reading(rows: list[dict], budget_text: str, missing: int = 0, total: int = 0) -> str:
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
            desc = (f"{r['arch']}{label} reached valid loss {r['valid_loss']:.2f} and {r['bleu']:.1f} BLEU")
            if stuck:
                desc = (f"{r['arch']}{label} did not train: its valid loss stayed near {r['valid_loss']:.2f} "
                        f"(first validation {first:.2f}), {r['bleu']:.1f} BLEU")  # fmt: skip
            elif r is not best:
                gap = r["valid_loss"] - best["valid_loss"]
                how = "about level with" if gap < 0.1 else ("behind" if gap < 0.5 else "far behind")
                desc += f", {how} {best['arch']} ({gap:+.2f} in loss)"
            if r is not base and r["p_values"]:
                found = [p for p in r["p_values"] if p]
                if found:
                    worst = max(p["bleu_p"] for p in found)
                    diff = r["bleu"] - base["bleu"]
                    if abs(diff) < 0.1:  # a p-value says nothing about a difference too small to matter
                        desc += f"; its BLEU is level with {base['arch']}'s (difference {diff:+.2f})"
                    else:
                        desc += (f"; its BLEU is {'above' if diff > 0 else 'below'} {base['arch']}'s "
                                 + (f"significantly (paired bootstrap p <= {worst:.3f} in every seed)"
                                    if worst < P_SIGNIFICANT else f"but not significantly (p = {worst:.3f})"))  # fmt: skip
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
    partial = (f"Partial report, {total - missing} of {total} runs: the means are over the seeds each model has "
               "so far (the seeds column), the significance tests over the seeds its baseline has too. " if missing else "")
    return partial + f"After {budget_text}: " + " ".join(parts) + caveat


def plots(results: dict[Run, dict], rows: list[dict], choices: dict, curves_png, bleu_png) -> None:
    """curves_png: train and valid loss against updates and seconds; bleu_png: BLEU mean ± std per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["arch"], r["variant"]) for r in rows))
    colors = {g: plt.get_cmap("tab10")(i % 10) for i, g in enumerate(groups)}
    multi_variant = len({v for _, v in groups}) > 1
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
    for run, r in results.items():
        if run.group not in colors or not _chosen(run, choices):
            continue
        label = run.arch + (f" ({run.variant})" if multi_variant else "") + f" s{run.seed}"
        for row, kind in enumerate(("train", "valid")):
            points = r["curves"][kind]
            if not points:
                continue
            for col in range(2):
                axes[row][col].plot([p[col] for p in points], [p[2] for p in points], color=colors[run.group],
                                    marker="o" if kind == "valid" else None, markersize=3, linewidth=1,
                                    label=label if row == 1 and col == 0 else None)  # fmt: skip
    for row, kind in enumerate(("train", "valid")):
        for col, xlabel in enumerate(("updates", "training seconds")):
            axes[row][col].set_xlabel(xlabel)
            axes[row][col].set_ylabel(f"{kind} loss (base 2)")
            axes[row][col].grid(alpha=0.3)
    axes[1][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(curves_png, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(rows)), 4))
    names = [r["arch"] + (f"\n{r['variant']}" if multi_variant else "") for r in rows]
    ax.bar(range(len(rows)), [r["bleu"] or 0 for r in rows], yerr=[r["bleu_std"] or 0 for r in rows], capsize=4,
           color=[colors[(r["arch"], r["variant"])] for r in rows])  # fmt: skip
    ax.set_xticks(range(len(rows)), names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("sacreBLEU (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(bleu_png, dpi=100)
    plt.close(fig)
