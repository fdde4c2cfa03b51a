"""TorchScript export, as fairseq's tests/test_export.py and test_sequence_generator.py do it: every family's
model and fairseq's SequenceGenerator script, survive save/load, and translate exactly like the eager model;
a family that cannot be scripted (DCA, the other layer-stack families, the SiteResidual wiring baselines) refuses
with a clear error instead of a compiler trace. The same per axis choice of ``residual_axes`` (as each choice
declares in ``scripts``), over each choice alone and a sample of combinations (tests/grid_sample.py; the whole grid
with ALL_FAMILIES=1)."""

import io
import os

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.axes import tables
from fairseq_plugins.axes.grid import AXES
from fairseq_plugins.modules.layer_stack import TorchScriptUnsupportedError

from .grid_sample import axis_flags, choice_sample, combo_id
from .helpers import TinyTask, build_model, random_batch

# every family and fairseq's transformer as the Pre-LN baseline (transformer_postln is the same class);
# "normformer_fairseq" is normformer_e6d6 with --normformer-impl fairseq (its layers script, the paper's do not)
ARCHS = ["residual_e6d6", "crossformer_sg_e6d6", "crossformer_hg_e6d6", "crossformer_all_e16d6", "dca_e6d6",
         "dca_k2_e6d6", "transformer_preln_e6d6", "deepnet_e6d6", "tfixup_e6d6", "normformer_fairseq", "admin_e6d6",
         "b2t_e6d6", "normformer_e6d6", "denseformer_e6d6", "dlcl_e6d6", "laurel_rw_e6d6", "laurel_lr_e6d6",
         "laurel_pa_e6d6", "hc_static_e6d6", "hc_dynamic_e6d6"]  # fmt: skip
# every crossformer_hg arch is built with every block tied (--tying all) at SHAPE's depth: crossformer_all_e16d6 (the
# crossformer_hg model with the preset default --tying all) is then crossformer_hg_e6d6's model, argument for argument
# and weight for weight (test_same_model_as_crossformer_hg_tied_everywhere), so CI scripts it once (both with
# ALL_FAMILIES=1)
SAME_AS = {"crossformer_all_e16d6": "crossformer_hg_e6d6"}
if os.environ.get("ALL_FAMILIES") != "1":
    ARCHS = [a for a in ARCHS if a not in SAME_AS]
# 3 + 3 layers: odd and even t for Crossformer's pairs, and a middle layer for k-DCA
SHAPE = ["--encoder-layers", "3", "--decoder-layers", "3"]


def script_and_reload(module):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def refused_class(axis: str, choice, model_class: str = "AxesTransformerModel") -> str | None:
    """The class TorchScriptUnsupportedError names for a choice that declares it does not script (``scripts``),
    None for one that scripts. A residual choice's refusal is the model's own __prepare_scriptable__ (its layers
    record residual sites with try/finally and **kwargs), which runs before its encoder's; an aggregation's is its
    encoder's (the layer-stack aggregations thread state through hooks)."""
    if choice.scripts is None:
        return None
    if axis == "residual":
        return model_class
    if axis == "depth_aggregation":
        return choice.stacks()[0].__name__
    raise AssertionError(f"{choice.label()} declares it does not script: say here which class refuses on its axis")


# per axis choice of residual_axes, as declared: None = it scripts, else the class the error names. A combination
# scripts when all its choices do; else the first refusing choice in axis order names the class
TORCHSCRIPT: dict[str, dict[str, str | None]] = {
    axis: {name: refused_class(axis, choice) for name, choice in table.items()} for axis, table in tables().items()
}
SAMPLE = choice_sample()
# the one-choice combinations whose model a family test above builds: an alias class of AxesTransformerModel that
# only sets the preset's defaults (families.py _register_alias), with the same plan, arguments and weights, which that
# test scripts and decodes with the scripted generator too; test_family_tests_build_these_combinations holds it
FAMILY_OF_COMBO = {"resi-dual/none/none/layernorm": "residual_e6d6", "deepnet/none/none/layernorm": "deepnet_e6d6",
                   "tfixup/none/none/layernorm": "tfixup_e6d6"}  # fmt: skip
COMBOS = [c for c in SAMPLE if combo_id(c) not in FAMILY_OF_COMBO]


def refusal_of(model) -> str | None:
    """The class a built model's refusal names (its alias class for a legacy family), None where it scripts:
    fairseq's own transformer, or a model whose every choice scripts."""
    plan = getattr(model, "plan", None)
    choices = zip(AXES, plan.choices(), strict=True) if plan is not None else ()
    return next((c for c in (refused_class(a, choice, type(model).__name__) for a, choice in choices) if c), None)


def check_scripts_or_refuses(model, task, refuses: str | None, script_generator: bool = True, why: str = ""):
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=8)
    src, lengths, prev = random_batch(model, batch=3, src_len=7)
    if refuses:
        # not scriptable yet: a clear refusal naming the class, before any compiling, for the generator too
        for module in (model, generator):
            with pytest.raises(TorchScriptUnsupportedError, match=f"{refuses} cannot be exported with TorchScript"):
                torch.jit.script(module)
        with pytest.raises(TorchScriptUnsupportedError) as err:
            torch.jit.script(model)
        assert why in str(err.value)  # the declared reason
        return
    scripted_model = script_and_reload(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted_model(src, lengths, prev)[0], model(src, lengths, prev)[0])
    if not script_generator:
        return

    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    # the scripted beam search without the graph executor's optimizing passes: they specialize each graph for the
    # shapes of every decoding step (~5 s of profiling and re-optimizing, for one call); what the exported code
    # computes is the same, and the model's forward above ran with them
    with torch.no_grad(), torch.jit.optimized_execution(False):
        eager = generator.forward(sample)
        scripted = torch.jit.script(generator).forward(sample)
    for eager_hypos, scripted_hypos in zip(eager, scripted, strict=True):
        assert [h["tokens"].tolist() for h in scripted_hypos] == [h["tokens"].tolist() for h in eager_hypos]
        torch.testing.assert_close(
            torch.stack([h["score"] for h in scripted_hypos]), torch.stack([h["score"] for h in eager_hypos])
        )


def arch_and_options(arch: str) -> tuple[str, list[str]]:
    # every block guided (soft, crossformer_sg) or tied (hard, crossformer_hg and crossformer_all)
    extra = ["--guidance" if arch.startswith("crossformer_sg") else "--tying", "all"] if arch.startswith("crossformer") else []
    if arch == "normformer_fairseq":
        arch, extra = "normformer_e6d6", ["--normformer-impl", "fairseq"]
    return arch, SHAPE + extra


@pytest.mark.parametrize("arch", ARCHS)
def test_scripted_model_and_generator_translate_like_the_eager_model(arch):
    task = TinyTask()
    arch, options = arch_and_options(arch)
    model = build_model(arch, options, task=task)
    check_scripts_or_refuses(model, task, None if options != SHAPE else refusal_of(model))


@pytest.mark.parametrize("arch", sorted(SAME_AS))
def test_same_model_as_crossformer_hg_tied_everywhere(arch):
    """The arch CI leaves to another's test builds that arch's model: same class, arguments and weights."""
    (a, a_options), (b, b_options) = arch_and_options(arch), arch_and_options(SAME_AS[arch])
    task = TinyTask()
    model, other = build_model(a, a_options, task=task), build_model(b, b_options, task=task)
    assert type(model) is type(other) and vars(model.args) == {**vars(other.args), "arch": a}
    x, y = model.state_dict(), other.state_dict()
    assert list(x) == list(y) and all(torch.equal(x[k], y[k]) for k in x)


def test_every_axis_choice_states_what_torchscript_does():
    undeclared = [c.label() for table in tables().values() for c in table.values() if not isinstance(c.scripts, str | None)]
    assert not undeclared, f"declare scripts (None or the reason) on these choices: {undeclared}"



@pytest.mark.parametrize("combo_name", sorted(FAMILY_OF_COMBO))
def test_family_tests_build_these_combinations(combo_name):
    """The combinations left to the family tests: still in the sample, and the family's model is the combination's."""
    combo = next((c for c in SAMPLE if combo_id(c) == combo_name), None)
    assert combo is not None, f"{combo_name} is no longer in the sample: drop it from FAMILY_OF_COMBO"
    arch = FAMILY_OF_COMBO[combo_name]
    assert arch in ARCHS
    task = TinyTask()
    family, axes = build_model(arch, SHAPE, task=task), build_model("residual_axes", SHAPE + axis_flags(combo), task=task)
    # the alias adds its docstring and architecture defaults, fairseq's register_model its config class, and
    # TorchScript, once it has scripted the class, its annotations
    assert type(family).__bases__ == (type(axes),)
    assert set(vars(type(family))) <= {"__doc__", "__module__", "architecture", "__dataclass", "__annotations__"}
    assert family.plan.choices() == axes.plan.choices() and refusal_of(family) is refusal_of(axes) is None
    assert vars(family.args) == {**vars(axes.args), "arch": arch}
    a, b = family.state_dict(), axes.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("combo", COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_axis_combinations_script_or_refuse_as_their_choices_say(combo):
    task = TinyTask()
    refusing = next((axis for axis in AXES if TORCHSCRIPT[axis][combo[axis]]), None)
    refuses = TORCHSCRIPT[refusing][combo[refusing]] if refusing else None
    # the model's refusal says "the layers of --residual X record ...", the choice declares "its layers record ..."
    why = tables()[refusing][combo[refusing]].scripts.removeprefix("its layers ") if refusing else ""
    # the scripted generator (3-4 s each) is the family test's: a choice that scripts changes no decoding code
    model = build_model("residual_axes", SHAPE + axis_flags(combo), task=task)
    check_scripts_or_refuses(model, task, refuses, script_generator=False, why=why)
