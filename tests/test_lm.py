"""Every family as a decoder-only language model, in process: build, one training step, incremental == full
decoding, fairseq's eval-lm perplexity, and sampling / beam search through the hub interface. The families come
from the translation preset table, so a family registered later joins these tests by itself; CI runs every family
but a combination of choices other families hold (tests/grid_sample.py's choice_families: its layers are theirs),
every family with ALL_FAMILIES=1. The tests that leave the model as it is (decoding, eval-lm, the hub's checkpoint)
share one build per family; the training step builds its own."""

import math

import pytest
import torch
from fairseq.models.transformer_lm import TransformerLanguageModel
from fairseq_cli.eval_lm import eval_lm

from fairseq_plugins.lm import LM_FAMILIES
from fairseq_plugins.lm.scoring import perplexity, sentence_log_likelihoods

from .grid_sample import choice_families
from .lm_helpers import (
    assert_incremental_equals_full,
    binarize_lm,
    build_lm,
    make_lm_corpus,
    save_checkpoint,
    train_batch,
)

FAMILIES = choice_families(sorted(LM_FAMILIES))
# training options a family needs beyond the defaults (its own criterion)
TRAIN_ARGS = {"crossformer_sg": ["--criterion", "label_smoothed_cross_entropy_with_guidance"]}


@pytest.fixture(scope="module")
def lm_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_corpus")
    return binarize_lm(make_lm_corpus(root / "raw"), root / "bin")


@pytest.fixture(scope="module")
def built_lms(lm_bin):
    """family -> (model in eval mode, task, args), built once for the tests that do not change the model."""
    cache: dict[str, tuple] = {}

    def get(family: str):
        if family not in cache:
            cache[family] = build_lm(lm_bin, arch(family))
        return cache[family]

    return get


def arch(family: str) -> str:
    return f"{family}_lm_d6"


def finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_step_is_finite(family, lm_bin):
    model, task, args = build_lm(lm_bin, arch(family), TRAIN_ARGS.get(family, []))
    criterion = task.build_criterion(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    loss, sample_size, logging = criterion(model, train_batch(task))
    loss.backward()
    optimizer.step()
    assert math.isfinite(float(loss)) and sample_size > 0
    assert finite(p.grad for p in model.parameters() if p.grad is not None)
    assert finite(model.parameters())
    if family == "crossformer_sg":
        assert float(logging["guidance_loss"]) > 0  # the family's regularizer reached the criterion


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decoding_equals_full(family, built_lms):
    model, task, _ = built_lms(family)
    assert_incremental_equals_full(model, task)


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_lm_perplexity_is_finite(family, built_lms):
    model, task, _ = built_lms(family)
    task.load_dataset("valid")
    itr = task.eval_lm_dataloader(task.dataset("valid"), max_tokens=512, num_workers=0)
    result = eval_lm([model], task.source_dictionary, itr)
    ppl = float(result["perplexity"])
    assert math.isfinite(ppl) and ppl > 1
    # the per-sentence scores (for paired tests) add up to eval-lm's perplexity
    scores = sentence_log_likelihoods(model, task, "valid")
    assert len(scores) == len(task.dataset("valid"))
    assert perplexity(scores) == pytest.approx(ppl, rel=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_hub_sample_and_beam(family, lm_bin, built_lms, tmp_path):
    model, task, args = built_lms(family)
    save_checkpoint(model, args, tmp_path / "checkpoint.pt")
    hub = TransformerLanguageModel.from_pretrained(str(tmp_path), "checkpoint.pt", data_name_or_path=str(lm_bin))
    loaded = hub.models[0]
    assert type(loaded) is type(model)
    tokens = torch.tensor([[task.source_dictionary.eos(), 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens)[0], model(tokens)[0], atol=0, rtol=0)
    torch.manual_seed(0)
    sampled = hub.sample("w1 w2", sampling=True, sampling_topk=5, max_len_b=6)
    beam = hub.sample("w1 w2", beam=2, max_len_b=6)
    for text in (sampled, beam):
        assert text.startswith("w1 w2") and len(text.split()) <= 2 + 6
