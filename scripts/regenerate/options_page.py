"""docs/options.md: every option of the plugin from the axis choices' ``Option`` declarations, the options beside
the axes, the criterion's, and the fairseq options each choice refuses (found by asking the choice's own check)."""

import argparse
import copy
import math
import re
from collections.abc import Callable
from dataclasses import fields

from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.models import MODEL_REGISTRY, FairseqLanguageModel
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer_lm import TransformerLanguageModel

import fairseq_plugins  # noqa: F401  (registers every model, architecture and criterion)
from fairseq_plugins import axes, cli, validation
from fairseq_plugins.axes import value_residual
from fairseq_plugins.criterions import (
    label_smoothed_cross_entropy_with_guidance as guidance_criterion,
)
from fairseq_plugins.models import axes_transformer

from .markdown import GENERATED, first_sentence, flag, shown, table


def allowed(check: Callable, bounds: tuple, const=None) -> str:
    """The values a ``validation.check_*`` function with these bounds accepts, in words."""
    if check is validation.check_choice:
        return "one of " + ", ".join(f"`{c}`" for c in bounds[0])
    if check is validation.check_choice_list:
        return "distinct comma-separated items of " + ", ".join(f"`{c}`" for c in bounds[0])
    if check is validation.check_int:
        low, high = bounds
        return f"integer, {low} <= N <= {high}"
    if check is validation.check_float:
        low, high, low_open = (*bounds, False)[:3]
        left = f"{low:g} < x" if low_open else f"{low:g} <= x"
        return f"number, {left}" + ("" if math.isinf(high) else f" <= {high:g}") + " (finite)"
    if check is validation.check_bool:
        alone = ", the flag alone means true" if const is True else ""
        return f"`true`/`false` (also `1`/`0`, `yes`/`no`{alone})"
    return first_sentence(check.__doc__) or check.__name__




def option_rows(readers: dict[str, list[tuple[str, axes.Option]]]) -> list[list]:
    """One row per option: flag and metavar, who reads it, allowed values, default(s), help."""
    rows = []
    for name, read in readers.items():
        option = read[0][1]
        defaults = {}
        for who, o in read:
            defaults.setdefault(shown(o.default), []).append(who)
        default = (next(iter(defaults)) if len(defaults) == 1
                   else "; ".join(f"{d} ({', '.join(w)})" for d, w in defaults.items()))  # fmt: skip
        rows.append([f"`{flag(name)} {option.metavar}`", ", ".join(f"`{w}`" for w, _ in read),
                     allowed(option.check, option.bounds, option.const), default, option.help])  # fmt: skip
    return rows


def parser_options(cls) -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
    cls.add_args(parser)
    return {action.dest: action for action in parser._actions}  # argparse keeps no public list of its actions


def plugin_model_options() -> dict[str, argparse.Action]:
    """dest -> action of every option a plugin model adds to fairseq's transformer (a translation model's) or to
    fairseq's transformer_lm and the translation options it shares (a language model's)."""
    translation = set(parser_options(TransformerModel))
    language_model = translation | set(parser_options(TransformerLanguageModel))
    found = {}
    for cls in MODEL_REGISTRY.values():
        if cls.__module__.startswith("fairseq_plugins"):
            fairseq_own = language_model if issubclass(cls, FairseqLanguageModel) else translation
            for dest, action in parser_options(cls).items():
                if dest not in fairseq_own:
                    found.setdefault(dest, action)
    return found


def criterion_options() -> list:
    """The dataclass fields the plugin's criterion adds to fairseq's label_smoothed_cross_entropy."""
    base = {f.name for f in fields(LabelSmoothedCrossEntropyCriterionConfig)}
    config = guidance_criterion.LabelSmoothedCrossEntropyWithGuidanceConfig
    return [f for f in fields(config) if f.name not in base]


# fairseq options a choice's check may refuse, each probed with one value on a model that otherwise builds
PROBES = (
    ("encoder_normalize_before", None),  # None: the opposite of what the choice sets
    ("encoder_layerdrop", 0.1),
    ("encoder_layers_to_keep", "0"),
    ("cross_self_attention", True),
    ("checkpoint_activations", True),
)


def refused(check: Callable, *args) -> str | None:
    """The one-line error ``check(*args)`` raises, or None."""
    try:
        check(*args)
    except validation.PluginOptionError as err:
        return str(err)
    return None


def refusals() -> list[list]:
    """[fairseq option, choice, the error its check gives] for every probe a choice's own check refuses."""
    rows = []
    probed = [(choice.label(), choice.check, (axis, name)) for axis, table_ in axes.tables().items()
              for name, choice in table_.items()]  # fmt: skip
    probed += [(f"--value-residual {side}", lambda a: value_residual.check(a, axes.resolve(a)), ("value_residual", side))
               for side in value_residual.SIDES[1:]]  # fmt: skip
    for label, check, (option_, value_) in probed:
        base = argparse_namespace(option_, value_)
        if refused(check, copy.deepcopy(base)):
            continue  # a choice that needs more than its defaults to build is not probed
        for option, value in PROBES:
            args = copy.deepcopy(base)
            setattr(args, option, (not getattr(args, option, False)) if value is None else value)
            message = refused(check, args)
            if message:
                rows.append([f"`{flag(option)}` {shown(getattr(args, option))}", f"`{label}`", message])
    return rows


def argparse_namespace(option: str, value: str) -> argparse.Namespace:
    """``residual_axes``'s filled args at its default depth with one option set (as fairseq-train fills them)."""
    args = argparse.Namespace(**{option: value})
    axes_transformer.axes_architecture(args)
    return args


def options_md() -> str:
    tables = axes.tables()
    lines = [
        "# Options and their checks",
        "",
        GENERATED,
        "",
        ("Every plugin option is checked when the command line is parsed (argparse stops with the option's name and the "
        "allowed values) and again when the model or criterion is built (for the Python API and `from_pretrained`); "
        "each check gives one message naming the option and what is allowed. An option that only a choice the model "
        "does not make reads is refused, naming the choices that read it (tests/test_refusals.py checks every "
        f"declared option). fairseq's own `--{{encoder,decoder}}-layers` (0 to {validation.MAX_LAYERS}), "
        f"`-embed-dim`, `-ffn-embed-dim`, `-attention-heads` (1 to {validation.MAX_WIDTH}, heads dividing the "
        "width), `--*-layerdrop`, `--dropout`, `--attention-dropout`, `--activation-dropout` (0 to 1, finite) are "
        "checked too (`validation.check_model_shape`), each naming itself. Every choice with its paper: "
        "[axes.md](axes.md); which combinations build: [grid.md](grid.md)."),
        "",
        "## The axes",
        "",
    ]
    helps = cli.declared_options()
    lines += table(["option", "what it chooses", "choices", "default"], [
        [f"`{flag(axis)} CHOICE`", helps[axis].help.split("; one of ")[0],
         ", ".join(f"`{n}`" for n in table_) + "".join(re.findall(r", or a comma list[^(]*", helps[axis].help)),
         shown(axes_transformer.AXIS_DEFAULTS[axis])]
        for axis, table_ in tables.items()
    ])  # fmt: skip
    covered = set(tables)
    for axis, table_ in tables.items():
        readers: dict[str, list] = {}
        for choice in table_.values():
            for option in choice.options:
                readers.setdefault(option.name, []).append((choice.label(), option))
        covered |= set(readers)
        lines += ["", f"## {flag(axis)}", ""]
        lines += table(["choice", "source", "owns", "its options"], [
            [f"`{name}`", choice.source, ", ".join(sorted(choice.owns)) or "-",
             ", ".join(f"`{flag(o.name)}`" for o in choice.options) or "-"]
            for name, choice in table_.items()
        ])  # fmt: skip
        if readers:
            lines += ["", f"Options of the {flag(axis)} choices:", ""]
            lines += table(["option", "read by", "allowed", "default", "what it does"], option_rows(readers))
    beside: dict[str, list] = {}
    for switch, off, switched in axes_transformer.SWITCHED_OPTIONS.values():
        beside[switch.name] = [("every model", switch)]
        for option in switched:
            beside[option.name] = [(f"{flag(switch.name)} other than {off}", option)]
    covered |= set(beside)
    lines += ["", "## Options beside the axes", "",
              ("A switch every model takes, and the options only a model with the switch on reads (refused when "
              "it is off)."), ""]  # fmt: skip
    rows = option_rows(beside)
    undeclared = {d: a for d, a in plugin_model_options().items() if d not in covered}
    for action in undeclared.values():  # declared by argparse alone (--autocast-dtype)
        metavar = f" {action.metavar}" if action.metavar else ""
        rows.append([f"`{action.option_strings[0]}{metavar}`", "every model", "(in what it does)",
                     shown(action.default), action.help or ""])  # fmt: skip
    lines += table(["option", "read by", "allowed", "default", "what it does"], rows)
    lines += ["", f"## Options of the criterion `{guidance_criterion.NAME}`", ""]
    lines += table(["option", "read by", "allowed", "default", "what it does"], [
        [f"`{flag(f.name)}`", f"`--criterion {guidance_criterion.NAME}`",
         getattr(f.type, "__name__", str(f.type)), shown(f.default),
         f.metadata.get("help", "")]
        for f in criterion_options()
    ])  # fmt: skip
    lines += ["", "## fairseq options a choice refuses", "",
              ("Each row is the error the choice's own check gives when the option is set on a model that otherwise "
              "builds (fairseq's `--encoder-*` options stand for the `--decoder-*` ones too)."), ""]  # fmt: skip
    lines += table(["option", "refused by", "the error"], refusals())
    return "\n".join(lines) + "\n"
