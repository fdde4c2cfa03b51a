"""TorchScript export, as fairseq's tests/test_export.py and test_sequence_generator.py do it: every family's
model and fairseq's SequenceGenerator script, survive save/load, and translate exactly like the eager model;
a family that cannot be scripted (DCA, for now) refuses with a clear error instead of a compiler trace."""

import io

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.models.layer_stack import TorchScriptUnsupportedError

from .helpers import TinyTask, build_model, random_batch

# the residual/Crossformer/DCA families and fairseq's transformer as the Pre-LN baseline (transformer_postln is
# the same class); the wiring baselines of models/norm_baselines.py are not covered here yet
ARCHS = ["residual_e6d6", "crossformer_sg_e6d6", "crossformer_hg_e6d6", "crossformer_all_e16d6", "dca_e6d6",
         "dca_k2_e6d6", "transformer_preln_e6d6"]  # fmt: skip
# 3 + 3 layers: odd and even t for Crossformer's pairs, and a middle layer for k-DCA
SHAPE = ["--encoder-layers", "3", "--decoder-layers", "3"]


def script_and_reload(module):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


@pytest.mark.parametrize("arch", ARCHS)
def test_scripted_model_and_generator_translate_like_the_eager_model(arch):
    task = TinyTask()
    model = build_model(arch, SHAPE + (["--guidance", "all"] if arch.startswith("crossformer") else []), task=task)
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=8)
    src, lengths, prev = random_batch(model, batch=3, src_len=7)
    try:
        scripted_model = script_and_reload(model)
    except TorchScriptUnsupportedError as err:
        # DCA's layer loop is not scriptable yet: a clear refusal naming the class, for the generator too
        assert arch.startswith("dca") and "cannot be exported with TorchScript" in str(err), err
        with pytest.raises(TorchScriptUnsupportedError, match="DCAEncoder cannot be exported"):
            torch.jit.script(generator)
        return
    with torch.no_grad():
        torch.testing.assert_close(scripted_model(src, lengths, prev)[0], model(src, lengths, prev)[0])

    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        eager = generator.forward(sample)
        scripted = torch.jit.script(generator).forward(sample)
    for eager_hypos, scripted_hypos in zip(eager, scripted, strict=True):
        assert [h["tokens"].tolist() for h in scripted_hypos] == [h["tokens"].tolist() for h in eager_hypos]
        torch.testing.assert_close(
            torch.stack([h["score"] for h in scripted_hypos]), torch.stack([h["score"] for h in eager_hypos])
        )
