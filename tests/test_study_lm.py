"""The study tool for language models (LM=1, scripts/study/study_lm.py): the task follows the data and the
architectures, packed blocks, perplexity with a paired bootstrap on per-sentence log-likelihoods, end to end with a
resume, and the vocabulary conflict named."""

import json
import logging
import sys

import pytest

from scripts.study import study, study_common, study_lm, study_logs, study_stats

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked  # noqa: F401  (a fixture)
from .helpers import REPO
from .study_fixtures import recipe, slow

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")

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
    # a language model's SentencePiece default fits Multi30k's English side alone (at most 7,928 pieces)
    assert plain.vocab_size == 8000 and study.parse_args(["--task", "language_modeling"]).vocab_size == 4000


def test_translation_recipe_refuses_a_language_model():
    from scripts.training import train_options

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
    assert value["--user-dir"] == "fairseq_plugins"  # relative to the repository, where fairseq runs
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
def test_lm_study_end_to_end_with_perplexity_paired_test_and_resume(tmp_path, monkeypatch):
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
    curves = study_logs.read_curves(hooked[0] / "train.log")
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
    # the report alone, again, from the records (REPORT_ONLY), is the same: study.main here, with the options the
    # recipe made of these variables (test_study.py runs REPORT_ONLY=1 through the recipe), not a third study process
    argv = ["--task", "language_modeling", "--raw-dir", env["MULTI30K_DIR"], "--no-verify-counts", "--vocab-size", "100",
            "--out-dir", env["OUT_DIR"], "--archs", env["ARCHS"], "--seeds", env["SEEDS"], "--max-update", "4",
            "--valid-every", "2", "--jobs", "2", "--bootstrap", "20", "--model-args", LM_MODEL_ARGS, "--report-only"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / "study" / "study.py"), *argv])  # the report names its command
    try:  # study.main silences fairseq's logging below errors for its console: restored for the other tests
        study.main(argv)
    finally:
        logging.disable(logging.NOTSET)
    again = json.loads((tmp_path / "out" / "results.json").read_text())
    assert again["report_only"]  # written by this report, not left from the study before
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
