"""Evaluation after training steps sees the trained parameters, in every family.

fairseq's optimizers update parameters through ``p.data``, which bumps no version counter. Dynamic
hyper-connections and mHC keep tensors derived from their parameters between no-grad passes (a decoding step's
coefficient maths), keyed on storage and version: in a training process every validation after the first reused
the first one's, so the validation loss in training was not the model's (dynamic HC at E12D12, update 800: 5.09 bits
against 4.26 for the same checkpoint in a new process). Here each family takes fairseq Adam steps between
evaluations, switching modes as fairseq's trainer does, and its evaluation (full and incremental) must equal a
fresh model's with the same state. The models have three layers a side (a first, a middle and a last layer, the
least every family runs with: what a layer keeps between passes is the same at its preset's six).
"""

import pytest
import torch
from fairseq.optim.adam import Adam

from fairseq_plugins.models import PRESETS
from fairseq_plugins.modules.parameter_cache import ParameterCache

from .forkserver import run_forked
from .grid_sample import choice_families
from .helpers import (
    PLUGIN_DIR,
    build_model,
    fairseq_cli,
    full_and_incremental_logits,
    random_batch,
    train_command,
    train_log,
)

# every family but a combination of choices other families hold (tests/grid_sample.py: its modules are theirs, so
# any cache it keeps is theirs); every family with ALL_FAMILIES=1
FAMILY_ARCHS = sorted(f"{family}_iwslt_e6d6" for family in choice_families(
    PRESETS[arch].family for arch in PRESETS if arch.endswith("_iwslt_e6d6")))  # fmt: skip


LAYERS = ["--encoder-layers", "3", "--decoder-layers", "3"]


def _evaluate(model, batch):
    model.eval()
    with torch.no_grad():
        return full_and_incremental_logits(model, *batch)


def test_every_family_is_covered():
    families = {PRESETS[arch].family for arch in FAMILY_ARCHS}
    assert {"hc_dynamic", "mhc", "mhc_lite", "transformer_preln"} <= families


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_evaluation_after_fairseq_optimizer_steps_sees_the_trained_parameters(arch):
    model = build_model(arch, LAYERS)
    batch = random_batch(model)
    _evaluate(model, batch)  # as a first validation: fills whatever the family keeps between passes
    optimizer = Adam(model.parameters(), lr=0.05)
    for _ in range(2):
        model.train()  # fairseq's train_step
        optimizer.zero_grad()
        logits, _ = model(*batch)
        logits.float().logsumexp(-1).mean().backward()
        optimizer.step()
    got_full, got_steps = _evaluate(model, batch)

    fresh = build_model(arch, LAYERS)
    fresh.load_state_dict(model.state_dict())
    want_full, want_steps = _evaluate(fresh, batch)
    torch.testing.assert_close(got_full, want_full, rtol=0, atol=0)
    torch.testing.assert_close(got_steps, want_steps, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["hc_dynamic_iwslt_e6d6", "mhc_iwslt_e6d6", "mhc_lite_iwslt_e6d6"])
def test_parameter_changes_in_eval_mode_are_seen(arch):
    """Without a mode switch: load_state_dict and in-place edits under no_grad bump version counters."""
    model, other = build_model(arch, LAYERS), build_model(arch, LAYERS, seed=1)
    batch = random_batch(model)
    _evaluate(model, batch)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(_evaluate(model, batch), _evaluate(other, batch), rtol=0, atol=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
        for p in other.parameters():
            p.mul_(1.5)
    fresh = build_model(arch, LAYERS)
    fresh.load_state_dict(other.state_dict())
    torch.testing.assert_close(_evaluate(model, batch), _evaluate(fresh, batch), rtol=0, atol=0)


def test_fairseq_train_validation_equals_fairseq_validate(corpus_bin, tmp_path):
    """The validation loss fairseq-train logs at its last update is the one fairseq-validate gives its checkpoint
    (the unit tests above cover every family; this is the symptom as fairseq shows it). Each command is a process
    of its own, forked from tests/forkserver.py's server: the validation starts in a new process, as before, without
    importing torch and fairseq again."""
    proc = run_forked(train_command(corpus_bin, tmp_path, "hc_dynamic_e6d6", max_update=6,
                             extra=["--lr", "1e-2", "--validate-interval-updates", "2"]))  # fmt: skip
    last = train_log(proc.stdout + proc.stderr, "valid")[-1]
    assert int(last["valid_num_updates"]) == 6
    proc = run_forked(fairseq_cli("validate") + [
        corpus_bin, "--user-dir", PLUGIN_DIR, "--task", "translation", "--path", tmp_path / "checkpoint_last.pt",
        "--cpu", "--max-tokens", "1000", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--num-workers", "0", "--log-format", "json",
    ])  # fmt: skip
    validated = train_log(proc.stdout + proc.stderr, "valid")[-1]
    assert validated["valid_loss"] == last["valid_loss"]


def test_cache_key():
    p = torch.nn.Parameter(torch.ones(3))
    cache, calls = ParameterCache(), []

    def derive():
        calls.append(1)
        return p.detach() * 2

    assert cache.get([p], derive, torch.float32) is cache.get([p], derive, torch.float32)
    assert len(calls) == 1
    cache.get([p], derive, torch.float64)  # another dtype
    with torch.no_grad():
        p.add_(1)  # bumps the version
    torch.testing.assert_close(cache.get([p], derive, torch.float64), torch.full((3,), 4.0))
    assert len(calls) == 3
    p.data.add_(1)  # fairseq's optimizers: no version bump, so the owning module clears on train()/eval()
    cache.clear()
    torch.testing.assert_close(cache.get([p], derive, torch.float64), torch.full((3,), 6.0))
