"""The two-level bootstrap over seeds and sentences (scripts/study/study_seeds.py, issue 55): its statistics are
sacrebleu's corpus BLEU, its per-seed differences the per-seed comparisons', its decisions follow their rules."""


import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from scripts.study import study_seeds as ss

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
