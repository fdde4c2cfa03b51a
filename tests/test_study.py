"""The study tool (scripts/study/, recipes/study.sh) and the main job built on it (recipes/main_job.sh).

In-process: learning curves from fairseq's JSON logs (also across a resume), the lr/warm-up choice on valid
loss, the grid, the schedules of the variants, the reading's wording, the report. End to end on the Multi30k
fixtures with tiny models: a 2-architecture x 2-seed grid interrupted (test hook STUDY_INTERRUPT_AT) and
restarted finishes without retraining what was done and continues the interrupted run from its checkpoint; its
records alone (no checkpoints or data, as committed) are reused, under its set-up only; a failed run is reported
and the others go on; the main job prints a compact console, a table, a plot path and a reading. The variables'
checks are in test_study_checks.py, language-model studies in test_study_lm.py.
"""

import json
import shutil
import subprocess

import pytest

from scripts.study import (
    study,
    study_common,
    study_logs,
    study_report,
    study_report_common,
    study_stats,
)

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked  # noqa: F401  (a fixture)
from .helpers import REPO
from .study_fixtures import (
    MODEL_ARGS,
    Finished,
    log_record,
    recipe,
    recipes_side_by_side,
    slow,
)

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")

# ------------------------------------------------------------------------------------------- in-process


def test_curves_follow_a_resumed_run(tmp_path):
    """Records of the interrupted attempt beyond the restored update are replaced; time continues from there."""
    start = study_logs._seconds("2026-01-01 00:00:00")
    lines = [study_logs.attempt_line(1, start).strip(),
             "2026-01-01 00:00:01 | INFO | fairseq_cli.train | num. shared model params: 1,234 (num. trained: 1,234)",
             log_record("00:10", "train_inner", 2, 9.0), log_record("00:12", "valid", 2, 8.5),
             log_record("00:20", "train_inner", 4, 8.0),  # lost: the checkpoint was at update 2
             study_logs.attempt_line(2, start + 100).strip(),
             log_record("01:50", "train_inner", 3, 8.2), log_record("01:55", "train_inner", 4, 7.9),
             log_record("01:57", "valid", 4, 7.5)]  # fmt: skip
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    curves = study_logs.read_curves(tmp_path / "train.log")
    assert curves["parameters"] == 1234 and curves["attempts"] == 2
    assert curves["train"] == [(2, 10.0, 9.0), (3, 22.0, 8.2), (4, 27.0, 7.9)]
    assert curves["valid"] == [(2, 12.0, 8.5), (4, 29.0, 7.5)]
    assert study_logs.reached(curves["valid"], 8.0) == (4, 29.0)
    assert study_logs.reached(curves["valid"], 7.0) is None


def test_settings_are_chosen_on_valid_loss_and_later_seeds_use_them():
    args = study.parse_args(["--archs", "transformer_preln_e6d6 residual_e6d6", "--seeds", "3 4", "--lrs", "1e-3 5e-4",
                             "--warmups", "100 400", "--max-update", "1000"])  # fmt: skip
    tuning, later = study.grid(args)
    assert len(tuning) == 2 * 2 * 2 and {r.seed for r in tuning} == {3}
    assert [(r.arch, r.seed) for r in later] == [("transformer_preln_e6d6", 4), ("residual_e6d6", 4)]
    losses = {(1e-3, 100): 5.0, (1e-3, 400): 4.0, (5e-4, 100): 4.5, (5e-4, 400): 6.0}
    results = {r: {"valid_loss": losses[(r.lr, r.warmup)] + (r.arch == "residual_e6d6")} for r in tuning}
    choices = study_stats.choose_settings(results, first_seed=3)
    assert {g: (c["lr"], c["warmup"]) for g, c in choices.items()} == {
        ("transformer_preln_e6d6", "warmup"): (1e-3, 400), ("residual_e6d6", "warmup"): (1e-3, 400)}  # fmt: skip
    assert len(choices[("residual_e6d6", "warmup")]["candidates"]) == 4


def test_no_warmup_keeps_the_peak_lr_and_decays_linearly_to_the_budget():
    budget = study_common.Budget(max_update=300)
    run_ = study_common.Run("transformer_preln_e6d6", "nowarmup", 1e-3, 0, 1)
    args = study_common.schedule_args(run_, budget)
    assert args[args.index("--lr-scheduler") + 1] == "polynomial_decay"
    assert args[args.index("--warmup-updates") + 1] == "0" and args[args.index("--total-num-update") + 1] == "300"
    warm = study_common.schedule_args(study_common.Run("transformer_preln_e6d6", "warmup", 1e-3, 400, 1), budget)
    assert warm[warm.index("--lr-scheduler") + 1] == "inverse_sqrt" and "400" in warm



def _row(arch, loss, first, bleu, p=None, reached=0, compared=1):
    return {"arch": arch, "variant": "warmup", "valid_loss": loss, "first_valid_loss": first, "bleu": bleu, "seeds": [1],
            "p_values": p, "reached": reached, "compared": compared, "reach_updates": 100.0 if reached else None}  # fmt: skip


def test_reading_follows_the_numbers():
    rows = [_row("pre", 5.2, 9.0, 20.0),
            _row("post", 7.9, 8.0, 3.3, [{"bleu_p": 0.001, "chrf_p": 0.001, "bleu_diff": -16.7, "bleu_ci": [-18.0, -15.0]}]),
            _row("res", 6.0, 9.5, 15.0, [{"bleu_p": 0.2, "chrf_p": 0.3, "bleu_diff": -5.0, "bleu_ci": [-9.0, 1.0]}])]  # fmt: skip
    text = study_report.reading(rows, "240 updates each")
    assert "post did not train: its valid loss stayed near 7.90 (first validation 8.00)" in text
    # the words of study_claims' rules, and with one seed no "every seed"
    assert "below pre's: the interval of the difference excludes 0 in its one seed (paired bootstrap p <= 0.001" in text
    assert "res reached valid loss 6.00 and 15.0 BLEU, far behind pre" in text and "not shown so (p = 0.200" in text
    assert "every seed" not in text
    assert "with one seed: it shows the early phase" in text and "there is no spread" in text
    flipped = study_report.reading([_row("pre", 6.0, 9.0, 15.0), _row("res", 5.95, 9.0, 16.0, reached=1)], "x")
    assert "within 0.1 in loss of res" in flipped and "res reached valid loss 5.95" in flipped
    assert "reached pre's final valid loss after 100 updates" in flipped


def test_level_needs_every_interval_inside_the_margin():
    """'level' is a statement about the confidence interval, not about a large p-value."""
    narrow = {"bleu_p": 0.6, "chrf_p": 0.5, "bleu_diff": -0.1, "bleu_ci": [-0.4, 0.5], "chrf_ci": [-0.3, 0.3]}
    wide = {"bleu_p": 0.28, "chrf_p": 0.2, "bleu_diff": -0.6, "bleu_ci": [-1.6, 0.4], "chrf_ci": [-1.0, 0.3]}
    base = _row("pre", 5.0, 9.0, 20.0)
    level = study_report.reading([base, _row("kq", 5.02, 9.0, 20.1, [narrow, narrow])], "x", margin=1.0)
    assert "its BLEU is level with pre's (difference +0.10, 95% CI of the difference [-0.40, +0.50], inside ±1 in each of its 2 seeds" in level
    open_ = study_report.reading([base, _row("kq", 5.02, 9.0, 19.4, [narrow, wide])], "x", margin=1.0)
    assert "level with pre's" not in open_ and "not shown so (p = 0.600, 95% CI of the difference [-1.60, +0.50]" in open_
    # seeds on opposite sides are named as such
    up = {**narrow, "bleu_diff": 0.3}
    split = study_report.reading([base, _row("kq", 5.02, 9.0, 19.4, [up, wide])], "x", margin=0.2)
    assert "the seeds disagree on the side of pre's BLEU it lies on" in split
    assert "reaches beyond ±1, so they are not shown level either" in open_
    assert study_stats.within([narrow], 0.5) and not study_stats.within([narrow, wide], 1.0)


def test_difference_interval_comes_from_sacrebleus_own_resamples():
    """The resamples behind the interval are those of sacrebleu's PairedTest: the same means, the same p."""
    import numpy as np
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    refs = [f"a small dog runs on the grass number {i}" for i in range(30)]
    base = [r if i % 3 else "a dog runs" for i, r in enumerate(refs)]
    system = [r if i % 4 else "the cat sleeps on a mat" for i, r in enumerate(refs)]
    tests = study_stats.paired_tests({("warmup", 1): [("base", base), ("sys", system)]}, refs, 200)
    entry = tests[("warmup", 1, "sys")]
    _sig, scores = PairedTest([("base", base), ("sys", system)], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=200)()
    idxs = study_stats._bootstrap_indices(len(refs), 200)
    for index, hyps in enumerate((base, system)):
        mean = study_stats._resampled(BLEU(), hyps, refs, idxs).mean()
        assert np.isclose(mean, scores["BLEU"][index].mean)
    assert entry["bleu_p"] == scores["BLEU"][1].p_value
    assert np.isclose(entry["bleu_diff"], scores["BLEU"][1].score - scores["BLEU"][0].score, atol=1e-3)
    low, high = entry["bleu_ci"]
    assert low <= entry["bleu_diff"] <= high and low < high and entry["chrf_ci"][0] <= entry["chrf_diff"] <= entry["chrf_ci"][1]
    assert study_stats.difference_ci(np.arange(200.0)) == (5.0, 194.0)  # sacrebleu's estimate_ci: the n//40-th from each end


def test_still_falling_and_best_is_last():
    falling = [(100, 0, 6.0), (200, 0, 5.5), (300, 0, 5.2), (400, 0, 5.0)]
    assert study_stats.trend(falling, 3, 0.01) == {"slope": -0.25, "falling": True, "best_is_last": True}
    flat = [(100, 0, 6.0), (200, 0, 5.0), (300, 0, 5.004), (400, 0, 5.002)]
    t = study_stats.trend(flat, 3, 0.01)
    assert t["falling"] is False and t["best_is_last"] is False and abs(t["slope"] - 0.001) < 1e-9
    assert study_stats.trend(falling[:2], 3, 0.01)["falling"] is None  # too few validations to say
    # a run early stopping ended is flat by its rule: a dip at its last validations is noise, not a falling loss
    dip = [(100, 0, 5.0), (200, 0, 5.06), (300, 0, 5.03), (400, 0, 5.0)]
    assert study_stats.trend(dip, 3, 0.01)["falling"] is True
    assert study_stats.trend(dip, 3, 0.01, "patience")["falling"] is False


def test_reading_says_which_runs_early_stopping_ended():
    rows = [_row("pre", 5.2, 9.0, 20.0), _row("res", 5.3, 9.0, 19.0)]
    stopped = {"stopped": "patience", "trend": {"slope": -0.02, "falling": False, "best_is_last": False}}
    capped = {"stopped": "updates", "trend": {"slope": -0.02, "falling": True, "best_is_last": False}}
    both = study_report.reading(rows, "at most 4000 updates each", runs=[stopped, stopped], trend_text="t")
    assert "Early stopping ended every run" in both and "early phase" not in both and "still falling" not in both
    one = study_report.reading(rows, "at most 4000 updates each", runs=[stopped, capped], trend_text="t")
    assert "Early stopping ended 1 of 2 runs (the rest ran to the budget's end)" in one
    assert "still falling at the end in 1 of 2 runs" in one and "those runs stopped short of convergence" in one
    none = study_report.reading(rows, "800 updates each", runs=[capped, capped], trend_text="t")
    assert "early phase of training" in none and "Early stopping" not in none
    assert "every run stopped short of convergence" in none


def test_validation_check_lists_every_run_whose_fresh_validation_differs():
    run = [study_common.Run(arch, "warmup", 1e-3, 400, 1) for arch in ("a", "b", "c")]
    same = {"best_valid_loss": 4.259, "checked_valid_loss": 4.2594}
    stale = {"best_valid_loss": 5.092, "checked_valid_loss": 4.259}  # dynamic HC's stale cache, as found
    assert study_report_common.validation_check([(run[0], {"best_valid_loss": 5.0})]) == []  # no check recorded
    ok = study_report_common.validation_check([(run[0], same), (run[1], {"best_valid_loss": 5.0})])
    assert "for 1 of 2 runs" in ok[0] and "every one within 0.0015 bits" in ok[0]
    bad = "\n".join(study_report_common.validation_check(
        [(run[0], same), (run[1], stale), (run[2], {"best_valid_loss": 5.0, "checked_valid_loss": None})]))
    assert "**2 differ**" in bad and "| b.warmup" in bad and "| 5.092 | 4.259 |" in bad and "| c.warmup" in bad
    assert "| a.warmup" not in bad


def test_every_candidate_is_shown_and_a_choice_on_the_edge_says_which_way_to_widen():
    runs = {study_common.Run("m", "warmup", lr, wu, 1): {"valid_loss": loss + 0.1, "best_valid_loss": loss}
            for (lr, wu), loss in {(5e-4, 100): 6.0, (1e-3, 100): 5.5, (2e-3, 100): 5.0, (5e-4, 400): 6.1,
                                   (1e-3, 400): 5.6, (2e-3, 400): 5.2}.items()}  # fmt: skip
    choice = study_stats.choose_settings(runs, first_seed=1)[("m", "warmup")]
    assert (choice["lr"], choice["warmup"]) == (2e-3, 100) and len(choice["candidates"]) == 6
    assert choice["edges"] == ["the largest learning rate of the grid (0.002): widen LRS upwards",
                               "the smallest warm-up of the grid (100): widen WARMUPS downwards"]  # fmt: skip


def test_early_stopping_follows_fairseqs_rule_across_a_resume(tmp_path):
    """fairseq forgets its patience count when a run resumes; the tool counts over the whole record."""
    import argparse

    from fairseq_cli.train import should_stop_early

    losses = [6.0, 5.0, 5.1, 4.9, 4.95, 5.0, 4.9, 4.8]
    cfg = argparse.Namespace(checkpoint=argparse.Namespace(patience=3, maximize_best_checkpoint_metric=False))
    for attr in ("best", "num_runs"):
        if hasattr(should_stop_early, attr):
            delattr(should_stop_early, attr)
    fairseq_stop = next(i for i, loss in enumerate(losses) if should_stop_early(cfg, loss))
    valid = [(100 * (i + 1), 0.0, loss) for i, loss in enumerate(losses)]
    assert study_logs.early_stop(valid, 3) == valid[fairseq_stop][0] == 700
    assert study_logs.early_stop(valid, 4) is None and study_logs.early_stop(valid, 0) is None
    # a run interrupted after update 700 with no DONE.json: marked done at 700, what came later is dropped
    args = study.parse_args(["--archs", "transformer_preln_e6d6", "--seeds", "1", "--max-update", "1000",
                             "--valid-every", "100", "--patience", "3", "--out-dir", str(tmp_path)])  # fmt: skip
    run_ = study_common.Run("transformer_preln_e6d6", "warmup", 1e-3, 400, 1)
    runner = study.Study(args, tmp_path, {})
    runner.run_dir(run_).mkdir(parents=True)
    start = study_logs._seconds("2026-01-01 00:00:00")
    lines = [study_logs.attempt_line(1, start).strip()]
    lines += [log_record(f"{i:02d}:00", "valid", u, loss) for i, (u, _, loss) in enumerate(valid)]
    lines += [log_record("09:00", "train_inner", 750, 4.0)]
    (runner.run_dir(run_) / "train.log").write_text("\n".join(lines) + "\n")
    assert runner._finished_before(run_)
    done = json.loads((runner.run_dir(run_) / "DONE.json").read_text())
    assert done["updates"] == 700 and done["stopped"] == "patience"
    result = runner.result(run_, evaluated=False)
    assert result["curves"]["valid"][-1][0] == 700 and result["curves"]["train"] == []
    # 4.9 at 400 and again at 700: patience counts 700 as no improvement (`<`), checkpoint_best.pt is re-saved (`<=`)
    assert result["best_valid_loss"] == 4.9 and result["best_valid_update"] == 700
    assert result["updates"] == 700  # the stop is a validation's update, past the last logged training step
    cmd = study_common.train_command(run_, args.setup, args.budget, tmp_path, {"source_lang": "de", "target_lang": "en"},
                                     tmp_path, 100, [], [])  # fmt: skip
    assert cmd[cmd.index("--patience") + 1] == "3" and "at most 1000 updates each, stopped early" in args.budget.describe()
    # fairseq runs in the repository and prints its arguments into the committed train.log: no machine's directories
    assert cmd[cmd.index("--user-dir") + 1] == "fairseq_plugins"


def test_warmdecay_differs_from_nowarmup_only_in_the_warmup():
    """Both decay linearly from the peak to 0 at MAX_UPDATE (fairseq's polynomial_decay); the mean lr is equal."""
    from fairseq.optim import FairseqOptimizer
    from fairseq.optim.lr_scheduler.polynomial_decay_schedule import (
        PolynomialDecayLRSchedule,
        PolynomialDecayLRScheduleConfig,
    )

    class Optimizer(FairseqOptimizer):
        def __init__(self):
            pass

        def set_lr(self, lr):
            self.lr = lr

        def get_lr(self):
            return self.lr

    budget = study_common.Budget(max_update=800)
    means = {}
    for variant, warmup in (("warmdecay", 400), ("nowarmup", 0)):
        args = study_common.schedule_args(study_common.Run("m", variant, 1e-3, warmup, 1), budget)
        assert args[args.index("--lr-scheduler") + 1] == "polynomial_decay"
        assert args[args.index("--warmup-updates") + 1] == str(warmup) and args[args.index("--total-num-update") + 1] == "800"
        cfg = PolynomialDecayLRScheduleConfig(warmup_updates=warmup, power=1.0, end_learning_rate=0.0,
                                              total_num_update=800, lr=[1e-3])  # fmt: skip
        sched = PolynomialDecayLRSchedule(cfg, Optimizer())
        lrs = [sched.step_update(u) for u in range(800)]
        assert max(lrs) == pytest.approx(1e-3)
        means[variant] = sum(lrs) / len(lrs)
    assert means["warmdecay"] == pytest.approx(5e-4, rel=0.01) and means["nowarmup"] == pytest.approx(5e-4, rel=0.01)


# ------------------------------------------------------------------------------------------- end to end


@slow
def test_interrupted_grid_restarts_without_retraining(tmp_path):
    fx.make_multi30k(tmp_path / "raw")
    env = {"MULTI30K_DIR": str(tmp_path / "raw"), "VERIFY_COUNTS": "0", "VOCAB_SIZE": "100", "OUT_DIR": str(tmp_path / "out"),
           "ARCHS": "transformer_preln_e6d6 residual_e6d6", "SEEDS": "1 2", "MAX_UPDATE": "4", "VALID_EVERY": "2",
           "JOBS": "2", "BOOTSTRAP": "20", "MODEL_ARGS": MODEL_ARGS}  # fmt: skip
    runs = tmp_path / "out" / "runs"
    # the hook stops the study like Ctrl-C once a run is done and the next one has made 2 of its 4 updates
    first = recipe("study.sh", {**env, "STUDY_INTERRUPT_AT": "1:2"}, check=False)
    assert first.returncode == 130, first.stdout[-3000:] + first.stderr[-3000:]
    assert "interrupted: run the same command again" in first.stdout
    done = {p.parent.name: p.stat().st_mtime_ns for p in runs.glob("*/DONE.json")}
    hooked = [p.parent for p in runs.glob("*/train.log") if study.INTERRUPTED in p.read_text()]
    assert done and len(hooked) == 1 and hooked[0].name not in done

    second = recipe("study.sh", env)
    assert "from before)" in second.stdout
    for name, mtime in done.items():  # finished runs were skipped: one attempt, the same marker
        assert (runs / name / "DONE.json").stat().st_mtime_ns == mtime
        assert study_logs.read_curves(runs / name / "train.log")["attempts"] == 1
    log = (hooked[0] / "train.log").read_text()
    assert "(epoch 3 @ 2 updates)" in log  # the interrupted run continued from its checkpoint_last.pt
    curves = study_logs.read_curves(hooked[0] / "train.log")
    assert curves["attempts"] == 2 and [u for u, _, _ in curves["train"]] == [1, 2, 3, 4]
    # every attempt records where it ran and from what; the resumed one, the update it continued from
    provenance = json.loads((hooked[0] / "provenance.json").read_text())
    assert [a["attempt"] for a in provenance] == [1, 2]
    assert provenance[0]["resumed_from"] is None and provenance[1]["resumed_from"] == {"checkpoint": "checkpoint_last.pt", "update": 2}
    for attempt in provenance:
        assert attempt["commit"] == study_common.git_commit(REPO) and attempt["machine"]["threads"] >= 1
        assert attempt["machine"]["cpu"] and attempt["machine"]["cores"] >= 1 and "avx512" in attempt["machine"]
        assert set(attempt["versions"]) == {"torch", "fairseq", "sacrebleu", "python"}

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(results["runs"]) == 4 and all(r["updates"] == 4 for r in results["runs"])
    rows = {r["arch"]: r for r in results["models"]}
    assert rows["transformer_preln_e6d6"]["p_values"] is None and rows["transformer_preln_e6d6"]["seeds"] == [1, 2]
    assert len(rows["residual_e6d6"]["p_values"]) == 2 and rows["residual_e6d6"]["bleu_std"] is not None
    assert results["budget_kind"] == "updates" and results["machine"]["cores"] >= 1 and "torch" in results["machine"]
    assert "bash recipes/study.sh" in results["command"] and "ARCHS='transformer_preln_e6d6 residual_e6d6'" in results["command"]
    md = (tmp_path / "out" / "results.md").read_text()
    assert "Command: `" in md and "Machine: " in md and "| residual_e6d6 | warmup |" in md and "## Reading" in md
    for png in ("curves.png", "bleu.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
    assert not list(runs.glob("*/checkpoints/checkpoint_*_*.pt"))  # interval checkpoints go once evaluated
    assert "![learning curves](curves.png)" in md  # relative: a copied or committed study stays readable
    # every comparison with its interval beside its p-value; every run with its still-falling flag
    assert "## Paired comparisons against the first model" in md and "## Runs: was the validation loss still falling" in md
    assert len(results["comparisons"]) == 2 and all(len(c["bleu_ci"]) == 2 for c in results["comparisons"])
    assert all("trend" in r and "best_valid_loss" in r for r in results["runs"])
    # every run's best valid loss recomputed by fairseq-validate in a new process: the same
    assert all(abs(r["checked_valid_loss"] - r["best_valid_loss"]) <= study_report_common.CHECK_TOLERANCE
               for r in results["runs"])  # fmt: skip
    assert "for 4 of 4 runs (eval/valid_check.json): every one within" in md

    # a study's records without checkpoints, data or logs (as committed under docs/study) are reused as they are;
    # a partial grid (the baseline's seed 2 missing) reports what finished, pairing only seeds with a baseline; but
    # records are not reused under another set-up (the run names do not carry the budget). Three copies of the
    # records, three studies side by side (none writes where another reads)
    copy, partial, other_dir = tmp_path / "copy", tmp_path / "partial", tmp_path / "other"
    shutil.copytree(tmp_path / "out", copy, ignore=shutil.ignore_patterns("checkpoints", "data", "data-bin", "logs"))
    # the partial grid keeps the prepared data (only the reuse above needs to prepare it again)
    shutil.copytree(tmp_path / "out", partial, ignore=shutil.ignore_patterns("checkpoints", "data", "logs",
                                                                             "transformer_preln_e6d6.*.s2"))  # fmt: skip
    shutil.copytree(tmp_path / "out", other_dir, ignore=shutil.ignore_patterns("checkpoints", "data", "logs"))
    third, reported, other = recipes_side_by_side(("study.sh", {**env, "OUT_DIR": str(copy)}),
                                                  ("study.sh", {**env, "OUT_DIR": str(partial), "REPORT_ONLY": "1"}),
                                                  ("study.sh", {**env, "OUT_DIR": str(other_dir), "MAX_UPDATE": "5"}),
                                                  check=False)  # fmt: skip
    for proc in (third, reported):
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, mtime in done.items():
        assert study_logs.read_curves(copy / "runs" / name / "train.log")["attempts"] == 1
    again = json.loads((copy / "results.json").read_text())
    assert [r["bleu"] for r in again["runs"]] == [r["bleu"] for r in results["runs"]], third.stdout[-2000:]
    report = json.loads((partial / "results.json").read_text())
    assert report["report_only"] and [m.split(".")[0] for m in report["missing"]] == ["transformer_preln_e6d6"]
    rows = {r["arch"]: r for r in report["models"]}
    assert rows["transformer_preln_e6d6"]["seeds"] == [1] and rows["residual_e6d6"]["seeds"] == [1, 2]
    assert rows["residual_e6d6"]["p_values"][0] is not None and rows["residual_e6d6"]["p_values"][1] is None
    assert report["reading"].startswith("Partial report, 3 of 4 runs")
    assert "**Partial**" in (partial / "results.md").read_text() and not list((partial / "runs").glob("*/checkpoints"))
    assert other.returncode == 1 and "--max-update 4 before, 5 now" in other.stderr, other.stderr[-2000:]
    assert f"OUT_DIR (--out-dir)={other_dir} holds run" in other.stderr


@slow
def test_main_job_end_to_end_on_multi30k_fixtures(tmp_path):
    fx.make_multi30k(tmp_path / "raw")
    env = {"MULTI30K_DIR": str(tmp_path / "raw"), "VERIFY_COUNTS": "0", "OUT_DIR": str(tmp_path / "out"),
           "MAX_UPDATE": "3", "MODEL_ARGS": MODEL_ARGS, "BOOTSTRAP": "20"}  # fmt: skip
    # too many pieces for this corpus: named before any data is prepared, nothing left behind ...
    failed = recipe("main_job.sh", {**env, "VOCAB_SIZE": "5000"}, check=False)
    assert failed.returncode == 1 and "MULTI30K_DIR and VOCAB_SIZE conflict: VOCAB_SIZE=5000" in failed.stderr
    assert not (tmp_path / "out" / "data-bin").exists()
    # ... and the main job, with other settings, starts cleanly in the same output directory
    proc = recipe("main_job.sh", {**env, "VOCAB_SIZE": "100"})
    lines = proc.stdout.splitlines()
    assert len(lines) < 80, proc.stdout
    assert not any("| INFO |" in line or "train_inner" in line for line in lines)  # fairseq logs only in files
    assert "2 model(s) x 1 seed(s): 2 runs of 3 updates each, 2 at a time" in proc.stdout
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["arch"]: r for r in results["models"]}
    assert list(rows) == ["transformer_preln_iwslt_e12d12", "residual_iwslt_e12d12"]
    for r in rows.values():
        assert r["updates"] == 3 and r["parameters"] > 0 and 0 <= r["bleu"] <= 100
    # each model at the lr its grid chose (docs/study/lr_e12d12), named in the report
    assert (rows["transformer_preln_iwslt_e12d12"]["lr"], rows["residual_iwslt_e12d12"]["lr"]) == (8e-3, 4e-3)
    assert "own (ARCH_LRS): transformer_preln_iwslt_e12d12 0.008, residual_iwslt_e12d12 0.004" in (tmp_path / "out" / "results.md").read_text()
    assert "bash recipes/main_job.sh" in results["command"]
    assert f"plots: {tmp_path / 'out' / 'curves.png'}" in proc.stdout and results["reading"] in proc.stdout
    assert "residual_iwslt_e12d12" in results["reading"] and "After 3 updates each" in results["reading"]
    # the reading once, and with one seed no claim about "every seed"
    md = (tmp_path / "out" / "results.md").read_text()
    assert md.count(results["reading"]) == 1 and proc.stdout.count(results["reading"]) == 1
    assert "every seed" not in results["reading"] and "## Claims" in md and "## Provenance" in md
    assert [c["system"] for c in results["claims"] if c["metric"] == "bleu"] == ["residual_iwslt_e12d12"]
    assert results["provenance"]["flags"] == [] and len(results["provenance"]["runs"]) == 2
    assert (tmp_path / "out" / "runs").is_dir() and (tmp_path / "out" / "logs" / "prepare.log").is_file()


def test_main_job_names_the_variable_the_user_set(tmp_path):
    proc = recipe("main_job.sh", {"MULTI30K_DIR": str(tmp_path / "nowhere"), "OUT_DIR": str(tmp_path / "out")},
                  check=False)  # fmt: skip
    assert proc.returncode == 1 and f"MULTI30K_DIR (--raw-dir)={tmp_path / 'nowhere'}: no such directory" in proc.stderr
    assert "RAW_DIR=" not in proc.stderr.replace("MULTI30K_DIR", "") and not (tmp_path / "out").exists()


def test_reported_commands_name_no_place_of_this_machine():
    cmd = ["/opt/venv/bin/python", "-m", "fairseq_cli.train", str(REPO / "docs" / "study" / "x" / "data-bin"), "--user-dir",
           "/elsewhere/checkout/fairseq_plugins", "--arch", "residual_e6d6"]  # fmt: skip
    assert study_common.portable_command(cmd, REPO) == ["python", "-m", "fairseq_cli.train", "docs/study/x/data-bin", "--user-dir",
                                                 "fairseq_plugins", "--arch", "residual_e6d6"]  # fmt: skip
    # a finished run is reused under the same set-up: its stored (portable) command against the one built now,
    # whose path-valued options are absolute; a path that only contains the plugin's name is not the plugin
    now = [*cmd, "--tensorboard-logdir", str(REPO / "work_dirs" / "tb"), "--restore-file", "/data/fairseq_plugins_old/x.pt"]
    stored = study_common.portable_command(now, REPO)
    assert stored[-3:] == ["work_dirs/tb", "--restore-file", "/data/fairseq_plugins_old/x.pt"]
    assert study_common.command_differences(stored, now) == []
    assert study_common.command_differences(stored, [*now[:-1], "/data/other.pt"]) != []


def test_report_lists_every_candidate_each_comparison_and_each_run():
    runs = {study_common.Run("pre", "warmup", lr, 400, 1): {"valid_loss": loss, "best_valid_loss": loss - 0.01}
            for lr, loss in ((5e-4, 6.0), (1e-3, 5.5), (2e-3, 5.2))}  # fmt: skip
    choices = study_stats.choose_settings(runs, first_seed=1)
    row = {**_row("pre", 5.2, 9.0, 20.0), "lr": 2e-3, "warmup": 400, "tuned": True, "parameters": 10, "chrf": 40.0,
           "bleu_std": None, "chrf_std": None, "valid_loss_std": None, "updates": 800, "train_seconds": 60.0,
           "train_seconds_std": None, "still_falling": 1, "best_is_last": 1, "reach_seconds": 60.0}  # fmt: skip
    chosen = study_common.Run("pre", "warmup", 2e-3, 400, 1)
    result = {"updates": 800, "stopped": "updates", "best_valid_loss": 5.19, "best_valid_update": 700, "valid_loss": 5.2,
              "trend": {"slope": -0.02, "falling": True, "best_is_last": False}}  # fmt: skip
    comparison = {"key": ["warmup", 2], "system": "res", "bleu_p": 0.3, "chrf_p": 0.2, "bleu_diff": 0.1,
                  "bleu_ci": [-0.4, 0.6], "chrf_diff": -0.2, "chrf_ci": [-0.9, 0.5]}  # fmt: skip
    context = {"archs": ["pre", "res"], "command": "c", "machine_text": "m", "started": "s", "total_minutes": 1.0,
               "data_text": "d", "budget_text": "b", "jobs": 1, "threads": 1, "setup_text": "x", "test_set": "t",
               "sentences": 3, "beam": 5, "bootstrap": 20, "signature": "sig", "margin": 1.0, "falling_last": 3,
               "falling_slope": 0.01, "curves_png": "curves.png", "bleu_png": "bleu.png", "comparisons": [comparison],
               "runs": [(chosen, result)], "reading": "r"}  # fmt: skip
    md = study_report.markdown([row], choices, context)
    assert "| 0.0005 | 400 | 6.000 | 5.990 |  |" in md and "| 0.002 | 400 | 5.200 | 5.190 | yes |" in md
    assert "**Edge of the grid**: the choice is the largest learning rate of the grid (0.002): widen LRS upwards." in md
    assert "| res (warmup) | 2 | +0.10 | [-0.40, +0.60] | 0.300 | -0.20 | [-0.90, +0.50] | 0.200 | yes |" in md
    assert f"| {chosen.name} | 800 | updates | 5.190 (700) | 5.200 | -0.020 | yes | no |" in md


def test_the_heading_times_the_runs_not_only_the_command_that_reported_them():
    # lanes trained the runs one at a time; the report was written by REPORT_ONLY, which trained nothing itself
    runs = [(None, {"seconds": 3600.0}), (None, {"seconds": 1800.0})]
    attempts = {"a": [{"started": "2026-11-30 10:57 UTC"}, {"started": "2026-11-30 11:26 UTC"}],
                "b": [{"started": "2026-11-30 09:26 UTC"}]}  # fmt: skip
    context = {"runs": runs, "provenance": {"runs": attempts}, "started": "2026-11-30 20:54 UTC", "total_minutes": 0.0,
               "rewritten": "2026-11-30 20:54 UTC"}  # fmt: skip
    assert study_report_common.timing_text(context) == (
        "2 scored runs trained 90.0 min in all (each run's train time, summed), the earliest recorded start 2026-11-30 09:26 UTC. "
        "Report rewritten 2026-11-30 20:54 UTC without training (REPORT_ONLY).")  # fmt: skip
    trained = {**context, "provenance": None, "rewritten": None, "total_minutes": 91.5}
    assert study_report_common.timing_text(trained) == (
        "2 scored runs trained 90.0 min in all (each run's train time, summed); this command started 2026-11-30 20:54 UTC "
        "and took 91.5 min.")  # fmt: skip


def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    from scripts.study import study_run

    monkeypatch.setattr(study_run.time, "sleep", lambda seconds: None)
    args = study.parse_args(["--archs", "transformer_preln_e6d6 residual_e6d6", "--seeds", "1 2", "--max-update", "4",
                             "--lrs", "1e-3 2e-3", "--out-dir", str(tmp_path)])  # fmt: skip
    tuning, later = study.grid(args)
    runner = study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})
    # one of residual's two tuning runs is killed (as by the out-of-memory killer) while the other trains on;
    # Pre-LN chooses 2e-3 (the lower loss) and its seed-2 run there trains, but its evaluation fails
    train_fails, eval_fails = {("residual_e6d6", 2e-3, 1)}, {("transformer_preln_e6d6", 2e-3, 2)}

    def train(run):
        log = runner.run_dir(run) / "train.log"
        loss = 5.5 - 1000 * run.lr
        start = study_logs._seconds("2026-01-01 00:00:00")
        text = "\n".join([study_logs.attempt_line(1, start).strip(), log_record("00:01", "train_inner", 4, 6.0),
                          log_record("00:02", "valid", 4, loss), "| done training in 1 s"]) + "\n"  # fmt: skip
        return Finished(log, -9 if (run.arch, run.lr, run.seed) in train_fails else 0, {log: text})

    def evaluate(run):
        results = runner.run_dir(run) / "eval" / "results.json"
        failed = (run.arch, run.lr, run.seed) in eval_fails
        return Finished(runner.run_dir(run) / "eval.log", 1 if failed else 0, {} if failed else {results: "{}"})

    monkeypatch.setattr(runner, "_train", train)
    monkeypatch.setattr(runner, "_evaluate", evaluate)
    finished = runner.execute(tuning, later)
    assert sorted((r.arch, r.lr, r.seed) for r in finished) == [
        ("residual_e6d6", 1e-3, 1), ("transformer_preln_e6d6", 1e-3, 1), ("transformer_preln_e6d6", 2e-3, 1)]
    assert sorted((r.arch, r.lr, r.seed) for r in runner.failed) == [
        ("residual_e6d6", 2e-3, 1), ("transformer_preln_e6d6", 2e-3, 2)]
    # residual's seed 2 waits for its tuning runs, one of which failed: never started, and named
    assert [(r.arch, r.seed) for r in runner.blocked] == [("residual_e6d6", 2)]
    assert not any(p.name.startswith("residual_e6d6") and p.name.endswith(".s2") for p in (tmp_path / "runs").iterdir())
    out = capsys.readouterr().out
    assert "training residual_e6d6.warmup.lr0.002.wu400.s1 failed (killed by SIGKILL" in out and "the other runs go on" in out
    assert "evaluation of transformer_preln_e6d6.warmup.lr0.002.wu400.s2 failed (exit 1)" in out
    done, missing = runner.finished_runs(tuning, later)
    assert len(done) == 3 and len(missing) == 3



def test_a_later_seed_waiting_for_its_choice_is_named_as_such():
    """REPORT_ONLY lists the runs not finished; a later seed whose first seed has not chosen its setting yet is a
    placeholder with lr 0, and its name (lr0.wu0) would be one no run ever has."""
    chosen = study_common.Run("residual_e6d6", "warmup", 4e-3, 400, 2)
    waiting = study_common.Run("residual_e6d6", "warmup", 0, 0, 2)
    assert chosen.label == chosen.name == "residual_e6d6.warmup.lr0.004.wu400.s2"
    assert waiting.label == "residual_e6d6.warmup.s2 (at its first seed's choice)"


def test_provenance_commit_is_dirty_for_code_changes_not_for_the_studys_own_reports(tmp_path):
    # the study tool rewrites results.json/results.md/plots in its folder as runs finish; only other tracked
    # changes (code, recipes) make a run's recorded commit "+dirty"
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    study_dir = tmp_path / "docs" / "study" / "s"
    study_dir.mkdir(parents=True)
    (study_dir / "results.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    head = study_common.git_commit(tmp_path)
    assert len(head) == 40
    (study_dir / "results.json").write_text('{"runs": []}')
    assert study_common.git_commit(tmp_path, study_dir) == head
    assert study_common.git_commit(tmp_path) == head + "+dirty"
    assert study_common.git_commit(tmp_path, tmp_path.parent / "elsewhere") == head + "+dirty"
    (tmp_path / "code.py").write_text("x = 2\n")
    assert study_common.git_commit(tmp_path, study_dir) == head + "+dirty"
