"""Activation checkpointing (fairseq's ``--checkpoint-activations``) for the 2024-26 choices: where a layer is a
function of its inputs alone, recomputing it in backward gives the same gradients; where the layers share a
state across the stack (AttnRes's blocks, MUDD's outputs, the value residual's v_1), the option is refused
when the model is built, naming it and the choice, for translation and language models alike. Which is which is
each choice's declaration (``activation_checkpointing``), over the presets of the 2024-26 ideas (models/families.py
NEW_IDEAS); the older families are checked in their own test files (test_agg_baselines, test_norm_baselines,
test_residual, test_dca), and every declared refusal's message in tests/test_declarations.py."""

import pytest
import torch

from fairseq_plugins.axes import declarations
from fairseq_plugins.models.families import NEW_IDEAS
from fairseq_plugins.validation import PluginOptionError

from .helpers import build_model, parameter_gradients, random_batch
from .lm_helpers import binarize_lm, build_lm, make_lm_corpus
from .new_ideas_common import randomize_

DEPTH = ["--encoder-layers", "3", "--decoder-layers", "2", "--dropout", "0"]


def refusing_choice(settings: dict) -> type | None:
    """The first choice a preset sets that declares it refuses activation checkpointing, None if none does."""
    tables = declarations()
    chosen = [tables[option][value] for option, value in settings.items() if option in tables]
    return next((c for c in chosen if c.activation_checkpointing is not None), None)


# each new idea's preset: its layers are recomputed with the same gradients, or the choice that refuses is named
STATELESS = [f"{prefix}_e6d6" for prefix, settings in NEW_IDEAS.items() if refusing_choice(settings) is None]
SHARED_STATE = {f"{prefix}_e6d6": refusing_choice(settings).label() for prefix, settings in NEW_IDEAS.items()
                if refusing_choice(settings) is not None}  # fmt: skip


@pytest.mark.parametrize("arch", STATELESS)
def test_checkpointed_layers_give_the_same_gradients(arch):
    reference = build_model(arch, DEPTH).train()
    randomize_(reference, scale=0.1)  # off the identities at init (ReZero's zeros, LayerScale's small gains)
    checkpointed = build_model(arch, [*DEPTH, "--checkpoint-activations"]).train()
    checkpointed.load_state_dict(reference.state_dict())
    batch = random_batch(reference)
    grads = [parameter_gradients(model, batch) for model in (reference, checkpointed)]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", sorted(SHARED_STATE))
@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
def test_shared_state_refuses_checkpointing(arch, flag):
    with pytest.raises(PluginOptionError, match=f"{flag} cannot be used with {SHARED_STATE[arch]}"):
        build_model(arch, [*DEPTH, flag])


@pytest.fixture(scope="module")
def lm_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_corpus")
    return binarize_lm(make_lm_corpus(root / "raw", sizes=(("train", 40), ("valid", 8), ("test", 8))), root / "bin")


@pytest.mark.parametrize("arch", [a.replace("_e6d6", "_lm_d6") for a in sorted(SHARED_STATE)])
def test_shared_state_refuses_checkpointing_as_a_language_model(lm_bin, arch):
    with pytest.raises(PluginOptionError, match="--checkpoint-activations cannot be used"):
        build_lm(lm_bin, arch, ["--checkpoint-activations"])
