"""Option checks shared by every model and criterion of the plugin.

Each check raises one clear error that names the option and the allowed values. The same checks serve the
command line (as argparse ``type=`` callables, so a bad value stops fairseq before anything is built) and
the Python API (called again in ``build_model``, since ``from_pretrained`` and overrides skip argparse).
"""

import argparse
import functools
import math
import operator
import os
import sys
from collections.abc import Callable, Iterable


class PluginOptionError(ValueError):
    """A plugin option has a value outside its allowed range or set."""


TRACEBACK_VARIABLE = "FAIRSEQ_PLUGINS_TRACEBACK"

# set on a checkpoint's model args by the loader (checkpoint_safety.py): the names of the options the caller gave
# as overrides (from_pretrained's keyword arguments, fairseq-generate's --model-overrides); see
# axes.drop_if_stored. Absent on args parsed from a command line.
STORED_ARGS = "plugin_checkpoint_overrides"


def report_option_error(kind, error, traceback, fallback=None) -> None:
    """sys.excepthook: an uncaught PluginOptionError ends the program as argparse's errors do (``PROG: error:
    MESSAGE``, no traceback); every other exception, and every one with FAIRSEQ_PLUGINS_TRACEBACK=1, goes to
    the hook that was installed before. fairseq catches nothing around build_model, where the checks that need
    every option at once (incompatible choices, depths, widths) run, so without this they end in a traceback
    that says nothing the message does not."""
    if issubclass(kind, PluginOptionError) and os.environ.get(TRACEBACK_VARIABLE, "") in ("", "0"):
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"
        print(f"{prog}: error: {error}", file=sys.stderr)
        return
    (fallback or sys.__excepthook__)(kind, error, traceback)


def install_error_report() -> None:
    """Install report_option_error as sys.excepthook once, chaining to the hook found there."""
    if getattr(sys.excepthook, "func", None) is report_option_error:
        return
    previous = sys.excepthook
    hook = functools.partial(report_option_error, fallback=previous)
    sys.excepthook = hook


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_float(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """Return ``value`` as float if low <(=) value <= high and finite (``high`` may be inf: no upper bound),
    else raise naming ``--name``."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise PluginOptionError(f"{_flag(name)} must be a number, got {value!r}") from None
    below = value <= low if low_open else value < low
    if below or value > high or not math.isfinite(value):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if math.isinf(high) else ']'}"
        raise PluginOptionError(f"{_flag(name)} must be in {interval}, got {value:g}")
    return value


def _as_int(value) -> int:
    """An int from an int, an integral finite float or a decimal string (of any size); else ValueError or
    TypeError."""
    if isinstance(value, bool):  # True is an int to Python, not a count to a user
        raise TypeError
    if isinstance(value, str):
        return int(value.strip())
    try:
        return operator.index(value)
    except TypeError:
        number = float(value)
    if not number.is_integer():
        raise ValueError
    return int(number)


def check_int(name: str, value, low: int, high: int) -> int:
    """Return ``value`` as int if low <= value <= high, else raise naming ``--name``."""
    try:
        as_int = _as_int(value)
    except (TypeError, ValueError):
        raise PluginOptionError(f"{_flag(name)} must be an integer, got {value!r}") from None
    if not low <= as_int <= high:
        raise PluginOptionError(f"{_flag(name)} must be an integer in [{low}, {high}], got {as_int}")
    return as_int


def check_bool(name: str, value) -> bool:
    """Return ``value`` as bool (a bool, or true/false/1/0/yes/no in any case), else raise naming ``--name``."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise PluginOptionError(f"{_flag(name)} must be true or false, got {value!r}")


def check_choice(name: str, value, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming ``--name`` and the choices."""
    choices = list(choices)
    if value not in choices:
        raise PluginOptionError(f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_choice_list(name: str, value, choices: Iterable[str]) -> list[str]:
    """Parse a comma-separated list whose items must all be in ``choices`` (no repeats, not empty)."""
    choices = list(choices)
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    unknown = [v for v in items if v not in choices]
    if not items or unknown or len(set(items)) != len(items):
        raise PluginOptionError(
            f"{_flag(name)} must be a comma-separated list of distinct items from "
            f"{', '.join(choices)}; got {value!r}"
        )
    return items


def argparse_type(check: Callable, name: str, *bounds) -> Callable:
    """Wrap a ``check_*`` function as an argparse ``type=`` so bad values fail at parse time."""

    def parse(text):
        try:
            return check(name, text, *bounds)
        except PluginOptionError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = name  # argparse names the type in its messages
    return parse


# far beyond any model the plugin builds: a typo, not a model, above
MAX_LAYERS, MAX_WIDTH, MAX_POSITIONS = 100_000, 1 << 20, 1 << 24


def check_model_shape(args) -> None:
    """Check fairseq's own shape, position and drop options of a plugin model before anything is built, each naming
    itself: fairseq checks none of them, so a negative width failed deep inside torch, zero heads or output width
    divided by zero, a negative position count indexed out of range, a NaN layer drop passed every ``> 0`` refusal
    (NaN compares false) and a negative depth was reported as a pruning record. An option the model does not have
    (a language model's encoder-only options) is None and skipped."""
    for side in ("encoder", "decoder"):
        for name, low, high in (("layers", 0, MAX_LAYERS), ("embed_dim", 1, MAX_WIDTH),
                                ("ffn_embed_dim", 1, MAX_WIDTH), ("attention_heads", 1, MAX_WIDTH)):  # fmt: skip
            option = f"{side}_{name}"
            if getattr(args, option, None) is not None:
                setattr(args, option, check_int(option, getattr(args, option), low, high))
        dim, heads = getattr(args, f"{side}_embed_dim", None), getattr(args, f"{side}_attention_heads", None)
        if dim is not None and heads is not None and dim % heads:
            raise PluginOptionError(
                f"{_flag(side + '_embed_dim')} ({dim}) must be a multiple of {_flag(side + '_attention_heads')} "
                f"({heads}): each head attends over embed_dim / heads dimensions"
            )
        option = f"{side}_layerdrop"
        if getattr(args, option, None) is not None:
            setattr(args, option, check_float(option, getattr(args, option), 0.0, 1.0))
    for option, low, high in (("max_source_positions", 1, MAX_POSITIONS), ("max_target_positions", 1, MAX_POSITIONS),
                              ("decoder_output_dim", 1, MAX_WIDTH), ("decoder_input_dim", 1, MAX_WIDTH)):  # fmt: skip
        if getattr(args, option, None) is not None:
            setattr(args, option, check_int(option, getattr(args, option), low, high))
    for option in ("dropout", "attention_dropout", "activation_dropout", "adaptive_softmax_dropout", "quant_noise_pq",
                   "quant_noise_scalar"):  # fmt: skip
        if getattr(args, option, None) is not None:
            setattr(args, option, check_float(option, getattr(args, option), 0.0, 1.0))
