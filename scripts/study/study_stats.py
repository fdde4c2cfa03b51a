"""The numbers of a study's report (scripts/study/study.py): the learning-rate/warm-up choice, means and
standard deviations over seeds, sacrebleu's paired bootstrap with the confidence interval of each difference,
the time to the baseline's final valid loss, and whether a run's validation loss was still falling.

- The choice: where a group (architecture, variant) tried several (lr, warm-up) settings, each was trained with
  the first seed, and the one with the lowest best validation loss (the loss of the checkpoint that is
  evaluated) is kept, never a test score; the other seeds then run at that setting only.
- Spread: mean and sample standard deviation (n - 1) over seeds; with one seed there is none ("-").
- Significance: sacrebleu's own paired bootstrap resampling (``sacrebleu.significance.PairedTest``,
  ``test_type="bs"``, as ``sacrebleu --paired-bs``), per seed: each model's test translations against the
  baseline's on the same resampled sentences. p < 0.05 in every seed is reported as significant.
- Confidence interval of a difference: sacrebleu gives the p-value and each system's own interval, not the
  difference's. The difference's 95% interval is taken from the same resamples: sacrebleu draws them from
  ``numpy.random.default_rng(SACREBLEU_SEED, default 12345)`` with one ``choice`` call, which is repeated
  here; each resample's score difference (system - baseline) is computed with the metric's own statistics
  (BLEU's from its public sentence scores and ``BLEU.compute_bleu``), and the interval is the 2.5th to 97.5th percentile in sacrebleu's convention (``estimate_ci``: the n//40-th
  sorted value from either end). tests/test_study.py checks that the resamples are sacrebleu's.
- Time to the baseline's loss (DeepCrossAttention's measure): the first validation at which a run's loss is
  at or below the final validation loss of the baseline run with the same variant and seed.
- Still falling: the least-squares slope of the validation loss over the run's last k validations (in loss
  per 100 updates); below -threshold, the loss was still falling when training stopped. Never for a run that
  early stopping (PATIENCE) ended: it had stopped improving by that criterion.
"""

import copy
import math
import os
import statistics

from scripts.study.study_common import Run
from scripts.study.study_logs import reached

P_SIGNIFICANT = 0.05


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _score(result: dict) -> float | None:
    return result.get("best_valid_loss", result["valid_loss"])


def choose_settings(results: dict[Run, dict], first_seed: int) -> dict[tuple[str, str], dict]:
    """group -> {"lr", "warmup", "candidates": [{"lr", "warmup", "valid_loss", "best_valid_loss"}]}; a diverged
    candidate also has "diverged" (its last logged update) and no best valid loss: never chosen."""
    by_group: dict[tuple[str, str], list] = {}
    for run, result in results.items():
        if run.seed == first_seed:
            by_group.setdefault(run.group, []).append({"lr": run.lr, "warmup": run.warmup, "valid_loss": result["valid_loss"],
                                                       "best_valid_loss": _score(result),
                                                       **({"diverged": result["updates"]} if result.get("stopped") == "diverged" else {})})  # fmt: skip
    choices = {}
    for group, candidates in by_group.items():
        scored = [c for c in candidates if c["best_valid_loss"] is not None and math.isfinite(c["best_valid_loss"])]
        best = min(scored, key=lambda c: c["best_valid_loss"]) if scored else candidates[0]
        choices[group] = {"lr": best["lr"], "warmup": best["warmup"], "candidates": candidates,
                          "edges": grid_edges(candidates, best)}  # fmt: skip
    return choices


def grid_edges(candidates: list[dict], best: dict) -> list[str]:
    """Where the choice sits on the edge of its grid, and which way to widen it."""
    notes = []
    for key, name, variable in (("lr", "learning rate", "LRS"), ("warmup", "warm-up", "WARMUPS")):
        values = sorted({c[key] for c in candidates})
        if len(values) < 2:
            continue
        if best[key] == values[0]:
            notes.append(f"the smallest {name} of the grid ({best[key]:g}): widen {variable} downwards")
        elif best[key] == values[-1]:
            notes.append(f"the largest {name} of the grid ({best[key]:g}): widen {variable} upwards")
    return notes


def _bootstrap_indices(sentences: int, samples: int):
    """The resampled sentence indices of sacrebleu's paired bootstrap (significance._paired_bs_test)."""
    import numpy as np

    seed = os.environ.get("SACREBLEU_SEED", "12345")
    rng = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    return rng.choice(sentences, size=(samples, sentences), replace=True)


def _resampled(metric, hyps: list[str], references: list[str], idxs):
    """The metric's corpus score on every resample ``idxs`` of the sentences, as sacrebleu's paired bootstrap
    computes it: each sentence's statistics as float32, summed over the resample, scored.

    BLEU through sacrebleu's public API: a sentence's statistics are its ``sentence_score``'s lengths, n-gram
    matches and totals, and ``BLEU.compute_bleu`` scores their sums (bit-identical to the bootstrap's own path,
    tests/test_study_stats_records.py). chrF has no public per-sentence statistics (its ``CHRFScore`` holds the
    score only) and scoring every resample with ``corpus_score`` takes minutes per system: it keeps the metric's
    statistics interface (``_extract_corpus_statistics``, ``_compute_score_from_stats``), which sacrebleu's own
    ``significance`` module calls, under the pinned sacrebleu (scripts/requirements.txt)."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    if not isinstance(metric, BLEU):
        stats = np.array(metric._extract_corpus_statistics(hyps, [references]), dtype="float32")
        return np.array([metric._compute_score_from_stats(s.sum(0)).score for s in stats[idxs]])
    stats = bleu_statistics(metric, hyps, references).astype("float32")  # counts: exact in float32
    return np.array([bleu_score(metric, sample.sum(0)) for sample in stats[idxs]])


def bleu_statistics(metric, hyps: list[str], references: list[str]):
    """BLEU's sufficient statistics of every sentence (sys_len, ref_len, n-gram matches, n-gram totals; float64),
    from sacrebleu's public sentence scores: summed over any subset, they give that subset's corpus BLEU."""
    import numpy as np

    sentence_bleu = copy.copy(metric)
    sentence_bleu.effective_order = True  # the statistics do not depend on it; it silences the sentence-level warning
    scores = (sentence_bleu.sentence_score(hyp, [ref]) for hyp, ref in zip(hyps, references, strict=True))
    return np.array([[s.sys_len, s.ref_len, *s.counts, *s.totals] for s in scores], dtype="float64")


def bleu_score(metric, stats) -> float:
    """``metric``'s corpus BLEU from summed sentence statistics (``bleu_statistics``), by ``BLEU.compute_bleu``."""
    from sacrebleu.metrics import BLEU

    n = metric.max_ngram_order
    return BLEU.compute_bleu(correct=stats[2 : 2 + n], total=stats[2 + n :], sys_len=int(stats[0]),
                             ref_len=int(stats[1]), smooth_method=metric.smooth_method, smooth_value=metric.smooth_value,
                             effective_order=metric.effective_order, max_ngram_order=n).score  # fmt: skip


def difference_ci(diffs) -> tuple[float, float]:
    """The 95% interval of bootstrap differences, in sacrebleu's convention (significance.estimate_ci)."""
    import numpy as np

    diffs = np.sort(diffs)
    low = len(diffs) // 40
    return float(diffs[low]), float(diffs[len(diffs) - low - 1])


def paired_tests(groups: dict[tuple, list[tuple[str, list[str]]]], references: list[str], samples: int) -> dict[tuple, dict]:
    """KEY + (name,) -> {"bleu_p", "chrf_p", "bleu_diff", "bleu_ci", "chrf_diff", "chrf_ci"}: each system of a
    group against the group's first, with sacrebleu's paired bootstrap and the interval of the difference."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    out = {}
    for key, systems in groups.items():
        if len(systems) < 2:
            continue
        test = PairedTest(systems, {"BLEU": BLEU(), "chrF": CHRF()}, [references], test_type="bs",
                          n_samples=samples)  # fmt: skip
        _signatures, scores = test()
        keys = [k for k in scores if k != "System"]  # sacrebleu renames chrF to chrF2
        idxs = _bootstrap_indices(len(references), samples)
        metrics = {"bleu": BLEU(), "chrf": CHRF()}
        base = {m: _resampled(metric, systems[0][1], references, idxs) for m, metric in metrics.items()}
        for index, (name, hyps) in enumerate(systems[1:], start=1):
            entry = {}
            for m, column in zip(metrics, keys, strict=True):
                diffs = _resampled(metrics[m], hyps, references, idxs) - base[m]
                entry[f"{m}_p"] = scores[column][index].p_value
                entry[f"{m}_diff"] = round(scores[column][index].score - scores[column][0].score, 4)
                entry[f"{m}_ci"] = [round(v, 4) for v in difference_ci(diffs)]
            out[(*key, name)] = {k: entry[k] for k in ("bleu_p", "chrf_p", "bleu_diff", "bleu_ci", "chrf_diff", "chrf_ci")}
    return out


def trend(valid: list[tuple[int, float, float]], last: int, threshold: float, stopped: str | None = None) -> dict:
    """{"slope": loss per 100 updates over the last ``last`` validations, "falling", "best_is_last"}.

    A run that early stopping ended (``stopped == "patience"``) is not still falling whatever its slope: it went
    PATIENCE validations without a lower valid loss, and the slope over a few validations of a flat curve is
    its noise (a dip at the last one reads as falling)."""
    best_is_last = bool(valid) and min(p[2] for p in valid) == valid[-1][2]
    points = valid[-last:]
    if len(points) < max(2, last):
        return {"slope": None, "falling": None, "best_is_last": best_is_last}
    xs, ys = [p[0] / 100 for p in points], [p[2] for p in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"slope": round(slope, 4), "falling": slope < -threshold and stopped != "patience", "best_is_last": best_is_last}


def within(entries: list[dict], margin: float, metric: str = "bleu") -> bool:
    """Every seed's 95% interval of the difference inside [-margin, +margin]: the two are level at this margin."""
    return bool(entries) and all(-margin <= e[f"{metric}_ci"][0] and e[f"{metric}_ci"][1] <= margin for e in entries)


def summarize(results: dict[Run, dict], archs: list[str], variants: list[str], choices: dict,
              tests: dict, scores: tuple[str, ...] = ("bleu", "chrf")) -> list[dict]:  # fmt: skip
    """One row per (architecture, variant) at its chosen setting: means over seeds of ``scores`` (the results'
    keys: BLEU and chrF, or a language model's perplexities) and of the curves, and the comparisons."""
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
            for key, name in (*((s, s) for s in scores), ("valid_loss", "valid_loss"), ("updates", "updates"),
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
            trends = [r["trend"] for _, r in runs if "trend" in r]
            row["still_falling"] = sum(bool(t["falling"]) for t in trends)
            row["best_is_last"] = sum(t["best_is_last"] for t in trends)
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
