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

Overrides of a checkpoint's options (``from_pretrained``'s keyword arguments, fairseq-generate's
``--model-overrides``): fairseq sets each name on the stored args whatever it is, so a misspelt one (``bem=2``,
``dca_kk=3``) was silently ignored. The same wrapper refuses, for the plugin's models, a name that no option of
fairseq (its config groups and every registered model, task, criterion, optimizer, scheduler, tokenizer, BPE and
scorer) or of the plugin has, naming the nearest ones.
"""

import argparse
import dataclasses
import difflib
import functools
from collections.abc import Iterable

from fairseq import models, options, registry, tasks
from fairseq.dataclass.configs import FairseqConfig
from hydra.errors import CompactHydraException

from .validation import STORED_ARGS, PluginOptionError, check_choice

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


@functools.cache
def _config_option_names() -> frozenset[str]:
    """The option names of fairseq's config: its groups' fields, the component choices (task, criterion, optimizer,
    ...: fairseq-validate overrides task), --arch, and the fields of every registered dataclass, the tasks' and
    models' among them (milliseconds: every option of fairseq's own command lines is here)."""
    names = {field.name for group in dataclasses.fields(FairseqConfig) if dataclasses.is_dataclass(group.type)
             for field in dataclasses.fields(group.type)}  # fmt: skip
    names.update(["arch", *(group.name for group in dataclasses.fields(FairseqConfig))])
    configs = [*(c for table in registry.REGISTRIES.values() for c in table["dataclass_registry"].values()),
               *tasks.TASK_DATACLASS_REGISTRY.values(), *models.MODEL_DATACLASS_REGISTRY.values()]  # fmt: skip
    names.update(field.name for config in configs for field in dataclasses.fields(config))
    return frozenset(names)


@functools.cache
def _add_args_option_names() -> frozenset[str]:
    """What each registered model's and task's ``add_args`` declares (the plugin's models among them): ~0.5 s, so
    looked up only for an override the config's names do not hold."""
    names = set()
    for cls in {*models.MODEL_REGISTRY.values(), *tasks.TASK_REGISTRY.values()}:
        parser = argparse.ArgumentParser(conflict_handler="resolve", add_help=False)
        cls.add_args(parser)
        names.update(action.dest for action in parser._actions)  # argparse keeps no public list of its actions
    return frozenset(names)


def known_option_names() -> frozenset[str]:
    """Every option name fairseq or a registered component (the plugin's models included) can read: the config's
    names and what each registered model's and task's ``add_args`` declares."""
    return _config_option_names() | _add_args_option_names()


def check_override_names(args) -> None:
    """Refuse an override of a checkpoint's options (validation.STORED_ARGS) that names no option at all."""
    overrides = set(getattr(args, STORED_ARGS, None) or ())
    if not overrides:  # a command line, or a checkpoint loaded as it was: nothing to look up
        return
    # the config's names first: fairseq-validate's and fairseq-generate's overrides are among them, and the
    # models' add_args are read only for a name they do not hold
    unknown = overrides - _config_option_names()
    unknown = sorted(unknown - _add_args_option_names()) if unknown else []
    if unknown:
        hints = ", ".join(f"{name!r}{_nearest_in_parentheses(name)}" for name in unknown)
        raise PluginOptionError(
            f"unknown override{'s' if len(unknown) > 1 else ''} of the checkpoint's options (from_pretrained's "
            f"keyword arguments or --model-overrides): {hints} {'name' if len(unknown) > 1 else 'names'} no fairseq "
            "or plugin option, so it would be ignored; drop or correct it"
        )


def _nearest_in_parentheses(name: str) -> str:
    close = nearest(name, known_option_names())
    return f" (did you mean {' or '.join(close)}?)" if close else ""


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
        if plugin_model(name):
            check_override_names(cfg)
        return build_model(cfg, task, *args, **kwargs)

    wrapper.refuses_hydra = True
    return wrapper


def install() -> None:
    """Wrap fairseq's add_model_args and build_model once (importing the plugin twice must not wrap twice)."""
    if not getattr(options.add_model_args, "suggests_names", False):
        options.add_model_args = _suggesting_arch(options.add_model_args)
    if not getattr(models.build_model, "refuses_hydra", False):
        models.build_model = _refusing_hydra(models.build_model)
