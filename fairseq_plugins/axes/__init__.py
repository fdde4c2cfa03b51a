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
the axis file + one entry in that axis's table. Two choices that cannot run together are refused by
``check_compatible`` when the model is built, with one error that names both choices and the reason: each
choice declares which parts of the model it *owns* (``owns``); two choices owning the same part conflict,
unless a rule below says how they compose. The parts:

    "stream"   the carry between layers (layer_stack.py's begin_layers/run_layer/end_layers): ResiDual's
               dual stream, the depth stack of DCA/DenseFormer/DLCL, LAuReL's history, the n streams of
               hyper-connections.
    "layer"    the layer's forward: a residual choice that builds its own layer class (DeepNet, Admin, ...)
               or an aggregation choice whose layers read their inputs differently (DCA, hyper-connections).

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

from collections.abc import Callable
from dataclasses import dataclass

from ..validation import STORED_ARGS, PluginOptionError, argparse_type, check_choice


@dataclass(frozen=True)
class Option:
    """One option of a choice, ``--name`` on the command line and ``args.name`` after parsing.

    ``check`` is a ``validation.check_*`` function, called as ``check(name, value, *bounds)`` both as the
    argparse type and on the built model's args. ``default`` None: no default is filled (the choice fills it,
    or the option stays unset), and an unset option is not checked. ``const`` not None: the flag alone
    (``nargs="?"``) means ``const``.
    """

    name: str
    check: Callable
    bounds: tuple
    default: object
    metavar: str
    help: str
    const: object = None

    def add(self, parser) -> None:
        flag = "--" + self.name.replace("_", "-")
        extra = {} if self.const is None else {"nargs": "?", "const": self.const}
        parser.add_argument(flag, type=argparse_type(self.check, self.name, *self.bounds), **extra,
                            metavar=self.metavar, help=self.help)  # fmt: skip

    def validate(self, args) -> None:
        value = getattr(args, self.name, None)
        if value is not None or self.default is not None:
            setattr(args, self.name, self.check(self.name, value, *self.bounds))


class _Undeclared:
    """The value of a capability no choice has declared yet (module docstring): never a valid declaration."""

    def __repr__(self) -> str:
        return "UNDECLARED"

    def __bool__(self) -> bool:
        raise TypeError("a capability read before its choice declared it (axes/__init__.py: CAPABILITIES)")


UNDECLARED = _Undeclared()


@dataclass(frozen=True)
class Speed:
    """A bound on a choice's ratio to the matched Pre-LN baseline in scripts/benchmark (``Target`` there).

    metric: train / decode (throughput ratio), memory (peak-memory ratio), or train_flat (training ratio at the
    deepest measured depth over the ratio at the shallowest); depth: a depth name, or None for every depth.
    """

    metric: str
    op: str  # ">=", "<=" or "<"
    bound: float
    depth: str | None = None


# issue 27, item 3: ideas that add no matrix products keep pace with Pre-LN at every depth; ideas that aggregate
# several streams or earlier layers reach 0.90 at E12D12; issue 15, item 1: the project's first families match it
KEEPS_PACE = (Speed("train", ">=", 0.97), Speed("decode", ">=", 0.97))
AGGREGATES = (Speed("train", ">=", 0.90, "e12d12"), Speed("decode", ">=", 0.90, "e12d12"))
MATCHES = (Speed("train", ">=", 0.98), Speed("decode", ">=", 0.98))

CAPABILITIES = ("paper", "code", "preset", "prunes", "scripts", "activation_checkpointing", "double_backward",
                "float32", "speed")  # fmt: skip


class Choice:
    """One choice on one axis. Subclasses set the class attributes and override what they need."""

    axis: str = ""  # the option, e.g. "residual"
    name: str = ""  # its value on the command line
    source: str = ""  # the paper (and code) it follows, as its options' help and its errors cite it
    owns: frozenset = frozenset()  # the parts of the model it owns (module docstring)
    options: tuple[Option, ...] = ()  # its own options
    # its capabilities (module docstring): every choice declares each one itself
    paper: str = UNDECLARED
    code: str = UNDECLARED
    preset: str | None = UNDECLARED
    prunes: str | None = UNDECLARED
    scripts: str | None = UNDECLARED
    activation_checkpointing: str | None = UNDECLARED
    double_backward: str | None = UNDECLARED
    float32: tuple = UNDECLARED
    speed: tuple[Speed, ...] = UNDECLARED

    @classmethod
    def add_args(cls, parser) -> None:
        """Add this choice's own options."""
        for option in cls.options:
            option.add(parser)

    @classmethod
    def defaults(cls, args) -> None:
        """Fill this choice's options where neither a preset nor the command line set them."""
        set_defaults(args, {o.name: o.default for o in cls.options if o.default is not None})

    @classmethod
    def check(cls, args) -> None:
        """Validate this choice's options (after defaults), raising PluginOptionError naming the option."""
        cls.check_options(args)

    @classmethod
    def check_options(cls, args) -> None:
        for option in cls.options:
            option.validate(args)

    @classmethod
    def label(cls) -> str:
        return f"--{cls.axis.replace('_', '-')} {cls.name}"


def refuse_checkpointing(args, who: str, why: str) -> None:
    """Reject activation checkpointing (``--checkpoint-activations``, or ``--offload-activations``, which fairseq
    turns into it) for a choice whose layers read and extend a state the stack passes between them: fairseq's
    checkpoint_wrapper recomputes one layer's forward in backward, and that state does not survive it (the
    gradients would be wrong or the backward would fail)."""
    for option in ("offload_activations", "checkpoint_activations"):  # the one given (offload implies checkpoint)
        if getattr(args, option, False):
            raise PluginOptionError(f"--{option.replace('_', '-')} cannot be used with {who}: {why}")


def set_defaults(args, values: dict) -> None:
    for key, value in values.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


@dataclass(frozen=True)
class Plan:
    """The resolved choice of every axis for one model."""

    residual: type
    aggregation: type
    tying: type
    norm: type

    def choices(self) -> tuple[type, ...]:
        return (self.residual, self.aggregation, self.tying, self.norm)


class IncompatibleChoices(PluginOptionError):
    """Two axis choices cannot be combined (the message names both and why)."""


def refuse(a: type, b: type, reason: str) -> None:
    raise IncompatibleChoices(f"{a.label()} cannot be combined with {b.label()}: {reason}")


def tables() -> dict[str, dict[str, type]]:
    from .aggregation import AGGREGATIONS
    from .norm import NORMS
    from .residual import RESIDUALS
    from .tying import TYINGS

    return {"residual": RESIDUALS, "depth_aggregation": AGGREGATIONS, "tying": TYINGS, "norm": NORMS}


def declarations() -> dict[str, dict[str, type]]:
    """Every table of declared choices: the four axes, and ``--value-residual``'s (an option beside them,
    axes/value_residual.py), whose choices declare the same capabilities."""
    from .value_residual import VALUE_RESIDUALS

    return {**tables(), "value_residual": VALUE_RESIDUALS}


def resolve(args) -> Plan:
    """The Plan of ``args`` (every axis set, names checked), or PluginOptionError naming the option."""
    picked = {}
    for axis, table in tables().items():
        value = getattr(args, axis)
        if axis == "tying" and value not in table:
            from .tying import combined_tying

            picked[axis] = combined_tying(value)  # a comma list of blocks, as Crossformer's --guidance took
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


def is_set(args, name: str) -> bool:
    """Whether option ``name`` has a value in ``args``. False is a switch left off, not a value: fairseq's language
    models declare NormFormer's ``scale_*`` switches themselves, default False, for every model."""
    return getattr(args, name, None) not in (None, False)


def drop_if_stored(args, name: str) -> bool:
    """For args loaded from a checkpoint (``validation.STORED_ARGS``): clear option ``name``, unless the loader's
    caller gave it as an override, and return True. The plugin filled such options with their defaults before
    issue 56 (LAuReL's four for every variant, ``--value-residual-mode``, ``--guidance-norm``), and the model was
    built without reading them; an override was given now, so it is refused like the command line's."""
    overrides = getattr(args, STORED_ARGS, None)
    if overrides is None or name in overrides:
        return False
    setattr(args, name, None)
    return True


def set_defaults_since(args, values: dict, before: dict) -> None:
    """Fill options whose default changed (or that were added) after checkpoints were saved: ``values`` for a fresh
    command line or the Python API, ``before`` (what the older code built) for a checkpoint's stored args
    (``validation.STORED_ARGS``). A checkpoint saved since stores the filled value, which wins over both."""
    set_defaults(args, before if getattr(args, STORED_ARGS, None) is not None else values)


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


PART_NAMES = {
    "stream": "carry between layers (layer_stack.py's begin_layers/run_layer/end_layers)",
    "layer": "layer forward (each builds its own layer class)",
}
