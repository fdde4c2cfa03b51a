"""The plots of a study's report (scripts/study/study.py): the learning curves of every run at its group's
chosen setting (train and valid loss against updates and training seconds), and BLEU mean ± std per model."""

from scripts.study.study_common import Run
from scripts.study.study_stats import _chosen


def plots(results: dict[Run, dict], rows: list[dict], choices: dict, curves_png, bleu_png, score: str = "bleu",
          score_label: str = "sacreBLEU (mean ± std over seeds)") -> None:  # fmt: skip
    """curves_png: train and valid loss against updates and seconds; bleu_png: the score (BLEU, or a language
    model's perplexity) mean ± std per model."""
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
    ax.bar(range(len(rows)), [r[score] or 0 for r in rows], yerr=[r[score + "_std"] or 0 for r in rows], capsize=4,
           color=[colors[(r["arch"], r["variant"])] for r in rows])  # fmt: skip
    ax.set_xticks(range(len(rows)), names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel(score_label)
    fig.tight_layout()
    fig.savefig(bleu_png, dpi=100)
    plt.close(fig)
