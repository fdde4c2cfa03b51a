"""The study tool (scripts/study/, recipes/study.sh) and the main job built on it (recipes/main_job.sh).

In-process: learning curves from fairseq's JSON logs (also across a resume), the lr/warm-up choice on valid
loss, the grid, the schedules of the variants, option errors naming the variable, the reading's wording.
End to end on the Multi30k fixtures with tiny models: a 2-architecture x 2-seed grid interrupted (test hook
STUDY_INTERRUPT_AT) and restarted finishes without retraining what was done and continues the interrupted run
from its checkpoint; its records alone (no checkpoints or data, as committed) are reused, under its set-up only; the main job prints a compact console, a table, a plot path and a reading.
"""

import json
import os
import shutil
import sys

import pytest

from . import recipe_fixtures as fx
from .helpers import REPO, TINY, run

sys.path[:0] = [str(REPO / "scripts" / "study")]

import study
import study_common
import study_report

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
                             "--warmups", "100 400", "--max-update", "10"])  # fmt: skip
    tuning, later = study.grid(args)
    assert len(tuning) == 2 * 2 * 2 and {r.seed for r in tuning} == {3}
    assert [(r.arch, r.seed) for r in later] == [("transformer_preln_e6d6", 4), ("residual_e6d6", 4)]
    losses = {(1e-3, 100): 5.0, (1e-3, 400): 4.0, (5e-4, 100): 4.5, (5e-4, 400): 6.0}
    results = {r: {"valid_loss": losses[(r.lr, r.warmup)] + (r.arch == "residual_e6d6")} for r in tuning}
    choices = study_report.choose_settings(results, first_seed=3)
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
    assert "about level with res" in flipped and "res reached valid loss 5.95" in flipped
    assert "reached pre's final valid loss after 100 updates" in flipped


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
    # a data step that fails (too many pieces for this corpus) names the cause, leaves no data behind ...
    failed = recipe("main_job.sh", {**env, "VOCAB_SIZE": "5000"}, check=False)
    assert failed.returncode == 1 and "data preparation failed" in failed.stderr and "Vocabulary size" in failed.stderr
    assert not (tmp_path / "out" / "data-bin").exists()
    # ... and the main job, with other settings, starts cleanly in the same output directory
    proc = recipe("main_job.sh", {**env, "VOCAB_SIZE": "100"})
    lines = proc.stdout.splitlines()
    assert len(lines) < 80, proc.stdout
    assert not any("| INFO |" in line or "train_inner" in line for line in lines)  # fairseq logs only in files
    assert "3 model(s) x 1 seed(s): 3 runs of 3 updates each, 3 at a time" in proc.stdout
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["arch"]: r for r in results["models"]}
    assert list(rows) == ["transformer_preln_iwslt_e12d12", "transformer_postln_iwslt_e12d12", "residual_iwslt_e12d12"]
    for r in rows.values():
        assert r["updates"] == 3 and r["parameters"] > 0 and 0 <= r["bleu"] <= 100
    assert "bash recipes/main_job.sh" in results["command"]
    assert f"plots: {tmp_path / 'out' / 'curves.png'}" in proc.stdout and results["reading"] in proc.stdout
    assert "transformer_postln_iwslt_e12d12" in results["reading"] and "After 3 updates each" in results["reading"]
    assert (tmp_path / "out" / "runs").is_dir() and (tmp_path / "out" / "logs" / "prepare.log").is_file()


def test_main_job_names_the_variable_the_user_set(tmp_path):
    proc = recipe("main_job.sh", {"MULTI30K_DIR": str(tmp_path / "nowhere"), "OUT_DIR": str(tmp_path / "out")},
                  check=False)  # fmt: skip
    assert proc.returncode == 1 and f"MULTI30K_DIR (--raw-dir)={tmp_path / 'nowhere'}: no such directory" in proc.stderr
    assert "RAW_DIR=" not in proc.stderr.replace("MULTI30K_DIR", "") and not (tmp_path / "out").exists()
