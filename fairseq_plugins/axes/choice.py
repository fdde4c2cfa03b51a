"""The foundations every axis module builds on: ``Option``, ``Choice`` and its capabilities (``UNDECLARED``,
``Speed`` and its classes), ``Plan`` and the refusal of two choices, and the helpers that fill and check options.
The axis modules import these from here and the package (``axes/__init__.py``) assembles their tables, so
imports run one way: package -> axis modules -> choice.py.
"""

from collections.abc import Callable
from dataclasses import dataclass

from ..validation import STORED_ARGS, PluginOptionError, argparse_type


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


PART_NAMES = {
    "stream": "carry between layers (layer_stack.py's begin_layers/run_layer/end_layers)",
    "layer": "layer forward (each builds its own layer class)",
}
