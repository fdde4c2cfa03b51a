"""The two-level bootstrap over seeds and sentences (scripts/study/study_seeds.py, issue 55): its statistics are
sacrebleu's corpus BLEU, its per-seed differences the per-seed comparisons', its decisions follow their rules."""

import json

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from scripts.study import study_seeds as ss
from scripts.study.study_provenance import pair_machines

from .helpers import REPO
from .study_fixtures import log_record

REFS = ["a man rides a red bike down the street", "two dogs play in the snow", "a child is eating an apple",
        "people walk along the beach at sunset", "a woman sings on a stage"] * 4  # fmt: skip


def _hyps(drop: int) -> list[str]:
    """The references with every ``drop``-th word dropped: a system whose BLEU falls as ``drop`` shrinks."""
    return [" ".join(w for i, w in enumerate(r.split()) if (i + 1) % drop) for r in REFS]


def test_summed_sentence_statistics_give_sacrebleus_corpus_bleu():
    for drop in (2, 3, 5):
        hyps = _hyps(drop)
        stats = ss.sentence_statistics(hyps, REFS)
        assert ss.corpus_bleu(stats.sum(0)) == pytest.approx(BLEU().corpus_score(hyps, [REFS]).score, abs=1e-9)
        half = stats[:7].sum(0)
        assert ss.corpus_bleu(half) == pytest.approx(BLEU().corpus_score(hyps[:7], [REFS[:7]]).score, abs=1e-9)


def test_two_level_interval_and_per_seed_differences():
    system = {1: ss.sentence_statistics(_hyps(5), REFS), 2: ss.sentence_statistics(_hyps(4), REFS),
              3: ss.sentence_statistics(_hyps(6), REFS)}  # fmt: skip
    baseline = {s: ss.sentence_statistics(_hyps(3), REFS) for s in (1, 2, 3)}
    result = ss.two_level(system, baseline, samples=200)
    for s in (1, 2, 3):
        direct = BLEU().corpus_score(_hyps({1: 5, 2: 4, 3: 6}[s]), [REFS]).score - BLEU().corpus_score(_hyps(3), [REFS]).score
        assert result["per_seed"][s] == pytest.approx(direct, abs=1e-9)
    assert result["mean"] == pytest.approx(np.mean(list(result["per_seed"].values())))
    assert result["ci"][0] <= result["mean"] <= result["ci"][1] and result["ci"][0] > 0
    assert ss.decide(result["ci"], 1.0, 3) == "ahead"
    # the detectable difference shrinks with seeds only down to the shared sentences' part
    assert ss.detectable(result, 10) <= ss.detectable(result, 3)
    assert ss.detectable(result, 10**9) == pytest.approx(ss.Z_POWER * np.sqrt(result["var_sentences"]), rel=1e-6)


def test_decisions():
    assert ss.decide([0.1, 2.0], 1.0) == "ahead" and ss.decide([-2.0, -0.1], 1.0) == "behind"
    assert ss.decide([-0.5, 0.9], 1.0) == "level" and ss.decide([-1.5, 0.5], 1.0) == "undecided"
    assert ss.decide([0.1, 2.0], 1.0, seeds=2).startswith("undecided")  # two seeds cannot measure the seed spread


def _provenance(run_dir, *types):
    """A provenance.json with one attempt per machine type given (a CPU model number)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    attempts = [{"attempt": i + 1, "machine": {"cpu": "AMD EPYC", "family": "25", "model": t, "avx512": True, "cores": 2}}
                for i, t in enumerate(types)]  # fmt: skip
    (run_dir / "provenance.json").write_text(json.dumps(attempts))


def test_each_seeds_pair_is_labelled_by_the_machines_its_runs_trained_on(tmp_path):
    _provenance(tmp_path / "a", "17")
    _provenance(tmp_path / "b", "17")
    _provenance(tmp_path / "c", "1")
    _provenance(tmp_path / "mixed", "17", "1")  # resumed on another machine type
    (tmp_path / "old").mkdir()  # trained before the study tool recorded provenance
    assert pair_machines(tmp_path / "a", tmp_path / "b") == "same"
    assert pair_machines(tmp_path / "a", tmp_path / "c") == "different"
    assert pair_machines(tmp_path / "mixed", tmp_path / "a") == "different"
    assert pair_machines(tmp_path / "old", tmp_path / "a") == "unrecorded"


def test_the_analysis_is_repeated_over_the_seeds_whose_runs_shared_a_machine_type(tmp_path):
    """A study of two models, three seeds: seeds 1 and 2 on one machine type, seed 3 on two. The one-machine
    analysis uses seeds 1 and 2 only, and equals the two-level bootstrap over them; seed 3, scored after the
    report listed its runs, counts; an unscored seed 4 does not."""
    names = {}
    runs = []
    for arch, drops in (("base", {1: 3, 2: 3, 3: 3}), ("sys", {1: 5, 2: 4, 3: 6})):
        for seed, drop in drops.items():
            name = f"{arch}.warmup.lr0.001.wu400.s{seed}"
            names[arch, seed] = name
            hyps = tmp_path / "runs" / name / "eval" / "hyps"
            hyps.mkdir(parents=True)
            (hyps / "test.en").write_text("\n".join(_hyps(drop)) + "\n")
            bleu = BLEU().corpus_score(_hyps(drop), [REFS]).score
            (hyps.parent / "results.json").write_text(json.dumps({"tests": {"test": {"bleu": round(bleu, 2), "chrf": 50.0}}}))
            _provenance(tmp_path / "runs" / name, "1" if (arch, seed) == ("sys", 3) else "17")
            if seed < 3:  # seed 3 landed after the report was made: the analysis finds it in runs/
                runs.append({"arch": arch, "variant": "warmup", "lr": 0.001, "warmup": 400, "seed": seed, "name": name})
    unscored = tmp_path / "runs" / "sys.warmup.lr0.001.wu400.s4" / "eval" / "hyps"  # still training: left out
    unscored.mkdir(parents=True)
    (unscored / "test.en").write_text("\n".join(_hyps(2)) + "\n")
    results = {"choices": [{"arch": a, "variant": "warmup", "lr": 0.001, "warmup": 400} for a in ("base", "sys")],
               "runs": runs, "models": [{"arch": "base"}, {"arch": "sys"}], "test_set": "test"}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    record = ss.analyse(tmp_path, REFS, margin=1.0, samples=200)
    (model,) = record["models"]
    assert model["machines"] == {"1": "same", "2": "same", "3": "different"}
    assert model["seeds"] == [1, 2, 3] and model["one_machine_type"]["seeds"] == [1, 2]
    assert model["seeds_on_one_machine_type"] == 2
    stats = {(a, s): ss.sentence_statistics(_hyps(d), REFS)
             for a, ds in (("base", {1: 3, 2: 3}), ("sys", {1: 5, 2: 4})) for s, d in ds.items()}  # fmt: skip
    direct = ss.two_level({s: stats["sys", s] for s in (1, 2)}, {s: stats["base", s] for s in (1, 2)}, samples=200)
    assert model["one_machine_type"]["mean"] == pytest.approx(direct["mean"], abs=1e-9)
    assert model["one_machine_type"]["ci"] == pytest.approx(direct["ci"], abs=1e-9)
    assert model["one_machine_type"]["decision"].startswith("undecided")  # two seeds decide nothing
    text = ss.markdown({**record, "machine_text": "a machine"}, "python -m scripts.study.study_seeds")
    assert "1: " in text and "(s)" in text and "(d)" in text and "2, " in text
    # the runs table: every scored run of both models (the unscored seed 4 left out), from its records
    assert [(r["arch"], r["seed"]) for r in record["runs"]] == [(a, s) for a in ("base", "sys") for s in (1, 2, 3)]
    assert "| sys | 3 | AMD EPYC (family 25, model 1, AVX-512) | - | - | 72.52 / 50.00 | none | not recorded |" in text


def test_the_runs_table_reads_each_runs_stop_best_validation_resumes_and_check(tmp_path):
    """A run resumed once on its machine type, stopped by patience after a tie of its best loss, whose
    validation check agrees; and a run trained before provenance was recorded, without a check."""
    run = tmp_path / "sys.warmup.lr0.001.wu400.s1"
    (run / "eval").mkdir(parents=True)
    log = ["=== study: attempt 1 started at 1767225600",
           log_record("00:10", "valid", 100, 4.5), log_record("00:20", "valid", 200, 4.2),
           "=== study: attempt 2 started at 1767225700",
           log_record("00:30", "valid", 300, 4.3), log_record("00:40", "valid", 400, 4.2),
           log_record("00:50", "valid", 500, 4.4), log_record("01:00", "valid", 600, 4.1)]  # fmt: skip
    (run / "train.log").write_text("\n".join(log) + "\n")
    (run / "DONE.json").write_text(json.dumps({"stopped": "patience", "updates": 500}))  # 600 came after the stop
    (run / "eval" / "results.json").write_text(json.dumps({"tests": {"test": {"bleu": 30.12, "chrf": 55.5}}}))
    (run / "eval" / "valid_check.json").write_text(json.dumps({"valid_loss": 4.2}))
    machine = {"cpu": "AMD EPYC", "family": "25", "model": "17", "avx512": True, "cores": 2, "os": "x", "threads": 1}
    (run / "provenance.json").write_text(json.dumps([
        {"attempt": 1, "started": "2026-11-30 12:30 UTC", "machine": machine, "resumed_from": None},
        {"attempt": 2, "started": "2026-11-30 14:21 UTC", "machine": {**machine, "threads": 2},
         "resumed_from": {"checkpoint": "checkpoint_last.pt", "update": 200}}]))  # fmt: skip
    record = ss.run_record(run, "test")
    assert record["stopped"] == "patience" and record["updates"] == 500
    assert record["best_valid_loss"] == 4.2 and record["best_valid_updates"] == [200, 400]
    assert record["resumes"] == [{"update": 200, "same_machine_type": True}]
    line = ss.markdown({"study": "s", "baseline": "base", "margin": 1.0, "samples": 100, "machine_text": "m",
                        "models": [], "runs": [{"arch": "sys", "seed": 1, **record}]}, "cmd").splitlines()[-1]  # fmt: skip
    assert line == ("| sys | 1 | AMD EPYC (family 25, model 17, AVX-512), 2026-11-30 12:30 UTC | patience, at 500 | "
                    "4.200 at 200 and 400 | 30.12 / 55.50 | at 200 (same machine type) | agrees |")
    old = tmp_path / "old.warmup.lr0.001.wu400.s1"
    (old / "eval").mkdir(parents=True)
    (old / "train.log").write_text("\n".join(log[:3]) + "\n")
    (old / "DONE.json").write_text(json.dumps({"stopped": "updates", "updates": 200}))
    (old / "eval" / "results.json").write_text(json.dumps({"tests": {"test": {"bleu": 1.0, "chrf": 2.0}}}))
    record = ss.run_record(old, "test")
    assert record["machine"] is None and record["resumes"] is None and record["checked_valid_loss"] is None
    assert ss._stopped_text(record) == "the cap, at 200" and ss._check_text(record) == "not recorded"


COMMITTED = sorted(REPO.glob("docs/study/*/seeds.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_committed_seeds_tables_match_their_records(path):
    """Each committed seeds.md is its seeds.json rendered, and every run its runs table lists says what that run's
    records say now (a run that lands later is missing until the analysis is re-run, never misreported)."""
    record = json.loads(path.read_text(encoding="utf-8"))
    assert ss.markdown(record, record["command"]) == path.with_suffix(".md").read_text(encoding="utf-8")
    test_set = json.loads((path.parent / "results.json").read_text(encoding="utf-8"))["test_set"]
    for run in record["runs"]:
        stored = {k: v for k, v in run.items() if k not in ("arch", "seed", "name")}
        assert ss.run_record(path.parent / "runs" / run["name"], test_set) == stored, run["name"]
