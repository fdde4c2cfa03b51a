"""PAIRS of the study tool (scripts/study/): its refusals, and its section of the report.

The runs are written as a finished study leaves them (train.log, DONE.json, command.json,
eval/), without training, and reported with REPORT_ONLY, the way PAIRS is meant to be
used on a study that is done. A pair whose baseline is the first architecture must give
the numbers of the comparison against the first model; another baseline must give the
difference SYSTEM - BASELINE, of each model's runs at its chosen lr.
"""

import json
import logging
import math
import sys
from pathlib import Path

import pytest

from scripts.study import study, study_common, study_logs

from .helpers import REPO, run

A, B, C = "transformer_preln_e6d6", "residual_e6d6", "dca_e6d6"
REFS = [f"a small dog number {i} runs fast on the green grass" for i in range(30)]
SECTION = "## Paired comparisons between chosen models"
ALLOWED = (
    "allowed: space-separated SYSTEM:BASELINE pairs of two different architectures "
    "of ARCHS, each once"
)


@pytest.mark.parametrize(
    "pairs, message",
    [
        (f"{C}-{B}", f"PAIRS (--pairs): '{C}-{B}' is not SYSTEM:BASELINE; {ALLOWED}"),
        (f"{C}:{B}:{A}", f"'{C}:{B}:{A}' is not SYSTEM:BASELINE"),
        (f":{B}", f"':{B}' is not SYSTEM:BASELINE"),
        (f"{C}:dca_k", f"'{C}:dca_k' names dca_k, not in ARCHS ({A} {B} {C});"),
        (f"{C}:{C}", f"'{C}:{C}' pairs {C} with itself"),
        (f"{C}:{B} {C}:{B}", f"'{C}:{B}' appears twice"),
        (f"{C}:{B} {B}:{C}", f"'{B}:{C}' is {C}:{B} reversed (the same comparison)"),
    ],
)
def test_bad_pairs_are_refused_naming_the_variable(pairs, message):
    archs = ["--archs", f"{A} {B} {C}"]
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args([*archs, "--pairs", pairs])
    assert message in str(err.value)
    good = study.parse_args([*archs, "--pairs", f"{C}:{B}  {C}:{A}"])
    assert good.pair_list == [(C, B), (C, A)]


def test_recipe_passes_pairs_and_stops_with_one_line(tmp_path):
    env = {"RECIPE_PYTHON": sys.executable, "ARCHS": f"{A} {B}", "PAIRS": f"{B}:{C}"}
    env["OUT_DIR"] = str(tmp_path)
    proc = run(["bash", REPO / "recipes" / "study.sh"], env=env, check=False)
    line = (
        f"[study] error: PAIRS (--pairs): '{B}:{C}' names {C}, not in ARCHS ({A} {B}); "
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [line + ALLOWED]


# ------------------------------------------------------------- fake finished runs


def _write_run(args, data, manifest, run_, loss: float, evaluation: dict) -> None:
    """One finished, evaluated run as the study leaves it; ``evaluation`` is its
    eval/results.json, with the translations under "hyps" (written to eval/hyps/)."""
    runner = study.Study(args, data, manifest)
    folder = runner.run_dir(run_)
    (folder / "eval").mkdir(parents=True)
    lines = [
        study_logs.attempt_line(1, study_logs._seconds("2026-01-01 00:00:00")),
        "2026-01-01 00:00:01 | INFO | x | num. model params: 1,000",
    ]
    for i, (updates, value) in enumerate(((2, loss + 1), (4, loss))):
        train = json.dumps({"num_updates": str(updates), "loss": str(value + 0.2)})
        valid = json.dumps(
            {"valid_num_updates": str(updates), "valid_loss": str(value)}
        )
        lines += [f"2026-01-01 00:00:1{i} | INFO | train_inner | {train}"]
        lines += [f"2026-01-01 00:00:2{i} | INFO | valid | {valid}"]
    (folder / "train.log").write_text("".join(line.strip() + "\n" for line in lines))
    done = {"run": study_common.as_dict(run_), "updates": 4}
    (folder / "DONE.json").write_text(json.dumps(done))
    command = runner._command(run_, folder / "checkpoints", [])
    (folder / "command.json").write_text(json.dumps({"command": command}))
    if "hyps" in evaluation:
        (folder / "eval" / "hyps").mkdir()
        hyps = "\n".join(evaluation.pop("hyps")) + "\n"
        (folder / "eval" / "hyps" / "test.en").write_text(hyps)
    (folder / "eval" / "results.json").write_text(json.dumps(evaluation))


def _report(argv: list[str], monkeypatch) -> tuple[dict, str]:
    # the report names the command it was given (here: not pytest's)
    monkeypatch.setenv("STUDY_COMMAND", "bash recipes/study.sh")
    try:  # study.main silences logging for its console: restored for the other tests
        study.main(argv)
    finally:
        logging.disable(logging.NOTSET)
    out = Path(argv[argv.index("--out-dir") + 1])
    results = json.loads((out / "results.json").read_text())
    return results, (out / "results.md").read_text()


def _compared(results: dict) -> tuple[dict, dict]:
    """(the comparisons against the first model by (system, seed), the pairs' by
    (system, baseline, seed), without the baseline's name)."""
    first = {(c["system"], c["key"][1]): c for c in results["comparisons"]}
    pairs = {
        (c["system"], c["baseline"], c["key"][1]): {
            k: v for k, v in c.items() if k != "baseline"
        }
        for c in results["pair_comparisons"]["comparisons"]
    }
    return first, pairs


def _section(md: str) -> str:
    return md.split(SECTION)[1].split("\n## ")[0]


def _hyps(wrong_every: int, seed: int) -> list[str]:
    return [r if (i + seed) % wrong_every else "a cat" for i, r in enumerate(REFS)]


def _translation_study(tmp_path) -> tuple[list[str], dict]:
    """A, B, C, seeds 1 and 2, the lr chosen from 1e-3 and 2e-3 on seed 1 (B keeps 1e-3,
    C takes 2e-3), C's seed 2 not finished. A is wrong on 1 sentence in 2, B on 1 in 3,
    C on 1 in 6; a run not chosen is perfect, so a pair that used it would show it."""
    data = tmp_path / "data"
    data.mkdir()
    manifest = {"dataset": "fake", "source_lang": "de", "target_lang": "en"}
    manifest["tests"] = [{"name": "test", "reference": "test.ref.en"}]
    (data / "recipe.json").write_text(json.dumps(manifest))
    (data / "test.ref.en").write_text("\n".join(REFS) + "\n")
    argv = ["--archs", f"{A} {B} {C}", "--seeds", "1 2", "--lrs", "1e-3 2e-3",
            "--max-update", "4", "--valid-every", "2", "--bootstrap", "50",
            "--data-bin", str(data), "--out-dir", str(tmp_path / "out"),
            "--report-only", "--model-args", "", "--pairs", f"{C}:{A} {C}:{B} {A}:{B}"]  # fmt: skip
    args = study.parse_args(argv)
    wrong = {A: 2, B: 3, C: 6}
    chosen = {A: 1e-3, B: 1e-3, C: 2e-3}
    hyps = {}
    for arch in (A, B, C):
        for lr, seed in ((1e-3, 1), (2e-3, 1), (chosen[arch], 2)):
            if (arch, seed) == (C, 2):
                continue
            is_chosen = lr == chosen[arch]
            hyps[(arch, lr, seed)] = _hyps(wrong[arch], seed) if is_chosen else REFS
            test = {"bleu": 0.0, "chrf": 0.0, "sentences": len(REFS)}
            evaluation = {
                "tests": {"test": test},
                "beam": 5,
                "signatures": {"bleu": "s"},
            }
            evaluation["hyps"] = hyps[(arch, lr, seed)]
            run_ = study_common.Run(arch, "warmup", lr, 400, seed)
            _write_run(args, data, manifest, run_, 5.0 - is_chosen, evaluation)
    return argv, {(a, s): h for (a, lr, s), h in hyps.items() if lr == chosen[a]}


def test_pairs_section_of_a_translation_study(tmp_path, monkeypatch):
    from sacrebleu.metrics import BLEU, CHRF

    argv, hyps = _translation_study(tmp_path)
    results, md = _report(argv, monkeypatch)
    first, pairs = _compared(results)
    assert list(pairs) == [(C, A, 1), (C, B, 1), (A, B, 1), (A, B, 2)]
    # against the first architecture: the numbers of the section against the first model
    assert pairs[(C, A, 1)] == first[(C, 1)]
    # A - B is B - A (against the first model) turned round: sign, interval, p
    for seed in (1, 2):
        a_b, b_a = pairs[(A, B, seed)], first[(B, seed)]
        assert a_b["bleu_diff"] == -b_a["bleu_diff"] < 0
        assert a_b["bleu_ci"] == [-b_a["bleu_ci"][1], -b_a["bleu_ci"][0]]
        assert a_b["bleu_p"] == pytest.approx(b_a["bleu_p"])
    # any pair: SYSTEM - BASELINE of the chosen runs (C at 2e-3, B at 1e-3)
    for (system, baseline, seed), entry in pairs.items():
        for metric, name in ((BLEU(), "bleu"), (CHRF(), "chrf")):
            score = {
                arch: metric.corpus_score(hyps[(arch, seed)], [REFS]).score
                for arch in (system, baseline)
            }
            diff = score[system] - score[baseline]
            assert entry[f"{name}_diff"] == pytest.approx(diff, abs=1e-3)
            low, high = entry[f"{name}_ci"]
            assert low <= entry[f"{name}_diff"] <= high
    assert pairs[(C, B, 1)]["bleu_diff"] > 0
    missing = results["pair_comparisons"]["missing"]
    assert [(m["system"], m["baseline"], m["key"][1]) for m in missing] == [
        (C, A, 2),
        (C, B, 2),
    ]
    assert all(m["unfinished"] == [C] for m in missing)
    # results.md: after the section against the first model, the same columns
    assert md.index("## Paired comparisons against the first model") < md.index(SECTION)
    section = _section(md)
    assert (
        "| model - baseline (variant) | seed | ΔBLEU | 95% CI | p | ΔchrF |" in section
    )
    e = pairs[(C, B, 1)]
    low, high = e["bleu_ci"]
    row = f"| {C} - {B} (warmup) | 1 | {e['bleu_diff']:+.2f} | [{low:+.2f}, {high:+.2f}] |"
    assert row in section
    assert (
        f"(a run has not finished): {C} - {A} (warmup) seed 2 ({C} missing)" in section
    )
    # without PAIRS, neither the section nor the record
    results, md = _report(argv[:-2], monkeypatch)
    assert "pair_comparisons" not in results and SECTION not in md


def test_pairs_section_of_a_language_model_study(tmp_path, monkeypatch):
    lm_a, lm_b, lm_c = "transformer_preln_lm_d6", "dca_lm_d6", "dca_k2_lm_d6"
    data = tmp_path / "data"
    data.mkdir()
    manifest = {"dataset": "lm_x", "task": "language_modeling"}
    (data / "recipe.json").write_text(json.dumps(manifest))
    argv = ["--archs", f"{lm_a} {lm_b} {lm_c}", "--seeds", "1 2", "--max-update", "4",
            "--valid-every", "2", "--bootstrap", "50", "--data-bin", str(data),
            "--out-dir", str(tmp_path / "out"), "--report-only", "--model-args", "",
            "--pairs", f"{lm_c}:{lm_a} {lm_c}:{lm_b}"]  # fmt: skip
    args = study.parse_args(argv)
    tokens = [5 + i % 7 for i in range(40)]
    nats = {lm_a: 3.0, lm_b: 2.8, lm_c: 2.6}  # per token: dca_k2 the most likely
    ppl = {}
    for arch, seed in ((arch, seed) for arch in nats for seed in (1, 2)):
        lp = [
            -n * (nats[arch] + 0.3 * math.sin(i * seed)) for i, n in enumerate(tokens)
        ]
        ppl[(arch, seed)] = math.exp(-sum(lp) / sum(tokens))
        split = {"perplexity": ppl[(arch, seed)], "sentences": 40, "total": 40,
                 "tokens": sum(tokens), "ids": list(range(40)), "log_probs": lp,
                 "token_counts": tokens}  # fmt: skip
        evaluation = {"checkpoint": "x", "splits": {"valid": split, "test": split}}
        run_ = study_common.Run(arch, "warmup", 1.6e-3, 400, seed)
        _write_run(args, data, manifest, run_, 5.0, evaluation)
    results, md = _report(argv, monkeypatch)
    first, pairs = _compared(results)
    assert list(pairs) == [
        (lm_c, lm_a, 1),
        (lm_c, lm_a, 2),
        (lm_c, lm_b, 1),
        (lm_c, lm_b, 2),
    ]
    assert results["pair_comparisons"]["missing"] == []
    for seed in (1, 2):
        assert pairs[(lm_c, lm_a, seed)] == first[(lm_c, seed)]
        entry = pairs[(lm_c, lm_b, seed)]
        diff = ppl[(lm_c, seed)] - ppl[(lm_b, seed)]
        assert entry["ppl_diff"] == pytest.approx(diff, abs=1e-4) and diff < 0
        assert entry["ll_diff"] > 0
        assert entry["ppl_ci"][0] <= entry["ppl_diff"] <= entry["ppl_ci"][1]
    section = _section(md)
    assert (
        "| model - baseline (variant) | seed | Δppl | 95% CI | p | Δ log-lik" in section
    )
    diff = pairs[(lm_c, lm_b, 2)]["ppl_diff"]
    assert f"| {lm_c} - {lm_b} (warmup) | 2 | {diff:+.2f} |" in section
    assert "Not compared" not in section and "BLEU" not in md
