"""The study tool (scripts/study/, recipes/study.sh) and the main job built on it (recipes/main_job.sh).

In-process: learning curves from fairseq's JSON logs (also across a resume), the lr/warm-up choice on valid
loss, the grid, the schedules of the variants, option errors naming the variable, the reading's wording.
End to end on the Multi30k fixtures with tiny models: a 2-architecture x 2-seed grid interrupted (test hook
STUDY_INTERRUPT_AT) and restarted finishes without retraining what was done and continues the interrupted run
from its checkpoint; its records alone (no checkpoints or data, as committed) are reused, under its set-up only; the main job prints a compact console, a table, a plot path and a reading.
"""

import json
import logging
import os
import shutil
import sys

import pytest

from . import recipe_fixtures as fx
from .helpers import REPO, TINY, run

sys.path[:0] = [str(REPO / "scripts" / "study")]

import study
import study_checks
import study_common
import study_lm
import study_report
import study_report_common
import study_stats

slow = pytest.mark.skipif(os.environ.get("RECIPE_TESTS") == "fast", reason="slow recipe test (RECIPE_TESTS=fast)")
# the fixtures' dev/test sets are smaller than fairseq's default batch multiple (8): keep every sentence
MODEL_ARGS = " ".join([*TINY, "--required-batch-size-multiple", "1"])


def recipe(name: str, env: dict, check: bool = True):
    return run(["bash", REPO / "recipes" / name], env={"RECIPE_PYTHON": sys.executable, **env}, check=check, timeout=900)


# ------------------------------------------------------------------------------------------- in-process


def _record(stamp: str, kind: str, updates: int, loss: float) -> str:
    key = {"train_inner": ("num_updates", "loss"), "valid": ("valid_num_updates", "valid_loss")}[kind]
    return f"2026-01-01 00:{stamp} | INFO | {kind} | " + json.dumps({key[0]: str(updates), key[1]: str(loss)})


def test_curves_follow_a_resumed_run(tmp_path):
    """Records of the interrupted attempt beyond the restored update are replaced; time continues from there."""
    start = study_common._seconds("2026-01-01 00:00:00")
    lines = [study_common.attempt_line(1, start).strip(),
             "2026-01-01 00:00:01 | INFO | fairseq_cli.train | num. shared model params: 1,234 (num. trained: 1,234)",
             _record("00:10", "train_inner", 2, 9.0), _record("00:12", "valid", 2, 8.5),
             _record("00:20", "train_inner", 4, 8.0),  # lost: the checkpoint was at update 2
             study_common.attempt_line(2, start + 100).strip(),
             _record("01:50", "train_inner", 3, 8.2), _record("01:55", "train_inner", 4, 7.9),
             _record("01:57", "valid", 4, 7.5)]  # fmt: skip
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    curves = study_common.read_curves(tmp_path / "train.log")
    assert curves["parameters"] == 1234 and curves["attempts"] == 2
    assert curves["train"] == [(2, 10.0, 9.0), (3, 22.0, 8.2), (4, 27.0, 7.9)]
    assert curves["valid"] == [(2, 12.0, 8.5), (4, 29.0, 7.5)]
    assert study_common.reached(curves["valid"], 8.0) == (4, 29.0)
    assert study_common.reached(curves["valid"], 7.0) is None


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


@pytest.mark.parametrize("argv, message", [
    (["--archs", ""], "ARCHS (--archs) is empty"),
    (["--archs", "residual_e6d6 residual_e6d6"], "ARCHS (--archs)='residual_e6d6 residual_e6d6': an architecture appears twice"),
    (["--seeds", "one"], "SEEDS (--seeds)='one': expected integers"),
    (["--variants", "cold"], "VARIANTS (--variants)='cold': allowed warmup, nowarmup"),
    (["--max-update", "0"], "MAX_UPDATE (--max-update)=0: must be > 0"),
    (["--train-minutes", "5", "--variants", "nowarmup"], "VARIANTS=nowarmup"),
    (["--lrs", "2"], "LRS (--lrs)='2'"),
    (["--warmups", "0"], "WARMUPS (--warmups)='0'"),
    (["--jobs", "-1"], "JOBS (--jobs)=-1"),
    (["--raw-dir", "/nowhere/multi30k"], "MULTI30K_DIR (--raw-dir)=/nowhere/multi30k: no such directory"),
])  # fmt: skip
def test_bad_settings_name_the_variable(argv, message):
    with pytest.raises(study_common.RecipeError, match=None) as err:
        study.parse_args(argv)
    assert message in str(err.value)


def _row(arch, loss, first, bleu, p=None, reached=0, compared=1):
    return {"arch": arch, "variant": "warmup", "valid_loss": loss, "first_valid_loss": first, "bleu": bleu, "seeds": [1],
            "p_values": p, "reached": reached, "compared": compared, "reach_updates": 100.0 if reached else None}  # fmt: skip


def test_reading_follows_the_numbers():
    rows = [_row("pre", 5.2, 9.0, 20.0), _row("post", 7.9, 8.0, 3.3, [{"bleu_p": 0.001, "chrf_p": 0.001}]),
            _row("res", 6.0, 9.5, 15.0, [{"bleu_p": 0.2, "chrf_p": 0.3}], reached=0)]  # fmt: skip
    text = study_report.reading(rows, "240 updates each")
    assert "post did not train: its valid loss stayed near 7.90 (first validation 8.00)" in text
    assert "below pre's significantly" in text
    assert "res reached valid loss 6.00 and 15.0 BLEU, far behind pre" in text and "not significantly (p = 0.200)" in text
    assert "one seed there is no spread" in text
    flipped = study_report.reading([_row("pre", 6.0, 9.0, 15.0), _row("res", 5.95, 9.0, 16.0, reached=1)], "x")
    assert "within 0.1 in loss of res" in flipped and "res reached valid loss 5.95" in flipped
    assert "reached pre's final valid loss after 100 updates" in flipped


def test_level_needs_every_interval_inside_the_margin():
    """'level' is a statement about the confidence interval, not about a large p-value."""
    narrow = {"bleu_p": 0.6, "chrf_p": 0.5, "bleu_ci": [-0.4, 0.5], "chrf_ci": [-0.3, 0.3]}
    wide = {"bleu_p": 0.28, "chrf_p": 0.2, "bleu_ci": [-1.6, 0.4], "chrf_ci": [-1.0, 0.3]}
    base = _row("pre", 5.0, 9.0, 20.0)
    level = study_report.reading([base, _row("kq", 5.02, 9.0, 20.1, [narrow, narrow])], "x", margin=1.0)
    assert "its BLEU is level with pre's (difference +0.10, 95% CI of the difference [-0.40, +0.50], inside ±1" in level
    open_ = study_report.reading([base, _row("kq", 5.02, 9.0, 19.4, [narrow, wide])], "x", margin=1.0)
    assert "level with pre's" not in open_ and "not significantly (p = 0.600, 95% CI of the difference [-1.60, +0.50]" in open_
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
    assert study_common.early_stop(valid, 3) == valid[fairseq_stop][0] == 700
    assert study_common.early_stop(valid, 4) is None and study_common.early_stop(valid, 0) is None
    # a run interrupted after update 700 with no DONE.json: marked done at 700, what came later is dropped
    args = study.parse_args(["--archs", "transformer_preln_e6d6", "--seeds", "1", "--max-update", "1000",
                             "--valid-every", "100", "--patience", "3", "--out-dir", str(tmp_path)])  # fmt: skip
    run_ = study_common.Run("transformer_preln_e6d6", "warmup", 1e-3, 400, 1)
    runner = study.Study(args, tmp_path, {})
    runner.run_dir(run_).mkdir(parents=True)
    start = study_common._seconds("2026-01-01 00:00:00")
    lines = [study_common.attempt_line(1, start).strip()]
    lines += [_record(f"{i:02d}:00", "valid", u, loss) for i, (u, _, loss) in enumerate(valid)]
    lines += [_record("09:00", "train_inner", 750, 4.0)]
    (runner.run_dir(run_) / "train.log").write_text("\n".join(lines) + "\n")
    assert runner._finished_before(run_)
    done = json.loads((runner.run_dir(run_) / "DONE.json").read_text())
    assert done["updates"] == 700 and done["stopped"] == "patience"
    result = runner.result(run_, evaluated=False)
    assert result["curves"]["valid"][-1][0] == 700 and result["curves"]["train"] == []
    assert result["best_valid_loss"] == 4.9 and result["best_valid_update"] == 400
    cmd = study_common.train_command(run_, args.setup, args.budget, tmp_path, {"source_lang": "de", "target_lang": "en"},
                                     tmp_path, 100, [], [])  # fmt: skip
    assert cmd[cmd.index("--patience") + 1] == "3" and "at most 1000 updates each, stopped early" in args.budget.describe()


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


@pytest.mark.parametrize("argv, message", [
    (["--max-update", "100", "--valid-every", "200"], "VALID_EVERY=200 is larger than MAX_UPDATE=100"),
    (["--max-update", "800", "--valid-every", "100", "--patience", "8"], "PATIENCE=8 with MAX_UPDATE=800 and VALID_EVERY=100: only 8"),
    (["--train-minutes", "5", "--jobs", "64", "--threads", "2"], "TRAIN_MINUTES=5 with JOBS=64 x THREADS=2"),
    (["--seeds", "1", "--lrs", "1e-3 2e-3"], "LRS/WARMUPS offer 2 settings with SEEDS='1'"),
    (["--variants", "nowarmup", "--warmups", "100"], "WARMUPS='100' with VARIANTS='nowarmup'"),
    (["--max-update", "300", "--warmups", "400"], "WARMUPS=400 with MAX_UPDATE=300"),
    (["--data-bin", "/", "--vocab-size", "4000"], "DATA_BIN and VOCAB_SIZE are both set"),
    (["--level-margin", "0"], "LEVEL_MARGIN (--level-margin)=0"),
    (["--variants", "nowarmup", "--arch-lrs", "residual_iwslt_e12d12=1e-3@100"], "ARCH_LRS='residual_iwslt_e12d12=1e-3@100' gives warm-ups with VARIANTS='nowarmup'"),
    (["--max-update", "300", "--arch-lrs", "residual_iwslt_e12d12=1e-3@300"], "ARCH_LRS gives residual_iwslt_e12d12 warm-up 300 with MAX_UPDATE=300"),
    (["--seeds", "1", "--lrs", "1e-3 2e-3", "--arch-lrs", "residual_iwslt_e12d12=1e-3"], "LRS/WARMUPS offer 2 settings with SEEDS='1'"),
])  # fmt: skip
def test_conflicting_settings_name_both_variables(argv, message):
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args(argv)
    assert message in str(err.value)


def test_vocabulary_too_large_for_the_training_lines_names_both_and_the_limit(tmp_path):
    import sentencepiece as spm

    fx.make_multi30k(tmp_path / "raw")
    args = study.parse_args(["--raw-dir", str(tmp_path / "raw"), "--train-lines", "20", "--out-dir", str(tmp_path / "out")])
    with pytest.raises(study_common.RecipeError) as err:
        study_checks.check_vocabulary(args)
    limit = int(str(err.value).split("allow at most ")[1].split()[0])
    assert "TRAIN_LINES and VOCAB_SIZE conflict: VOCAB_SIZE=8000" in str(err.value) and f"set VOCAB_SIZE <= {limit}" in str(err.value)
    files = [tmp_path / "raw" / f"train.{lang}.gz" for lang in ("de", "en")]
    text = [line for f in files for line in study_common.read_lines(f)[:20]]
    (tmp_path / "lines").write_text("\n".join(text) + "\n")
    for size, works in ((limit, True), (limit + 1, False)):  # the limit is SentencePiece's own, exactly
        try:
            spm.SentencePieceTrainer.train(input=str(tmp_path / "lines"), model_prefix=str(tmp_path / "m"), vocab_size=size,
                                           character_coverage=1.0, model_type="unigram", minloglevel=2, bos_id=-1,
                                           eos_id=-1, unk_id=0, pad_id=-1)  # fmt: skip
            assert works
        except RuntimeError:
            assert not works
    study_checks.check_vocabulary(study.parse_args(["--raw-dir", str(tmp_path / "raw"), "--train-lines", "20",
                                                    "--vocab-size", str(limit), "--out-dir", str(tmp_path / "out")]))  # fmt: skip


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
        assert study_common.read_curves(runs / name / "train.log")["attempts"] == 1
    log = (hooked[0] / "train.log").read_text()
    assert "(epoch 3 @ 2 updates)" in log  # the interrupted run continued from its checkpoint_last.pt
    curves = study_common.read_curves(hooked[0] / "train.log")
    assert curves["attempts"] == 2 and [u for u, _, _ in curves["train"]] == [1, 2, 3, 4]

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

    # a study's records without checkpoints, data or logs (as committed under docs/study) are reused as they are
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "out", copy, ignore=shutil.ignore_patterns("checkpoints", "data", "data-bin", "logs"))
    third = recipe("study.sh", {**env, "OUT_DIR": str(copy)})
    for name, mtime in done.items():
        assert study_common.read_curves(copy / "runs" / name / "train.log")["attempts"] == 1
    again = json.loads((copy / "results.json").read_text())
    assert [r["bleu"] for r in again["runs"]] == [r["bleu"] for r in results["runs"]], third.stdout[-2000:]
    # a partial grid (the baseline's seed 2 missing) reports what finished, pairing only seeds with a baseline
    partial = tmp_path / "partial"
    shutil.copytree(copy, partial, ignore=shutil.ignore_patterns("transformer_preln_e6d6.*.s2", "data", "data-bin"))
    recipe("study.sh", {**env, "OUT_DIR": str(partial), "REPORT_ONLY": "1"})
    report = json.loads((partial / "results.json").read_text())
    assert report["report_only"] and [m.split(".")[0] for m in report["missing"]] == ["transformer_preln_e6d6"]
    rows = {r["arch"]: r for r in report["models"]}
    assert rows["transformer_preln_e6d6"]["seeds"] == [1] and rows["residual_e6d6"]["seeds"] == [1, 2]
    assert rows["residual_e6d6"]["p_values"][0] is not None and rows["residual_e6d6"]["p_values"][1] is None
    assert report["reading"].startswith("Partial report, 3 of 4 runs")
    assert "**Partial**" in (partial / "results.md").read_text() and not list((partial / "runs").glob("*/checkpoints"))
    # ... but not under another set-up: the run names do not carry the budget
    other = recipe("study.sh", {**env, "OUT_DIR": str(copy), "MAX_UPDATE": "5"}, check=False)
    assert other.returncode == 1 and "--max-update 4 before, 5 now" in other.stderr, other.stderr[-2000:]
    assert f"OUT_DIR (--out-dir)={copy} holds run" in other.stderr


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


def test_report_lists_every_candidate_each_comparison_and_each_run():
    runs = {study_common.Run("pre", "warmup", lr, 400, 1): {"valid_loss": loss, "best_valid_loss": loss - 0.01}
            for lr, loss in ((5e-4, 6.0), (1e-3, 5.5), (2e-3, 5.2))}  # fmt: skip
    choices = study_stats.choose_settings(runs, first_seed=1)
    row = {**_row("pre", 5.2, 9.0, 20.0), "lr": 2e-3, "warmup": 400, "tuned": True, "parameters": 10, "chrf": 40.0,
           "bleu_std": None, "chrf_std": None, "valid_loss_std": None, "updates": 800, "train_seconds": 60.0,
           "train_seconds_std": None, "still_falling": 1, "best_is_last": 1, "reach_seconds": 60.0}  # fmt: skip
    chosen = study_common.Run("pre", "warmup", 2e-3, 400, 1)
    result = {"updates": 800, "stopped": "patience", "best_valid_loss": 5.19, "best_valid_update": 700, "valid_loss": 5.2,
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
    assert f"| {chosen.name} | 800 | patience | 5.190 (700) | 5.200 | -0.020 | yes | no |" in md


# ------------------------------------------------------------------------------------- language models


LM_MODEL_ARGS = ("--decoder-embed-dim 16 --decoder-ffn-embed-dim 32 --decoder-attention-heads 2 --decoder-layers 3 "
                 "--tokens-per-sample 64 --max-tokens 256 --required-batch-size-multiple 1")  # fmt: skip


def _lm_data_bin(path):
    path.mkdir(parents=True)
    (path / "recipe.json").write_text(json.dumps({"dataset": "lm_x", "task": "language_modeling"}))
    return path


@pytest.mark.parametrize("argv, message", [
    (["--task", "language_modeling", "--archs", "dca_lm_d6 residual_e6d6"],
     "ARCHS (--archs): residual_e6d6 is a translation architecture, but the dataset is a language-modeling corpus"),
    (["--archs", "transformer_preln_e6d6 dca_lm_d6 transformer_lm"],
     ("ARCHS (--archs): dca_lm_d6, transformer_lm are language models, but the dataset is a translation dataset: "
      "for a language-model study set LM=1")),
    (["--task", "lm"], "TASK (--task)='lm': allowed translation, language_modeling"),
    (["--task", "language_modeling", "--train-lines", "20"], "TRAIN_LINES with a language-modeling study"),
])  # fmt: skip
def test_lm_and_translation_architectures_are_refused_for_the_other_task(argv, message):
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args(argv)
    assert message in str(err.value)


def test_an_lm_data_bin_makes_an_lm_study_and_contradicting_it_is_refused(tmp_path):
    data = _lm_data_bin(tmp_path / "lm")
    args = study.parse_args(["--data-bin", str(data)])
    assert args.task == "language_modeling" and args.arch_list == study_lm.ARCHS.split()
    assert args.setup == study_lm.LMSetup() and args.lr_list == [1.6e-3] and args.model_args == study_lm.MODEL_ARGS
    with pytest.raises(study_common.RecipeError, match=r"TASK \(--task\)=translation but DATA_BIN=.* is a language_modeling"):
        study.parse_args(["--data-bin", str(data), "--task", "translation"])
    with pytest.raises(study_common.RecipeError, match="residual_e6d6 is a translation architecture"):
        study.parse_args(["--data-bin", str(data), "--archs", "residual_e6d6"])
    # the translation defaults stay as they were
    plain = study.parse_args([])
    assert plain.task == "translation" and plain.setup == study_common.Setup() and plain.model_args == study.WIDTH_128


def test_translation_recipe_refuses_a_language_model():
    sys.path.insert(0, str(REPO / "scripts" / "training"))
    import train_options

    with pytest.raises(study_common.RecipeError) as err:
        train_options.check_architecture("dca_lm_d6")
    assert "'dca_lm_d6' (ARCH) is a decoder-only language model" in str(err.value)
    assert "recipes/train_lm.sh" in str(err.value) and "LM=1 bash recipes/study.sh" in str(err.value)
    assert train_options.check_architecture("residual_e6d6")


def test_lm_command_trains_packed_blocks_with_the_dca_cpu_optimizer(tmp_path):
    budget = study_common.Budget(max_update=100)
    cmd = study_lm.train_command(study_common.Run("dca_lm_d6", "warmup", 1.6e-3, 400, 3), study_lm.LMSetup(), budget,
                                 tmp_path, tmp_path / "ckpt", 10, [], [])  # fmt: skip
    value = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
    assert value["--task"] == "language_modeling" and value["--sample-break-mode"] == "none"
    assert value["--tokens-per-sample"] == "128" and value["--max-tokens"] == "2048" and value["--weight-decay"] == "0.1"
    assert value["--criterion"] == "cross_entropy" and "--share-decoder-input-output-embed" in cmd
    assert "--label-smoothing" not in cmd and "--source-lang" not in cmd and value["--seed"] == "3"
    sg = study_lm.train_command(study_common.Run("crossformer_sg_lm_d6", "warmup", 1e-3, 400, 1), study_lm.LMSetup(),
                                budget, tmp_path, tmp_path, 10, [], [])  # fmt: skip
    assert study_common.GUIDANCE_CRITERION in sg and sg[sg.index("--label-smoothing") + 1] == "0.0"


def test_lm_paired_bootstrap_on_sentence_log_likelihoods():
    import numpy as np
    from sacrebleu.significance import _compute_p_value

    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 20, size=40)
    base = -tokens * rng.uniform(2.0, 3.0, size=40)
    better = base + tokens * rng.normal(0.3, 0.2, size=40)  # ~0.3 nats per token more likely
    ids = list(range(40))
    systems = [("a", (ids, base.tolist(), tokens.tolist())), ("b", (ids, better.tolist(), tokens.tolist())),
               ("a2", (ids, base.tolist(), tokens.tolist()))]  # fmt: skip
    out = study_lm.paired_tests({("warmup", 1): systems}, 200)
    b, same = out[("warmup", 1, "b")], out[("warmup", 1, "a2")]
    # a direct re-implementation: sacrebleu's resamples, corpus perplexity per resample, its p-value convention
    idxs = study_stats._bootstrap_indices(40, 200)
    ppl = lambda lp: np.exp(-lp[idxs].sum(1) / tokens[idxs].sum(1))
    diffs = ppl(better) - ppl(base)
    real = np.exp(-better.sum() / tokens.sum()) - np.exp(-base.sum() / tokens.sum())
    assert b["ppl_diff"] == pytest.approx(real, abs=1e-4) and real < 0
    assert b["ppl_ci"] == pytest.approx(list(study_stats.difference_ci(diffs)), abs=1e-4) and b["ppl_ci"][1] < 0
    assert b["ppl_p"] == pytest.approx(_compute_p_value(np.abs(diffs) - np.abs(diffs).mean(), abs(real)))
    assert b["ppl_p"] < 0.05 and b["ll_diff"] == pytest.approx((better.sum() - base.sum()) / tokens.sum(), abs=1e-5)
    assert b["ll_ci"][0] > 0 and not study_stats.within([b], 0.01, "ppl")
    assert same["ppl_diff"] == 0 and same["ppl_ci"] == [0, 0] and study_stats.within([same], 0.01, "ppl")
    with pytest.raises(study_common.RecipeError, match="different test sentences"):
        study_lm.paired_tests({("warmup", 1): [systems[0], ("c", (ids[1:], base[1:].tolist(), tokens[1:].tolist()))]}, 20)


def _lm_multi30k(root):
    """One Multi30k side with enough distinct words for 100 SentencePiece pieces (the shared fixture has 16)."""
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    for split, n in (("train", 300), ("val", 20), ("test_2016_flickr", 24)):
        fx.write_gz(root / f"{split}.en.gz", [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) for _ in range(n)])
    return root


@slow
def test_lm_study_end_to_end_with_perplexity_paired_test_and_resume(tmp_path):
    env = {"LM": "1", "MULTI30K_DIR": str(_lm_multi30k(tmp_path / "raw")), "VERIFY_COUNTS": "0", "VOCAB_SIZE": "100",
           "OUT_DIR": str(tmp_path / "out"), "ARCHS": "transformer_preln_lm_d6 dca_lm_d6", "SEEDS": "1 2",
           "MAX_UPDATE": "4", "VALID_EVERY": "2", "JOBS": "2", "BOOTSTRAP": "20", "MODEL_ARGS": LM_MODEL_ARGS}  # fmt: skip
    runs = tmp_path / "out" / "runs"
    first = recipe("study.sh", {**env, "STUDY_INTERRUPT_AT": "1:2"}, check=False)
    assert first.returncode == 130, first.stdout[-3000:] + first.stderr[-3000:]
    done = {p.parent.name: p.stat().st_mtime_ns for p in runs.glob("*/DONE.json")}
    hooked = [p.parent for p in runs.glob("*/train.log") if study.INTERRUPTED in p.read_text()]
    assert done and len(hooked) == 1 and hooked[0].name not in done
    second = recipe("study.sh", env)
    assert "from before)" in second.stdout and "valid ppl" in second.stdout
    for name, mtime in done.items():
        assert (runs / name / "DONE.json").stat().st_mtime_ns == mtime
    curves = study_common.read_curves(hooked[0] / "train.log")
    assert curves["attempts"] == 2 and [u for u, _, _ in curves["train"]] == [1, 2, 3, 4]
    command = json.loads((hooked[0] / "command.json").read_text())["command"]
    assert "language_modeling" in command and "--sample-break-mode" in command
    # stored without this machine's places (the interpreter, the plugin), and still reused on resume above
    assert command[0] == "python" and command[command.index("--user-dir") + 1] == "fairseq_plugins"

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["task"] == "language_modeling" and len(results["runs"]) == 4
    rows = {r["arch"]: r for r in results["models"]}
    assert rows["transformer_preln_lm_d6"]["p_values"] is None and len(rows["dca_lm_d6"]["p_values"]) == 2
    for run_ in results["runs"]:  # the perplexity is exp of the mean negative log-likelihood per token, every sentence
        ev = json.loads((runs / run_["name"] / "eval" / "results.json").read_text())["splits"]["test"]
        assert ev["sentences"] == ev["total"] == 24 and run_["skipped"] == {"valid": 0, "test": 0}
        assert run_["test_ppl"] == pytest.approx(2.718281828459045 ** (-sum(ev["log_probs"]) / sum(ev["token_counts"])))
        assert 1 < run_["valid_ppl"] < 200 and run_["updates"] == 4
    assert len(results["comparisons"]) == 2 and all(len(c["ppl_ci"]) == 2 and 0 < c["ppl_p"] <= 1 for c in results["comparisons"])
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| valid ppl | test ppl |" in md and "| dca_lm_d6 | warmup | 0.0016 | 400 | 2 |" in md
    assert "## Paired comparisons against the first model" in md and "| dca_lm_d6 (warmup) | 2 |" in md
    assert "BLEU" not in md and (tmp_path / "out" / "perplexity.png").stat().st_size > 1000
    assert results["reading"].startswith("After 4 updates each: transformer_preln_lm_d6")
    # the report alone, again, from the records (REPORT_ONLY), is the same
    recipe("study.sh", {**env, "REPORT_ONLY": "1"})
    again = json.loads((tmp_path / "out" / "results.json").read_text())
    assert again["models"] == results["models"] and again["comparisons"] == results["comparisons"]


def test_lm_study_names_vocabulary_and_unknown_architecture_conflicts(tmp_path):
    raw = fx.make_multi30k(tmp_path / "raw")  # 16 distinct words: fewer than 100 pieces on one side
    argv = ["--task", "language_modeling", "--raw-dir", str(raw), "--no-verify-counts", "--vocab-size", "100",
            "--out-dir", str(tmp_path / "out")]  # fmt: skip
    try:  # study.main silences fairseq's logging below errors for its console: restored for the other tests
        with pytest.raises(study_common.RecipeError) as err:
            study.main(argv)
        with pytest.raises(study_common.RecipeError, match=r"unknown architecture\(s\) nothing_lm_d6; .*dca_lm_\*.*e\.g\. dca_lm_d6"):
            study.main([*argv, "--archs", "nothing_lm_d6"])
    finally:
        logging.disable(logging.NOTSET)
    assert "MULTI30K_DIR and VOCAB_SIZE conflict: VOCAB_SIZE=100 SentencePiece pieces, but the en side" in str(err.value)
    assert "set VOCAB_SIZE <= " in str(err.value)


@pytest.mark.parametrize("value, message", [
    ("residual_iwslt_e12d12", "'residual_iwslt_e12d12' is not ARCH=LR[,LR...][@WARMUP[,WARMUP...]]"),
    ("residual_iwslt_e12d12=1e-3,1e-3", "gives a value twice"),
    ("residual_iwslt_e12d12=1e-3,", "is not ARCH=LR"),
    ("residual_iwslt_e12d12=1e-3,2", "has lr 2, not in (0, 1)"),
    ("residual_iwslt_e12d12=fast", "is not ARCH=LR"),
    ("residual_iwslt_e12d12=1e-3@x", "is not ARCH=LR"),
    ("=1e-3", "is not ARCH=LR"),
    ("dca_iwslt_e12d12=1e-3", "names dca_iwslt_e12d12, not in ARCHS"),
    ("residual_iwslt_e12d12=1e-3 residual_iwslt_e12d12=2e-3", "gives residual_iwslt_e12d12 a second time"),
    ("residual_iwslt_e12d12=2", "has lr 2, not in (0, 1)"),
    ("residual_iwslt_e12d12=1e-3@0", "has warm-up 0, not >= 1"),
])  # fmt: skip
def test_bad_arch_lrs_name_the_variable_and_the_allowed_form(value, message):
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args(["--arch-lrs", value])
    assert str(err.value).startswith("ARCH_LRS (--arch-lrs): ") and message in str(err.value)
    assert "allowed: space-separated ARCH=LR[,LR...][@WARMUP[,WARMUP...]] entries" in str(err.value)


def test_arch_lrs_give_their_models_one_setting_and_the_others_the_grid():
    """A study at each model's own lr (chosen before): no grid for those models, and the later seeds at it."""
    archs = "transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12 residual_iwslt_e12d12"
    args = study.parse_args(["--archs", archs, "--seeds", "1 2", "--lrs", "5e-4 1e-3", "--max-update", "1000",
                             "--arch-lrs", "transformer_preln_iwslt_e12d12=4e-3 residual_iwslt_e12d12=2e-3@200"])  # fmt: skip
    tuning, later = study.grid(args)
    assert [(r.arch, r.lr, r.warmup) for r in tuning] == [
        ("transformer_preln_iwslt_e12d12", 4e-3, 400), ("transformer_postln_iwslt_e12d12", 5e-4, 400),
        ("transformer_postln_iwslt_e12d12", 1e-3, 400), ("residual_iwslt_e12d12", 2e-3, 200)]  # fmt: skip
    assert tuning[0].name == "transformer_preln_iwslt_e12d12.warmup.lr0.004.wu400.s1"
    choices = study_stats.choose_settings({r: {"valid_loss": 5.0} for r in tuning}, first_seed=1)
    assert (choices[("residual_iwslt_e12d12", "warmup")]["lr"], choices[("residual_iwslt_e12d12", "warmup")]["warmup"]) == (2e-3, 200)
    assert choices[("transformer_preln_iwslt_e12d12", "warmup")]["edges"] == []
    assert [r.seed for r in later] == [2, 2, 2]
    assert study_report_common.lr_text(args) == ("0.0005/0.001 (the others), own (ARCH_LRS): transformer_preln_iwslt_e12d12 "
                                                 "0.004, residual_iwslt_e12d12 0.002 (warm-up 200)")  # fmt: skip
    every = study.parse_args(["--archs", "transformer_preln_iwslt_e12d12", "--seeds", "1", "--arch-lrs",
                              "transformer_preln_iwslt_e12d12=4e-3"])  # fmt: skip
    assert study_report_common.lr_text(every) == "own (ARCH_LRS): transformer_preln_iwslt_e12d12 0.004"
    nowarm = study.parse_args(["--archs", "transformer_preln_iwslt_e12d12", "--variants", "nowarmup warmup",
                               "--arch-lrs", "transformer_preln_iwslt_e12d12=4e-3@100"])  # fmt: skip
    assert [(r.variant, r.warmup) for r in study.grid(nowarm)[0]] == [("nowarmup", 0), ("warmup", 100)]


def test_default_arch_lrs_follow_the_architectures_left_in_archs():
    """The main job's own settings stay with their models when ARCHS changes; a given ARCH_LRS is taken as it is."""
    d = study.Defaults(archs="transformer_preln_iwslt_e12d12 residual_iwslt_e12d12", seeds="1",
                       arch_lrs="transformer_preln_iwslt_e12d12=4e-3 residual_iwslt_e12d12=2e-3")  # fmt: skip
    assert study.parse_args([], d).arch_settings == {"transformer_preln_iwslt_e12d12": ([4e-3], None),
                                                     "residual_iwslt_e12d12": ([2e-3], None)}  # fmt: skip
    other = study.parse_args(["--archs", "transformer_postln_iwslt_e12d12 residual_iwslt_e12d12"], d)
    assert other.arch_settings == {"residual_iwslt_e12d12": ([2e-3], None)}
    assert study.parse_args(["--arch-lrs", ""], d).arch_settings == {}
    # LRS asks for a grid for every model: the defaults' own lrs would silently override it
    grid = study.parse_args(["--seeds", "1 2", "--lrs", "5e-4 1e-3"], d)
    assert grid.arch_settings == {} and {r.lr for r in study.grid(grid)[0]} == {5e-4, 1e-3}
    assert study.parse_args(["--warmups", "100 200", "--seeds", "1 2"], d).arch_settings["residual_iwslt_e12d12"] == ([2e-3], None)


def test_arch_lrs_lists_widen_one_models_grid():
    """A grid widened for one model (its best lr on the edge) beside the shared LRS grid, chosen the same way."""
    args = study.parse_args(["--archs", "transformer_preln_iwslt_e12d12 residual_iwslt_e12d12", "--seeds", "1 2",
                             "--lrs", "1e-3 2e-3", "--arch-lrs", "transformer_preln_iwslt_e12d12=1e-3,2e-3,4e-3@100,400"])  # fmt: skip
    tuning, _ = study.grid(args)
    pre = [(r.lr, r.warmup) for r in tuning if r.arch == "transformer_preln_iwslt_e12d12"]
    assert pre == [(1e-3, 100), (1e-3, 400), (2e-3, 100), (2e-3, 400), (4e-3, 100), (4e-3, 400)]
    assert [(r.lr, r.warmup) for r in tuning if r.arch == "residual_iwslt_e12d12"] == [(1e-3, 400), (2e-3, 400)]
    results = {r: {"valid_loss": 5.0 - r.lr * 100 - r.warmup / 1e4} for r in tuning}
    choice = study_stats.choose_settings(results, first_seed=1)[("transformer_preln_iwslt_e12d12", "warmup")]
    assert (choice["lr"], choice["warmup"]) == (4e-3, 400) and len(choice["candidates"]) == 6
    assert study_report_common.lr_text(args) == ("0.001/0.002 (the others), own (ARCH_LRS): transformer_preln_iwslt_e12d12 "
                                                 "0.001/0.002/0.004 (warm-up 100/400)")  # fmt: skip
    with pytest.raises(study_common.RecipeError, match="ARCH_LRS gives transformer_preln_iwslt_e12d12 warm-up 900"):
        study.parse_args(["--archs", "transformer_preln_iwslt_e12d12", "--seeds", "1 2", "--max-update", "800",
                          "--arch-lrs", "transformer_preln_iwslt_e12d12=1e-3@100,900"])  # fmt: skip


class _Finished:
    """A training or evaluation process that has already ended with ``status``, having written ``files``."""

    def __init__(self, log_file, status: int, files: dict):
        self.log_file, self.status, self.files = log_file, status, files

    def poll(self):
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.files = {}
        return self.status

    def stop(self):
        pass


def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    import study_run

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
        start = study_common._seconds("2026-01-01 00:00:00")
        text = "\n".join([study_common.attempt_line(1, start).strip(), _record("00:01", "train_inner", 4, 6.0),
                          _record("00:02", "valid", 4, loss), "| done training in 1 s"]) + "\n"  # fmt: skip
        return _Finished(log, -9 if (run.arch, run.lr, run.seed) in train_fails else 0, {log: text})

    def evaluate(run):
        results = runner.run_dir(run) / "eval" / "results.json"
        failed = (run.arch, run.lr, run.seed) in eval_fails
        return _Finished(runner.run_dir(run) / "eval.log", 1 if failed else 0, {} if failed else {results: "{}"})

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


def test_a_variable_that_nearly_spells_one_of_the_study_is_named_not_silently_ignored():
    environ = {"SEED": "3", "MAX_UPDATES": "50", "LR": "2e-3", "PATH": "/bin", "OMP_NUM_THREADS": "1", "SEEDS": "1",
               "LANG": "C", "TERM": "xterm", "lowercase_seed": "1"}  # fmt: skip
    near = study_checks.misspelt_variables(environ, (*study.ENV_VARS, "REPORT_ONLY"))
    assert near == [("LR", "LRS"), ("MAX_UPDATES", "MAX_UPDATE"), ("SEED", "SEEDS")]
