"""Seeds and sentences together: a model's BLEU difference to the baseline over several seeds, with an interval that
counts both sources of noise, what difference that many seeds can detect, and one decision per model (issue 55).

Per-seed paired bootstrap (study_stats.paired_tests) answers "is this seed's model better on these sentences";
a claim about an architecture needs the spread over seeds too. The two-level bootstrap here resamples both:
each draw picks the seeds with replacement (a seed's system run stays paired with the baseline's run of the same
seed: same data order and initialisation draw) and, crossed with them, one resample of the test sentences shared by
every run (the sentences are the same test set for every seed). The statistic of a draw is the mean over the drawn
seeds of corpus BLEU(system) - corpus BLEU(baseline) on the drawn sentences; the interval is its 2.5th-97.5th
percentile, the estimate the mean over seeds of the full-test-set differences.

The decision (margin LEVEL_MARGIN, default ±1 BLEU), from 3 seeds on: ahead / behind when the interval excludes 0
on that side; level when it lies inside ±margin; undecided otherwise. The detectable difference at n seeds is
2.8 x the standard error that n seeds would give (a two-sided 5% test with 80% power: 1.96 + 0.84), with the
standard error split into the part that shrinks with seeds (between-seed variance / n) and the sentence part that
does not (the test set is shared): var(n) = max(var_seeds - var_sentences, 0) / n + var_sentences, where
var_seeds is the sample variance of the per-seed differences and var_sentences the mean per-seed bootstrap
variance of the difference over sentences.

The machine as a factor: a seed's two runs may have trained on different machine types (a study that spans
sessions runs where it is given a machine). Their kernels round differently, so the trajectories part as if a
little extra seed noise were added; the interval over seeds counts that, but a decision could still rest on
mixed pairs. Each seed's pair is labelled from the runs' provenance.json (study_provenance.pair_machines: same,
different, unrecorded) and the analysis is repeated over the seeds whose two runs trained on one machine type,
with its own decision by the same rules.

Every scored run is listed too (run_record), read from its own records: machine and start, stop, best
validation(s), test BLEU / chrF, resumes and validation check; a study README links that table instead of typing
its rows again as seeds land.

    python -m scripts.study.study_seeds --study docs/study/converged_e12d12 --references REFS \
        [--margin 1.0] [--samples 1000] [--out docs/study/converged_e12d12/seeds]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU

from scripts.study.study_common import (
    Run,
    describe_machine,
    machine,
    read_lines,
    write_json,
    write_text,
)
from scripts.study.study_logs import best_validation, finished_curves
from scripts.study.study_provenance import MACHINE_KEYS, machine_type, pair_machines
from scripts.study.study_stats import bleu_score, bleu_statistics

Z_POWER = 1.96 + 0.84  # two-sided 5% test, 80% power


def sentence_statistics(hyps: list[str], references: list[str]) -> np.ndarray:
    """BLEU's sufficient statistics of every sentence (study_stats.bleu_statistics, sacrebleu's defaults)."""
    return bleu_statistics(BLEU(), hyps, references)


def corpus_bleu(stats: np.ndarray) -> float:
    """Corpus BLEU (sacrebleu's defaults: exp smoothing, order 4) from summed sentence statistics."""
    return bleu_score(BLEU(), stats)


def two_level(system: dict[int, np.ndarray], baseline: dict[int, np.ndarray], samples: int, seed: int = 12345) -> dict:
    """The mean BLEU difference over the seeds both have, its two-level bootstrap interval, and the parts of
    its variance. ``system``/``baseline``: seed -> per-sentence statistics."""
    seeds = sorted(set(system) & set(baseline))
    if not seeds:
        raise ValueError("no seed has both a system and a baseline run")
    sentences = len(next(iter(system.values())))
    rng = np.random.default_rng(seed)
    per_seed = {s: corpus_bleu(system[s].sum(0)) - corpus_bleu(baseline[s].sum(0)) for s in seeds}
    draws, within = [], {s: [] for s in seeds}
    for _ in range(samples):
        idx = rng.integers(0, sentences, sentences)
        diffs = {s: corpus_bleu(system[s][idx].sum(0)) - corpus_bleu(baseline[s][idx].sum(0)) for s in seeds}
        for s in seeds:
            within[s].append(diffs[s])
        picked = rng.choice(seeds, size=len(seeds), replace=True)
        draws.append(float(np.mean([diffs[s] for s in picked])))
    draws_sorted = np.sort(draws)
    low = len(draws_sorted) // 40  # sacrebleu's percentile convention (estimate_ci)
    var_sentences = float(np.mean([np.var(within[s], ddof=1) for s in seeds]))
    var_seeds = statistics.variance(per_seed.values()) if len(seeds) > 1 else None
    return {"seeds": seeds, "per_seed": per_seed, "mean": float(np.mean(list(per_seed.values()))),
            "ci": [float(draws_sorted[low]), float(draws_sorted[len(draws_sorted) - low - 1])],
            "var_sentences": var_sentences, "var_seeds": var_seeds}  # fmt: skip


def detectable(result: dict, n: int) -> float | None:
    """The BLEU difference n seeds would detect (5% two-sided, 80% power), from the variance parts measured."""
    if result["var_seeds"] is None:
        return None
    between = max(result["var_seeds"] - result["var_sentences"], 0.0)
    return Z_POWER * float(np.sqrt(between / n + result["var_sentences"]))


MIN_SEEDS = 3  # a bootstrap over two seeds draws one of three seed sets: it cannot measure the spread over seeds


def decide(ci: list[float], margin: float, seeds: int = MIN_SEEDS) -> str:
    if seeds < MIN_SEEDS:
        return f"undecided (fewer than {MIN_SEEDS} seeds)"
    if ci[0] > 0:
        return "ahead"
    if ci[1] < 0:
        return "behind"
    if -margin <= ci[0] and ci[1] <= margin:
        return "level"
    return "undecided"


def scored_seeds(study: Path, setting: Run) -> dict[int, Path]:
    """seed -> run folder of every scored run (eval/results.json) of ``setting``'s architecture, variant, lr and
    warm-up under STUDY/runs, whether or not the study's results.json lists it yet: seeds train one at a time over
    sessions, and the report that lists them is re-made when a reading changes, this analysis whenever a seed lands."""
    prefix = setting.name[: -len("0")]  # ARCH.VARIANT.lrLR.wuWARMUP.s
    found = {}
    for run_dir in (study / "runs").glob(f"{prefix}*"):
        seed = run_dir.name[len(prefix):]
        if seed.isdigit() and (run_dir / "eval" / "results.json").is_file():
            found[int(seed)] = run_dir
    return dict(sorted(found.items()))


def run_record(run_dir: Path, test_set: str) -> dict:
    """What the runs table of seeds.md shows of one scored run, read from its records: where and when it trained
    (provenance.json; None before the study tool recorded it), how it stopped (DONE.json), its best validation(s)
    (train.log, as the study's result counts them), test BLEU / chrF (eval/results.json), every resume and whether
    the validation check (eval/valid_check.json) reproduced the best loss."""
    curves, done = finished_curves(run_dir)
    best = best_validation(curves["valid"])
    test = json.loads((run_dir / "eval" / "results.json").read_text(encoding="utf-8"))["tests"][test_set]
    path, check = run_dir / "provenance.json", run_dir / "eval" / "valid_check.json"
    attempts = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    machine = None if attempts is None else {k: attempts[0]["machine"][k] for k in MACHINE_KEYS if k in attempts[0]["machine"]}
    return {
        "stopped": done.get("stopped"), "updates": done.get("updates"),
        "best_valid_loss": best[2] if best else None,
        "best_valid_updates": [u for u, _s, loss in curves["valid"] if best and loss == best[2]],
        "bleu": test["bleu"], "chrf": test["chrf"], "machine": machine,
        "started": None if attempts is None else attempts[0].get("started"),
        "resumes": None if attempts is None else [
            {"update": (a.get("resumed_from") or {}).get("update"),
             "same_machine_type": machine_type(a) == machine_type(attempts[0])}
            for a in attempts[1:]],
        "checked_valid_loss": json.loads(check.read_text(encoding="utf-8")).get("valid_loss") if check.is_file() else None,
    }  # fmt: skip


def analyse(study: Path, references: list[str], margin: float, samples: int) -> dict:
    """Every model of a study's results.json at its chosen setting against the first model, over every scored
    seed in the study's runs/ (scored_seeds)."""
    results = json.loads((study / "results.json").read_text(encoding="utf-8"))
    chosen = {(c["arch"], c["variant"]): (c["lr"], c["warmup"]) for c in results["choices"]}
    stats: dict[str, dict[int, np.ndarray]] = {}
    dirs: dict[str, dict[int, Path]] = {}
    for (arch, variant), (lr, warmup) in chosen.items():
        for seed, run_dir in scored_seeds(study, Run(arch, variant, lr, warmup, 0)).items():
            hyp_files = sorted((run_dir / "eval" / "hyps").glob(f"{results['test_set']}.*"))
            if hyp_files:
                stats.setdefault(arch, {})[seed] = sentence_statistics(read_lines(hyp_files[0]), references)
                dirs.setdefault(arch, {})[seed] = run_dir
    baseline = results["models"][0]["arch"]
    models = []
    for arch in [m["arch"] for m in results["models"][1:]]:
        if arch not in stats:
            continue
        result = two_level(stats[arch], stats[baseline], samples)
        result["decision"] = decide(result["ci"], margin, len(result["seeds"]))
        result["detectable"] = {str(n): detectable(result, n) for n in (2, 5, 10)}  # as JSON keys them
        machines = {s: pair_machines(dirs[arch][s], dirs[baseline][s]) for s in result["seeds"]}
        same = [s for s in result["seeds"] if machines[s] == "same"]
        one_type = None
        if same:
            part = two_level({s: stats[arch][s] for s in same}, stats[baseline], samples)
            one_type = {"seeds": same, "mean": part["mean"], "ci": part["ci"],
                        "decision": decide(part["ci"], margin, len(same))}  # fmt: skip
        models.append({"arch": arch, **result, "per_seed": {str(k): v for k, v in result["per_seed"].items()},
                       "machines": {str(k): v for k, v in machines.items()}, "seeds_on_one_machine_type": len(same),
                       "one_machine_type": one_type})  # fmt: skip
    runs = [{"arch": arch, "seed": seed, "name": run_dir.name, **run_record(run_dir, results["test_set"])}
            for arch in [m["arch"] for m in results["models"]] for seed, run_dir in dirs.get(arch, {}).items()]
    return {"study": study.name, "baseline": baseline, "margin": margin, "samples": samples, "models": models,
            "runs": runs}


def markdown(record: dict, command: str) -> str:
    lines = [f"# Seeds and sentences: {record['study']} against {record['baseline']}", "",
             (f"Command: `{command}` on {record['machine_text']}. Two-level paired bootstrap ({record['samples']} draws: seeds with replacement, "
             f"crossed with one resample of the shared test sentences); decision at ±{record['margin']:g} BLEU "
             "(scripts/study/study_seeds.py says how)."), "",
             ("The machine as a factor: each seed's pair of runs is labelled from their provenance.json as trained on "
              "the same machine type (s), on different ones (d) or unrecorded (u, trained before the study tool "
              "recorded it), and the last column repeats the analysis over the seeds whose two runs trained on one "
              "machine type."), "",
             ("| model | seeds | mean ΔBLEU | 95% CI | decision | per seed (machines) | detectable at 2 / 5 / 10 seeds "
              "| on one machine type: seeds, mean [95% CI], decision |"),
             "|---|---:|---:|---|---|---|---|---|"]  # fmt: skip
    for m in record["models"]:
        det = " / ".join("-" if m["detectable"][n] is None else f"{m['detectable'][n]:.2f}" for n in ("2", "5", "10"))
        per_seed = ", ".join(f"{s}: {d:+.2f} ({m['machines'][s][0]})" for s, d in m["per_seed"].items())
        one = m["one_machine_type"]
        one_text = ("none" if one is None else f"{len(one['seeds'])}, {one['mean']:+.2f} "
                    f"[{one['ci'][0]:+.2f}, {one['ci'][1]:+.2f}], {one['decision']}")  # fmt: skip
        lines.append(f"| {m['arch']} | {len(m['seeds'])} | {m['mean']:+.2f} | [{m['ci'][0]:+.2f}, {m['ci'][1]:+.2f}] | "
                     f"{m['decision']} | {per_seed} | {det} | {one_text} |")  # fmt: skip
    lines += ["", "## Every scored run", "",
              ("Read from each run's records: its first attempt's machine and start (provenance.json), how it stopped "
               "(DONE.json: patience, or the cap of updates), its best validation loss and the update(s) that reached "
               "it (train.log), test BLEU / chrF (eval/results.json), every resume from a checkpoint, and whether "
               "the validation check (fairseq-validate on the best checkpoint in a new process, "
               "eval/valid_check.json) gives the same loss."), "",
              "| model | seed | machine, started | stopped | best valid loss (bits) at update | test BLEU / chrF | resumes | validation check |",
              "|---|---:|---|---|---|---|---|---|"]  # fmt: skip
    for r in record.get("runs", []):
        lines.append(f"| {r['arch']} | {r['seed']} | {_machine_text(r)} | {_stopped_text(r)} | {_best_text(r)} | "
                     f"{r['bleu']:.2f} / {r['chrf']:.2f} | {_resumes_text(r)} | {_check_text(r)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _machine_text(run: dict) -> str:
    m = run["machine"]
    if m is None:
        return "unrecorded"
    avx = {True: ", AVX-512", False: ", no AVX-512"}.get(m.get("avx512"), "")
    started = f", {run['started']}" if run["started"] else ""
    return f"{m.get('cpu')} (family {m.get('family')}, model {m.get('model')}{avx}){started}"


def _stopped_text(run: dict) -> str:
    how = {"patience": "patience", "updates": "the cap", "diverged": "diverged"}.get(run["stopped"], run["stopped"] or "-")
    return f"{how}, at {run['updates']:,}" if run["updates"] else how


def _best_text(run: dict) -> str:
    if run["best_valid_loss"] is None:
        return "-"
    return f"{run['best_valid_loss']:.3f} at " + " and ".join(f"{u:,}" for u in run["best_valid_updates"])


def _resumes_text(run: dict) -> str:
    if run["resumes"] is None:
        return "unrecorded"
    if not run["resumes"]:
        return "none"
    return "; ".join(f"at {r['update']:,}" if r["update"] is not None else "from scratch" for r in run["resumes"]) + (
        " (same machine type)" if all(r["same_machine_type"] for r in run["resumes"]) else " (another machine type)")


def _check_text(run: dict) -> str:
    checked, best = run["checked_valid_loss"], run["best_valid_loss"]
    if checked is None or best is None:
        return "not recorded"
    return "agrees" if abs(checked - best) < 5e-4 else f"{checked:.3f} (differs)"


def _prepared_references(study: Path) -> Path | None:
    results = study / "results.json"
    if not results.is_file():
        return None
    test_set = json.loads(results.read_text(encoding="utf-8"))["test_set"]
    found = sorted(study.glob(f"data-bin/*/refs/{test_set}.*"))
    return found[0] if found else None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, required=True, help="a study folder with results.json and runs/")
    parser.add_argument("--references", type=Path, default=None,
                        help="the test set's reference text, one line each (default: the study's prepared "
                             "STUDY/data-bin/*/refs/TEST_SET.*, which the study's command writes)")  # fmt: skip
    parser.add_argument("--margin", type=float, default=1.0, help="level: the interval inside ±margin BLEU (> 0)")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap draws (>= 100)")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md (default: print)")
    args = parser.parse_args(argv)
    if not args.margin > 0 or args.samples < 100:
        parser.error("--margin must be > 0 and --samples >= 100")
    references = args.references or _prepared_references(args.study)
    if references is None:
        parser.error(f"--references: {args.study} has no prepared data-bin/*/refs/ (run the study's command with "
                     "REPORT_ONLY=1 to prepare it, or give the reference file)")  # fmt: skip
    record = analyse(args.study, read_lines(references), args.margin, args.samples)
    command = "python -m scripts.study.study_seeds " + " ".join(a for a in (argv or sys.argv[1:]))
    record["machine_text"] = describe_machine(machine())
    text = markdown(record, command)
    if args.out:
        write_json(args.out.with_suffix(".json"), {**record, "command": command})
        write_text(args.out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
