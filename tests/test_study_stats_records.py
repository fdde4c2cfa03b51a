"""The paired bootstrap's intervals of the difference (scripts/study/study_stats.py) take BLEU from sacrebleu's
public API (sentence statistics and ``BLEU.compute_bleu``), never from its private functions, and give the
numbers the committed studies report: a few committed comparisons (docs/study/*/results.json, from the runs'
eval/hyps) are recomputed to the digits recorded. The references are Multi30k's test set, which the repository
does not hold: those checks run where a local copy is (MULTI30K_DIR, or ../shared/data/multi30k as the README
uses)."""

import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from scripts.study import study_stats

from .helpers import REPO
from .study_fixtures import slow


def test_bleu_resamples_use_public_api_and_equal_sacrebleus_own(monkeypatch):
    """Bit-identical to sacrebleu's paired bootstrap path (float32 statistics summed per resample), with BLEU's
    private statistics functions unavailable."""
    from sacrebleu.metrics import BLEU

    refs = [f"a small dog runs on the grass number {i} ." for i in range(40)]
    hyps = [r if i % 3 else "a dog runs on grass" for i, r in enumerate(refs)]
    hyps[5] = ""  # an empty translation: no n-grams at all
    idxs = study_stats._bootstrap_indices(len(refs), 300)
    metric = BLEU()
    stats = np.array(metric._extract_corpus_statistics(hyps, [refs]), dtype="float32")
    expected = np.array([metric._compute_score_from_stats(s.sum(0)).score for s in stats[idxs]])

    def guarded(name):  # sacrebleu's public methods call its private ones: only a direct call fails
        original = getattr(BLEU, name)

        def call(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            assert not caller.endswith("study_stats.py"), f"study_stats.py calls sacrebleu's private BLEU.{name}"
            return original(self, *args, **kwargs)

        monkeypatch.setattr(BLEU, name, call)

    guarded("_extract_corpus_statistics")
    guarded("_compute_score_from_stats")
    assert np.array_equal(study_stats._resampled(BLEU(), hyps, refs, idxs), expected)


def _multi30k() -> Path | None:
    for candidate in (os.environ.get("MULTI30K_DIR"), REPO.parent / "shared" / "data" / "multi30k"):
        if candidate and (Path(candidate) / "test_2016_flickr.en.gz").is_file():
            return Path(candidate)
    return None


def _hyps(study: Path, results: dict, arch: str, variant: str, seed: int) -> list[str]:
    choice = next(c for c in results["choices"] if (c["arch"], c["variant"]) == (arch, variant))
    run = next(r for r in results["runs"] if (r["arch"], r["variant"], r["seed"], r["lr"], r["warmup"])
               == (arch, variant, seed, choice["lr"], choice["warmup"]))  # fmt: skip
    path = study / "runs" / run["name"] / "eval" / "hyps" / f"{results['test_set']}.en"
    return path.read_text(encoding="utf-8").splitlines()


# (study, system, seed): a large gap, a gap at another lr, a negative gap, the smallest margins
RECORDS = [
    ("combinations_e12d12", "tfixup_iwslt_e12d12", 1),
    ("lr_e12d12", "residual_iwslt_e12d12", 1),
    ("crossformer_hg_e6d6", None, 2),
]


@slow
@pytest.mark.skipif(_multi30k() is None, reason="needs Multi30k's test references (MULTI30K_DIR)")
@pytest.mark.parametrize("name,system,seed", RECORDS)
def test_committed_comparisons_are_recomputed_to_their_digits(name, system, seed):
    study = REPO / "docs" / "study" / name
    results = json.loads((study / "results.json").read_text(encoding="utf-8"))
    with gzip.open(_multi30k() / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        references = f.read().splitlines()
    recorded = next(c for c in results["comparisons"]
                    if c["key"][1] == seed and (system is None or c["system"] == system))  # fmt: skip
    variant, baseline = recorded["key"][0], results["models"][0]["arch"]
    systems = [(arch, _hyps(study, results, arch, variant, seed)) for arch in (baseline, recorded["system"])]
    samples = results["settings"]["bootstrap"]
    entry = study_stats.paired_tests({(variant, seed): systems}, references, samples)[(variant, seed, recorded["system"])]
    for key in ("bleu_ci", "chrf_ci", "bleu_diff", "chrf_diff", "bleu_p", "chrf_p"):
        assert entry[key] == recorded[key], (key, entry[key], recorded[key])
