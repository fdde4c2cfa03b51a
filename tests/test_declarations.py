"""Every choice of every axis table (and ``--value-residual``'s) declares each capability itself (``axes.CAPABILITIES``:
paper, code, preset, pruning, TorchScript, activation checkpointing, double backward, float32, speed), with a
value of the right type; its preset sets it; a declared refusal of activation checkpointing is the error the
model raises.

Where a capability may come from: the choice's own class, or the choice it is a variant of (``dca-k`` from
``dca``, ``laurel-rw`` from LAuReL, ``hc-static`` from Hyper-Connections, ``mhc-lite`` from mHC, the tying
blocks from ``key-query``): the same modules, so the same facts unless the variant overrides one. Never from an
axis base class (``Choice``, ``Residual``, ``Aggregation``, ``Norm``, ``Tying``, the residual-site base, ...,
all with an empty ``name``): those hold ``UNDECLARED``, and a value a new choice took from them silently would
claim that a new idea prunes, scripts and checkpoints like its axis's first choice."""

import pytest
from torch import nn

from fairseq_plugins.axes import CAPABILITIES, UNDECLARED, Speed, declarations
from fairseq_plugins.models.axes_transformer import MODEL
from fairseq_plugins.models.baselines import BASELINE_MODEL
from fairseq_plugins.models.presets import DEPTHS, PRESETS
from fairseq_plugins.validation import PluginOptionError

from .helpers import build_model, parse_model_args

TABLES = declarations()
CHOICES = [(axis, choice) for axis, table in TABLES.items() for choice in table.values()]
IDS = [f"{axis}={choice.name}" for axis, choice in CHOICES]
REASONS = ("prunes", "scripts", "activation_checkpointing", "double_backward")  # None, or why not
METRICS, OPS = ("train", "decode", "memory", "train_flat"), (">=", "<=", "<")
DEFAULTS = {axis: next(iter(table)) for axis, table in TABLES.items()}  # each table's first choice is its default


def owner(choice: type, attribute: str) -> type:
    """The class of ``choice``'s MRO whose body sets ``attribute``."""
    return next(cls for cls in choice.__mro__ if attribute in vars(cls))


def test_the_defaults_are_each_tables_first_choice():
    assert DEFAULTS == {"residual": "pre", "depth_aggregation": "none", "tying": "none", "norm": "layernorm",
                        "value_residual": "none"}  # fmt: skip


@pytest.mark.parametrize("axis, choice", CHOICES, ids=IDS)
def test_every_capability_is_declared_by_the_idea_not_inherited_from_its_axis(axis, choice):
    assert choice.axis == axis and TABLES[axis][choice.name] is choice
    for attribute in CAPABILITIES:
        value, source = getattr(choice, attribute), owner(choice, attribute)
        assert value is not UNDECLARED and source.name, (
            f"{choice.label()} takes {attribute} from the axis base {source.__name__}: declare it on the choice "
            "(fairseq_plugins/axes/__init__.py, CAPABILITIES)"
        )


@pytest.mark.parametrize("axis, choice", CHOICES, ids=IDS)
def test_every_capability_has_the_declared_type(axis, choice):
    label = choice.label()
    assert isinstance(choice.paper, str) and isinstance(choice.code, str), label
    assert choice.paper == "" or choice.paper.startswith("https://") or choice.paper[0].isupper(), label
    assert choice.code == "" or choice.code.startswith("https://github.com/"), label
    for attribute in REASONS:  # a reason is the text after the colon of an error: no trailing full stop
        reason = getattr(choice, attribute)
        assert reason is None or (isinstance(reason, str) and reason.strip() == reason and reason
                                   and not reason.endswith(".")), (label, attribute, reason)  # fmt: skip
    assert isinstance(choice.float32, tuple), label
    for item in choice.float32:
        assert (isinstance(item, type) and issubclass(item, nn.Module)) or (isinstance(item, str) and item), (label, item)
    assert isinstance(choice.speed, tuple), label
    for bound in choice.speed:
        assert isinstance(bound, Speed) and bound.metric in METRICS and bound.op in OPS, (label, bound)
        assert isinstance(bound.bound, float) and bound.bound > 0 and bound.depth in (None, *DEPTHS), (label, bound)
    assert choice.preset is None or isinstance(choice.preset, str), label
    assert choice.preset is not None or not choice.speed, f"{label}: a speed target is measured on its preset"


PRESETED = [(axis, choice) for axis, choice in CHOICES if choice.preset is not None]


@pytest.mark.parametrize("axis, choice", PRESETED, ids=[f"{a}={c.name}" for a, c in PRESETED])
def test_the_declared_preset_sets_the_choice_on_the_defaults(axis, choice):
    """The preset is the choice alone: every other table at its default (fairseq's own Pre-LN and Post-LN
    transformers, the benchmark's baselines, stand for ``--residual pre`` and ``post``)."""
    arch = next((a for a, p in PRESETS.items() if p.family == choice.preset), None)
    assert arch, f"{choice.label()}: no preset of family {choice.preset}"
    args = parse_model_args(arch)
    if PRESETS[arch].model == BASELINE_MODEL:
        assert axis == "residual" and bool(args.encoder_normalize_before) == choice.pre_ln, arch
        return
    want = {**DEFAULTS, axis: choice.name}
    got = {a: getattr(args, a, None) or DEFAULTS[a] for a in TABLES}  # --value-residual is filled at build time
    assert got == want, arch


REFUSING = [(axis, choice) for axis, choice in CHOICES if choice.activation_checkpointing is not None]


@pytest.mark.parametrize("axis, choice", REFUSING, ids=[f"{a}={c.name}" for a, c in REFUSING])
@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
def test_a_declared_checkpointing_refusal_is_the_models_error(axis, choice, flag):
    shape = ["--encoder-layers", "2", "--decoder-layers", "2", f"--{axis.replace('_', '-')}", choice.name]
    with pytest.raises(PluginOptionError) as err:
        build_model(MODEL, [*shape, flag])
    assert str(err.value) == f"{flag} cannot be used with {choice.label()}: {choice.activation_checkpointing}"
