"""The axes of the composed model ``residual_axes``: every residual idea is one choice on one axis.

    --residual           how a sublayer's output joins the stream        axes/residual.py
    --depth-aggregation  how a layer reads the earlier layers            axes/aggregation.py
    --tying              which weights adjacent layers share             axes/tying.py
    --norm               the normalisation function                       axes/norm.py

Each axis is a table ``name -> Choice subclass`` (``AXES``); a choice is a small class whose methods the
composed model (models/axes_transformer.py) calls at fixed points of the build:

    choice.add_args(parser)      its own options (help names the source, the range is validated)
    choice.defaults(args)        fill its options' defaults (presets and the command line win)
    choice.check(args)           validate its options on the built model's args, naming the option
    ...axis-specific hooks, documented in each axis module...

A choice's own options are declared in ``options``, a tuple of ``Option`` (name, check and its bounds, default,
help naming the source); the three methods above serve them, and a choice overrides a method only for what an
option cannot say (a default that depends on the choice, a check across options).

Adding an idea = one module with its nn.Modules (in ``fairseq_plugins/modules/``) + one Choice subclass in
the axis file + one entry in that file's list of its choices. The foundations (``Option``, ``Choice``, ``Plan``, the
capabilities) are in ``choice.py``, which the axis modules import; this package imports the axis modules and
assembles their tables, so no import runs back up. Two choices that cannot run together are refused by
``check_compatible`` when the model is built, with one error that names both choices and the reason: each
choice declares which parts of the model it *owns* (``owns``); two choices owning the same part conflict,
unless a rule below says how they compose. The parts:

    "stream"   the carry between layers (layer_stack.py's begin_layers/run_layer/end_layers): ResiDual's
               dual stream, the depth stack of DCA/DenseFormer/DLCL, LAuReL's history, the n streams of
               hyper-connections.
    "layer"    the layer's forward: a residual choice that builds its own layer class (DeepNet, Admin, ...).
               An aggregation choice whose layers read their inputs differently (DCA, hyper-connections) builds
               them (``own_layers``) without owning the part: a residual choice whose update is a function of
               each branch alone changes their branches (``branch_change``), and the others declare what they
               do to the stream at the sum (``stream_site``), which such an aggregation refuses (its ``conflict``).

Every other fact about a choice is declared on it, once, as a class attribute (``CAPABILITIES``); the tests, the
precision module, the benchmark's targets and the generated docs read them (``declarations()``) instead of
keeping their own tables:

    paper       the paper: an arXiv (or venue) link, or its title where no link is known; "" for none
    code        the authors' code: a repository URL, "" where they published none (or none is known here)
    preset      the named family (arch-name prefix of models/families.py) that is this choice on the Pre-LN
                defaults, the name the benchmark measures and the tests build; None: no such preset
    prunes      None: fairseq's --*-layers-to-keep keeps every kept layer's weights; else why it is refused
                (the text after the colon of the error, which names the option and the choice)
    scripts     None: the model compiles with torch.jit.script; else why not (TorchScriptUnsupportedError
                names the class)
    activation_checkpointing
                None: --checkpoint-activations recomputes each layer with the same gradients; else why it is
                refused (the text after the colon of ``refuse_checkpointing``'s error)
    double_backward
                None: autograd's own second derivative (create_graph=True) holds; else which hand-written
                backward has none (it raises "no second derivative" naming its module)
    float32     what stays float32 in half precision: nn.Module classes that precision.py runs in float32 with
                autocast off under --autocast-dtype (every instance, wherever built), and strings naming
                computations the choice's own modules keep in float32 themselves (under --fp16 too)
    speed       the benchmark's bounds on this choice's ratio to the matched Pre-LN baseline (``Speed``; the
                classes ``KEEPS_PACE``, ``AGGREGATES``, ``MATCHES``), measured as its ``preset``; () = no target

None of them is inherited from an abstract base (``Choice``, ``Residual``, ``Aggregation``, ...): those hold
``UNDECLARED``, so a new choice that forgets one fails tests/test_declarations.py rather than silently taking
a neighbour's value. A choice may inherit from the choice it is a variant of (``dca-k`` from ``dca``, the
LAuReL, HC, mHC-lite and Block AttnRes variants, the tying choices from ``key-query``...): the same modules,
the same facts, overridden where they differ.
"""

from ..validation import PluginOptionError, check_choice
from .aggregation import LAYER_AGGREGATIONS
from .aggregation_streams import STREAM_AGGREGATIONS
from .choice import (  # noqa: F401  (the package's interface: axis modules, models, scripts and tests read them here)
    AGGREGATES,
    CAPABILITIES,
    KEEPS_PACE,
    MATCHES,
    PART_NAMES,
    UNDECLARED,
    Choice,
    IncompatibleChoices,
    Option,
    Plan,
    Speed,
    drop_if_stored,
    is_set,
    refuse,
    refuse_checkpointing,
    set_defaults,
    set_defaults_since,
)
from .norm import NORMS
from .residual import WIRINGS
from .residual_sites import SITE_RESIDUALS
from .tying import TYINGS, combined_tying
from .value_residual import VALUE_RESIDUALS

# the axes' tables, name -> choice: each axis module lists the choices it declares (a new idea is added there, beside
# its declaration), in the order of the docs and the grid
RESIDUALS: dict[str, type[Choice]] = {c.name: c for c in (*WIRINGS, *SITE_RESIDUALS)}
AGGREGATIONS: dict[str, type[Choice]] = {c.name: c for c in (*LAYER_AGGREGATIONS, *STREAM_AGGREGATIONS)}


def tables() -> dict[str, dict[str, type]]:
    return {"residual": RESIDUALS, "depth_aggregation": AGGREGATIONS, "tying": TYINGS, "norm": NORMS}


def declarations() -> dict[str, dict[str, type]]:
    """Every table of declared choices: the four axes, and ``--value-residual``'s (an option beside them,
    axes/value_residual.py), whose choices declare the same capabilities."""
    return {**tables(), "value_residual": VALUE_RESIDUALS}


def resolve(args) -> Plan:
    """The Plan of ``args`` (every axis set, names checked), or PluginOptionError naming the option."""
    picked = {}
    for axis, table in tables().items():
        value = getattr(args, axis)
        if axis == "tying" and value not in table:
            picked[axis] = combined_tying(value)  # a comma list of blocks, as --guidance takes
            continue
        picked[axis] = table[check_choice(axis, value, tuple(table))]
    return Plan(picked["residual"], picked["depth_aggregation"], picked["tying"], picked["norm"])


def check_compatible(plan: Plan) -> None:
    """Refuse a combination that cannot run, with one error naming both choices and the reason."""
    choices = plan.choices()
    for i, a in enumerate(choices):
        for b in choices[i + 1 :]:
            for part, what in PART_NAMES.items():  # a fixed order: the message must not depend on set order
                if part in a.owns and part in b.owns:
                    refuse(a, b, f"both own the model's {what}")
            for first, second in ((a, b), (b, a)):
                reason = first.conflict(second) if hasattr(first, "conflict") else None
                if reason:
                    refuse(first, second, reason)


def check_unused_options(args, plan: Plan) -> None:
    """Refuse an option (from the command line, a preset or an override) that only a choice the model does not make
    reads: the model would be built without it, silently."""
    used = {option.name for choice in plan.choices() for option in choice.options}
    for axis, table in tables().items():
        owners: dict[str, list[str]] = {}
        for choice in table.values():
            for option in choice.options:
                if option.name not in used and is_set(args, option.name) and not drop_if_stored(args, option.name):
                    owners.setdefault(option.name, []).append(choice.name)
        for name, choices in owners.items():
            flag = "--" + axis.replace("_", "-")
            raise PluginOptionError(
                f"--{name.replace('_', '-')} applies only with {flag} {' or '.join(choices)}, and the model has "
                f"{flag} {getattr(args, axis)}: it would be ignored; drop it or choose one of those"
            )
