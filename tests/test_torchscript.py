"""TorchScript export, as fairseq's tests/test_export.py and test_sequence_generator.py do it: every family's
model and fairseq's SequenceGenerator script, survive save/load, and translate exactly like the eager model;
a family that cannot be scripted (DCA, the other layer-stack families, the SiteResidual wiring baselines) refuses
with a clear error instead of a compiler trace. The same per axis choice of ``residual_axes`` (TORCHSCRIPT says
what each choice does), over each choice alone and a sample of combinations (tests/grid_sample.py; the whole grid
with ALL_FAMILIES=1)."""

import io

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.axes import tables
from fairseq_plugins.axes.grid import AXES
from fairseq_plugins.models.layer_stack import TorchScriptUnsupportedError

from .grid_sample import axis_flags, choice_sample, combo_id
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


# per axis choice of residual_axes: None = it scripts, else the class TorchScriptUnsupportedError names. A
# combination scripts when all its choices do; else the first refusing choice in axis order names the class (the
# wiring's refusal is the model's own __prepare_scriptable__, which runs before its encoder's). The layers of
# admin, b2t and normformer record residual sites with try/finally and **kwargs; the layer-stack aggregations
# thread state through hooks (docs/layer_pruning_torchscript.md).
LAYER_STACK = {"dca": "DCAEncoder", "dca-k": "DCAEncoder", "denseformer": "DenseFormerEncoder", "dlcl": "DLCLEncoder",
               "laurel-rw": "LaurelEncoder", "laurel-lr": "LaurelEncoder", "laurel-pa": "LaurelEncoder",
               "hc-static": "HCEncoder", "hc-dynamic": "HCEncoder"}  # fmt: skip
TORCHSCRIPT: dict[str, dict[str, str | None]] = {
    "residual": {"pre": None, "post": None, "resi-dual": None, "deepnet": None, "tfixup": None, "mix": None,
                 **{name: "AxesTransformerModel" for name in ("admin", "b2t", "normformer", "layerscale", "rezero",
                                                              "orthogonal", "peri", "hybrid")}},
    "depth_aggregation": {"none": None, **LAYER_STACK, "mhc": "MHCEncoder", "mhc-lite": "MHCEncoder",
                          "attnres": "AttnResEncoder", "attnres-block": "AttnResEncoder", "frac": "FracEncoder",
                          "mudd": "MUDDEncoder"},
    "tying": {"none": None, "key-query": None, "ffn": None, "value": None, "all": None},
    "norm": {"layernorm": None, "rmsnorm": None, "dyt": None, "derf": None},
}  # fmt: skip
SAMPLE = choice_sample()


def check_scripts_or_refuses(model, task, refuses: str | None, script_generator: bool = True):
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=8)
    src, lengths, prev = random_batch(model, batch=3, src_len=7)
    if refuses:
        # not scriptable yet: a clear refusal naming the class, before any compiling, for the generator too
        for module in (model, generator):
            with pytest.raises(TorchScriptUnsupportedError, match=f"{refuses} cannot be exported with TorchScript"):
                torch.jit.script(module)
        return
    scripted_model = script_and_reload(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted_model(src, lengths, prev)[0], model(src, lengths, prev)[0])
    if not script_generator:
        return

    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        eager = generator.forward(sample)
        scripted = torch.jit.script(generator).forward(sample)
    for eager_hypos, scripted_hypos in zip(eager, scripted, strict=True):
        assert [h["tokens"].tolist() for h in scripted_hypos] == [h["tokens"].tolist() for h in eager_hypos]
        torch.testing.assert_close(
            torch.stack([h["score"] for h in scripted_hypos]), torch.stack([h["score"] for h in eager_hypos])
        )


@pytest.mark.parametrize("arch", ARCHS)
def test_scripted_model_and_generator_translate_like_the_eager_model(arch):
    task = TinyTask()
    extra = ["--guidance", "all"] if arch.startswith("crossformer") else []
    if arch == "normformer_fairseq":
        arch, extra = "normformer_e6d6", ["--normformer-impl", "fairseq"]
    check_scripts_or_refuses(build_model(arch, SHAPE + extra, task=task), task, None if extra else REFUSES.get(arch))


def test_every_axis_choice_states_what_torchscript_does():
    stated = {axis: set(TORCHSCRIPT.get(axis, {})) for axis in AXES}
    missing = {axis: sorted(set(table) - stated[axis]) for axis, table in tables().items() if set(table) - stated[axis]}
    assert not missing, f"say in TORCHSCRIPT whether these choices script (and check the docs page): {missing}"


@pytest.mark.parametrize("combo", SAMPLE, ids=[combo_id(c) for c in SAMPLE])
def test_axis_combinations_script_or_refuse_as_their_choices_say(combo):
    task = TinyTask()
    refuses = next((TORCHSCRIPT[axis][combo[axis]] for axis in AXES if TORCHSCRIPT[axis][combo[axis]]), None)
    # the scripted generator (3-4 s each) is the family test's: a choice that scripts changes no decoding code
    model = build_model("residual_axes", SHAPE + axis_flags(combo), task=task)
    check_scripts_or_refuses(model, task, refuses, script_generator=False)
