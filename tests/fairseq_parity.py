"""fairseq's own translation test cases (its tests/test_binaries.py, test_generation.py and the flags of
test_transformer_layerdrop) run on every family at 3 + 3 layers, width 16, beside fairseq's ``transformer``
as the control: train, generate with beam / sampling / diverse beam / prefix / lexical constraints,
interactive decoding, validation, and layer pruning at load time and in training (TorchScript export is
tests/test_torchscript.py). Each architecture trains once and runs all its cases in one process
(tests/parity_driver.py). Where fairseq fails a case on its own transformer, the control's case is an
expected failure (strict, so it shows when a later fairseq fixes it).

The architectures are split over two test files, tests/test_fairseq_parity.py and _2.py, so that CI's two
workers (``--dist loadfile``) run them side by side; ``transformer_pre/postln_*`` are fairseq's
``transformer`` with other flags, so the control stands for them."""

import json
import sys

import pytest

from fairseq_plugins.axes import declarations
from fairseq_plugins.models.presets import PRESETS

from .forkserver import run_forked

CONTROL = "transformer"
CASES = ["beam", "sampling", "prefix", "diverse_beam", "constraints", "validate", "prune_load", "prune_train",
         "prune_train_generate"]  # fmt: skip
# fairseq's failures, shown once on the control (each also fails for every family: the code is fairseq's)
CONTROL_ONLY = ["sampling_topp", "diverse_beam_batches", "score_reference_interactive", "prune_load_encoder"]
# the preset families of the choices that declare they refuse layer pruning (``prunes``: DCA's GRNs and
# DenseFormer's weights are sized by layer position, DeepNet's alpha follows the depth, ...), and the families
# that also refuse fairseq's LayerDrop, which the training case uses
REFUSES_PRUNING = frozenset(c.preset for table in declarations().values() for c in table.values() if c.prunes and c.preset)
REFUSES_LAYERDROP = ("dca", "denseformer")


def refuses_pruning(arch: str) -> bool:
    return arch in PRESETS and PRESETS[arch].family in REFUSES_PRUNING
PRUNING_CASES = {"prune_load", "prune_train"}
TRAIN_PRUNING_BUG = (
    "fairseq 0.12.3: fairseq-train parses --encoder-layers-to-keep as List[int] (TransformerConfig) but "
    "TransformerModel.build_model calls .split(',') on it: AttributeError (the plugin's models accept both)"
)
FAIRSEQ_BUGS = {
    "diverse_beam_batches": "fairseq 0.12.3 search.py DiverseBeamSearch keeps the first batch's size: with "
    "--diverse-beam-groups, a later, smaller batch raises IndexError",
    "score_reference_interactive": "fairseq 0.12.3 interactive.py builds batches without targets, so "
    "--score-reference raises KeyError: 'target'",
    "prune_load_encoder": "fairseq 0.12.3 checkpoint_utils.prune_state_dict keeps only layers a pruning pass "
    "names: pruning the encoder alone drops every decoder layer (Missing key(s)); the plugin's models name "
    "the other side's layers",
    "prune_train": TRAIN_PRUNING_BUG,
    "prune_train_generate": TRAIN_PRUNING_BUG + "; nothing to generate from",
}


def cases_of(arch: str) -> list[str]:
    cases = CASES + (CONTROL_ONLY if arch == CONTROL else ["prune_load_encoder"] if "crossformer_hg" in arch else [])
    return [c for c in cases if not (refuses_pruning(arch) and c == "prune_train_generate")]


def params(archs: list[str]):
    """(arch, case) pairs for pytest.mark.parametrize, fairseq's own failures marked as strict xfails."""
    for arch in archs:
        for case in cases_of(arch):
            bug = FAIRSEQ_BUGS.get(case) if arch == CONTROL else None
            marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
            yield pytest.param(arch, case, marks=marks, id=f"{arch}-{case}")


@pytest.fixture(scope="module")
def outcomes(corpus_bin, tmp_path_factory):
    """arch -> {case: outcome}, computed on first use: one training and one process per architecture."""
    root = tmp_path_factory.mktemp("parity")
    cache: dict[str, dict] = {}

    def get(arch: str) -> dict:
        if arch not in cache:
            out = root / f"{arch}.json"
            run_forked([sys.executable, "-m", "tests.parity_driver", corpus_bin, root / arch, arch, out, ",".join(cases_of(arch))],
                timeout=900)  # fmt: skip
            cache[arch] = json.loads(out.read_text())
            assert cache[arch]["train"]["ok"], cache[arch]["train"]["trace"]
        return cache[arch]

    return get


def hypotheses(stdout: str) -> list[tuple[int, list[str]]]:
    """(sentence id, hypothesis tokens) of every H- line, generate's and interactive's format alike."""
    hyps = []
    for line in stdout.splitlines():
        if line.startswith("H-"):
            key, _score, text = (line.split("\t") + ["", ""])[:3]
            hyps.append((int(key[2:]), text.split()))
    return hyps


def targets(stdout: str) -> dict[int, list[str]]:
    return {int(line.split("\t")[0][2:]): line.split("\t")[1].split() for line in stdout.splitlines()
            if line.startswith("T-")}  # fmt: skip


def check_case(outcomes, arch: str, case: str) -> None:
    outcome = outcomes(arch)[case]
    if refuses_pruning(arch) and case in PRUNING_CASES:
        assert not outcome["ok"] and "layers-to-keep cannot be used with" in outcome["error"], outcome
        assert "PluginOptionError" in outcome["error"]
        return
    assert outcome["ok"], outcome["trace"]
    out = outcome["stdout"]
    hyps = hypotheses(out)
    test_ids = set(range(21))  # every test sentence is translated (tests/helpers.make_reversal_corpus)
    if case == "beam":
        assert len(hyps) == 3 * 21 and {i for i, _ in hyps} == test_ids
        assert sum(line.startswith("A-") for line in out.splitlines()) == 3 * 21  # --print-alignment
    elif case in ("sampling", "sampling_topp"):
        assert len(hyps) == 2 * 21
    elif case == "prefix":  # --prefix-size 2: every hypothesis starts with its reference's first two tokens
        refs = targets(out)
        assert {i for i, _ in hyps} == test_ids
        assert all(tokens[:2] == refs[i][:2] for i, tokens in hyps)
    elif case == "constraints":  # ordered lexical constraints (after the tab in tests/parity_driver.py)
        wanted = [["W3"], ["W7", "W6"], ["W8"]]
        assert {i for i, _ in hyps} == {0, 1, 2}  # up to --nbest 2 each: a constrained beam may finish fewer
        for i, tokens in hyps:
            positions = [tokens.index(w) for w in wanted[i]]
            assert positions == sorted(positions), (tokens, wanted[i])
    elif case == "validate":
        pass  # fairseq-validate logs the loss; finishing without error is the case
    elif case == "prune_train":
        pass  # the pruned model is checked by prune_train_generate
    else:  # diverse beam, pruned models
        assert {i for i, _ in hyps} == test_ids
