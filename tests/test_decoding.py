"""Incremental (cached, one position at a time) decoding must give what full-sequence decoding gives, and
fairseq's beam search must run on every family."""

import pytest
import torch

from .helpers import build_model, full_and_incremental_logits, random_batch

ARCHS = ["residual_e6d6", "transformer_preln_e6d6", "transformer_postln_e6d6"]


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_equals_full_decoding(arch):
    model = build_model(arch)
    full, incremental = full_and_incremental_logits(model, *random_batch(model))
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)
