"""Two of fairseq's command-line paths made to end in one clear line once the plugin is loaded (docs/cli.md).

``--arch``: fairseq declares it with ``choices=ARCH_MODEL_REGISTRY.keys()`` (options.add_model_args), so a
misspelt name ends in argparse's "invalid choice" followed by every registered name (1,852 with the plugin).
``add_model_args`` is wrapped to give that action a ``type=``, which argparse applies before it looks at
``choices``: an unknown name is refused with the nearest names instead. ``--user-dir`` is imported before
fairseq builds its parser (options.get_parser), so the wrapper is in place for fairseq-train.

fairseq-hydra-train: the plugin's models read their options from fairseq-train's argparse namespace. Through
hydra they get a DictConfig, from which fairseq's ``TransformerConfig.from_namespace`` keeps no extra key,
so the build ended in ``AttributeError: invalid argument residual.``. fairseq's ``models.build_model`` (which
every task calls) is wrapped to refuse that case first, naming fairseq-train.
"""

import argparse
import difflib
import functools
from collections.abc import Iterable

from fairseq import models, options
from hydra.errors import CompactHydraException

from .validation import PluginOptionError, check_choice

USER_DIR = '"$(fairseq-residual user-dir)"'


def nearest(value: str, names: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``names`` closest to ``value`` (difflib's ratio, best first)."""
    return difflib.get_close_matches(str(value), list(names), n=n, cutoff=0.6)


def did_you_mean(value: str, names: Iterable[str]) -> str:
    """``"; did you mean a or b?"``, or "" when no name is close."""
    close = nearest(value, names)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def check_arch(value: str) -> str:
    """argparse ``type=`` of fairseq's ``--arch``: a registered name, else one line with the nearest ones."""
    if value in models.ARCH_MODEL_REGISTRY:
        return value
    raise argparse.ArgumentTypeError(
        f"unknown architecture {value!r}{did_you_mean(value, models.ARCH_MODEL_REGISTRY)} (the plugin's names: "
        "fairseq-residual list)"
    )


def check_choice_suggesting(name: str, value, choices) -> str:
    """validation.check_choice, whose error also names the nearest choice."""
    try:
        return check_choice(name, value, choices)
    except PluginOptionError as err:
        raise PluginOptionError(f"{err}{did_you_mean(value, choices)}") from None


def _suggesting_arch(add_model_args):
    @functools.wraps(add_model_args)
    def wrapper(parser):
        group = add_model_args(parser)
        for action in group._group_actions:  # the group holds --arch alone; argparse keeps no public list
            if action.dest == "arch":
                action.type = check_arch
        return group

    wrapper.suggests_names = True
    return wrapper


class HydraUnsupported(PluginOptionError, CompactHydraException):
    """A plugin model requested through fairseq-hydra-train; hydra prints only the message of a
    CompactHydraException, and the argparse route's excepthook only that of a PluginOptionError."""


def plugin_model(name) -> bool:
    cls = models.ARCH_MODEL_REGISTRY.get(name) or models.MODEL_REGISTRY.get(name)
    return cls is not None and cls.__module__.split(".")[0] == __package__


def _refusing_hydra(build_model):
    @functools.wraps(build_model)
    def wrapper(cfg, task, *args, **kwargs):
        name = getattr(cfg, "_name", None) or getattr(cfg, "arch", None)
        if not isinstance(cfg, argparse.Namespace) and plugin_model(name):
            raise HydraUnsupported(
                f"the plugin's model {name} cannot be built from a hydra config (fairseq-hydra-train): it reads "
                "its options from fairseq-train's command line, which fairseq's hydra path does not pass on; "
                f"train with fairseq-train DATA --user-dir {USER_DIR} --arch {name} ... (docs/cli.md)"
            )
        return build_model(cfg, task, *args, **kwargs)

    wrapper.refuses_hydra = True
    return wrapper


def install() -> None:
    """Wrap fairseq's add_model_args and build_model once (importing the plugin twice must not wrap twice)."""
    if not getattr(options.add_model_args, "suggests_names", False):
        options.add_model_args = _suggesting_arch(options.add_model_args)
    if not getattr(models.build_model, "refuses_hydra", False):
        models.build_model = _refusing_hydra(models.build_model)
