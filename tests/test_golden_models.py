"""Checkpoints and initial weights of the code before the axes refactor (commit 8302f79) hold for today's code.

tests/golden/make_golden.py wrote, at that commit: one tiny trained checkpoint per family with its beam-search
output, and a fingerprint (parameter names, shapes, initial values at seed 0) of every named preset. Today's
code must translate each checkpoint identically (same tokens, scores to 1e-6) and build every preset with the
same parameters and initial values, except the presets ``fingerprints.json`` lists under ``changed_by_design``
(a default changed on purpose, with the reason).
"""

import json
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.models import PRESETS

from .helpers import build_model

GOLDEN = Path(__file__).resolve().parent / "golden"
CHECKPOINTS = GOLDEN / "checkpoints"


def _json(name: str) -> dict:
    path = GOLDEN / name
    return json.loads(path.read_text()) if path.exists() else {}


TRANSLATIONS = _json("translations.json")
FINGERPRINTS = _json("fingerprints.json")


def load_golden(arch: str):
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(CHECKPOINTS / f"{arch}.pt")],
        arg_overrides={
            "data": str(CHECKPOINTS / "data"),
            "source_lang": "src",
            "target_lang": "tgt",
        },
    )
    return models[0].eval(), task


def beam_search(
    model, task, source: list[list[int]], beam: int = 3, max_len_b: int = 12
) -> list[dict]:
    generator = SequenceGenerator(
        [model],
        task.target_dictionary,
        beam_size=beam,
        max_len_a=0,
        max_len_b=max_len_b,
    )
    pad = task.source_dictionary.pad()
    longest = max(len(s) for s in source)
    # left-padded as fairseq's translation task batches them
    src = torch.tensor([[pad] * (longest - len(s)) + s for s in source])
    sample = {
        "net_input": {
            "src_tokens": src,
            "src_lengths": torch.tensor([len(s) for s in source]),
        }
    }
    with torch.no_grad():
        hypos = generator.generate([model], sample)
    return [
        {"tokens": h[0]["tokens"].tolist(), "score": float(h[0]["score"]),
         "positional_scores": h[0]["positional_scores"].tolist()}
        for h in hypos
    ]  # fmt: skip


@pytest.mark.parametrize("arch", sorted(TRANSLATIONS.get("outputs", {})))
def test_golden_checkpoint_translates_identically(arch):
    model, task = load_golden(arch)
    expected = TRANSLATIONS["outputs"][arch]
    got = beam_search(
        model,
        task,
        TRANSLATIONS["source"],
        TRANSLATIONS["beam"],
        TRANSLATIONS["max_len_b"],
    )
    for e, g in zip(expected, got, strict=True):
        assert g["tokens"] == e["tokens"]
        # the same tokens; scores to float32 rounding of another CPU's kernels (recorded on AMD AVX2, an Intel
        # AVX-512 machine differs by up to 2e-6 in a positional score)
        assert g["score"] == pytest.approx(e["score"], abs=1e-5)
        assert g["positional_scores"] == pytest.approx(e["positional_scores"], abs=1e-5)


def test_every_golden_family_has_a_checkpoint():
    assert TRANSLATIONS, (
        "tests/golden/translations.json is missing: run python -m tests.golden.make_golden"
    )
    assert all(
        (CHECKPOINTS / f"{arch}.pt").exists() for arch in TRANSLATIONS["outputs"]
    )


def _changed(arch: str) -> bool:
    return arch in FINGERPRINTS.get("changed_by_design", {})


# at TINY width an iwslt_ preset builds its base-width twin (only the widths differ, and TINY sets them), so the
# twins' recorded fingerprints are equal (checked below) and only the base-width presets are rebuilt
TWINS = {a: a.replace("_iwslt_", "_") for a in FINGERPRINTS.get("presets", {}) if "_iwslt_" in a}
BUILT = sorted(a for a in FINGERPRINTS.get("presets", {}) if a not in TWINS)


def test_iwslt_presets_still_exist_and_equal_their_twins_at_tiny_width():
    for arch, twin in TWINS.items():
        assert arch in PRESETS, f"{arch} was a named architecture at 8302f79 and must stay one"
        assert FINGERPRINTS["presets"][arch] == FINGERPRINTS["presets"][twin]
        assert _changed(arch) == _changed(twin)


@pytest.mark.parametrize("arch", BUILT)
def test_preset_builds_todays_parameters_and_initial_weights(arch):
    from .golden.make_golden import fingerprint, per_tensor

    assert arch in PRESETS, (
        f"{arch} was a named architecture at 8302f79 and must stay one"
    )
    model = build_model(arch)
    # its named number of layers (tests/test_presets.py builds one depth of a kind per family, the others here)
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (
        PRESETS[arch].encoder_layers, PRESETS[arch].decoder_layers)  # fmt: skip
    got, expected = fingerprint(model), FINGERPRINTS["presets"][arch]
    assert got["names_shapes"] == expected["names_shapes"]
    if _changed(arch):
        assert got["values"] != expected["values"], (
            f"{arch} is listed as changed by design but is unchanged"
        )
        return
    if got["values"] != expected["values"] and arch in FINGERPRINTS["tensors"]:
        tensors = per_tensor(model)
        moved = [
            n for n, v in FINGERPRINTS["tensors"][arch].items() if tensors.get(n) != v
        ]
        pytest.fail(f"{arch}: initial values changed in {moved[:8]}")
    assert got["values"] == expected["values"]
