"""TorchScript export, as fairseq's tests/test_export.py and test_sequence_generator.py do it: every family's
model and fairseq's SequenceGenerator script, survive save/load, and translate exactly like the eager model;
a family that cannot be scripted (DCA, the other layer-stack families, the SiteResidual wiring baselines) refuses
with a clear error instead of a compiler trace."""

import io

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.models.layer_stack import TorchScriptUnsupportedError

from .helpers import TinyTask, build_model, random_batch

# every family and fairseq's transformer as the Pre-LN baseline (transformer_postln is the same class);
# "normformer_fairseq" is normformer_e6d6 with --normformer-impl fairseq (its layers script, the paper's do not)
ARCHS = ["residual_e6d6", "crossformer_sg_e6d6", "crossformer_hg_e6d6", "crossformer_all_e16d6", "dca_e6d6",
         "dca_k2_e6d6", "transformer_preln_e6d6", "deepnet_e6d6", "tfixup_e6d6", "normformer_fairseq", "admin_e6d6",
         "b2t_e6d6", "normformer_e6d6", "denseformer_e6d6", "dlcl_e6d6", "laurel_rw_e6d6", "laurel_lr_e6d6",
         "laurel_pa_e6d6", "hc_static_e6d6", "hc_dynamic_e6d6"]  # fmt: skip
# the families that refuse, and the class the error names (the first module torch.jit.script prepares)
REFUSES = {"dca_e6d6": "DCAEncoder", "dca_k2_e6d6": "DCAEncoder", "admin_e6d6": "AdminTransformerModel",
           "b2t_e6d6": "B2TTransformerModel", "normformer_e6d6": "NormFormerTransformerModel",
           "denseformer_e6d6": "DenseFormerEncoder", "dlcl_e6d6": "DLCLEncoder", "laurel_rw_e6d6": "LaurelEncoder",
           "laurel_lr_e6d6": "LaurelEncoder", "laurel_pa_e6d6": "LaurelEncoder", "hc_static_e6d6": "HCEncoder",
           "hc_dynamic_e6d6": "HCEncoder"}  # fmt: skip
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
    extra = ["--guidance", "all"] if arch.startswith("crossformer") else []
    if arch == "normformer_fairseq":
        arch, extra = "normformer_e6d6", ["--normformer-impl", "fairseq"]
    model = build_model(arch, SHAPE + extra, task=task)
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=8)
    src, lengths, prev = random_batch(model, batch=3, src_len=7)
    if arch in REFUSES and not extra:
        # not scriptable yet: a clear refusal naming the class, before any compiling, for the generator too
        for module in (model, generator):
            with pytest.raises(TorchScriptUnsupportedError, match=f"{REFUSES[arch]} cannot be exported with TorchScript"):
                torch.jit.script(module)
        return
    scripted_model = script_and_reload(model)
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
