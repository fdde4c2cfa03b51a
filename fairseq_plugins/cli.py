"""``fairseq-residual`` (also ``python -m fairseq_plugins.cli``): the plugin's own command (docs/cli.md).

    user-dir             the plugin's directory: fairseq-train --user-dir "$(fairseq-residual user-dir)" ...
    list                 the axes, each choice with its options, help and source, and the --arch names
                         (--axis AXIS: one axis; --grep TEXT: only what mentions TEXT; --archs: every name)
    describe CHECKPOINT  what a checkpoint is: --arch, axis choices, the plugin's options, parameter count, the
                         training set-up, fairseq and plugin versions

Nothing is retyped here: the axes, choices, options and helps are read from the declarations (axes/*.py,
through the options they add to a parser), the names and shapes from the preset tables (models/presets.py,
models/families.py, lm/presets.py) and each name's own architecture function.
"""

import argparse
import copy
import os
import re
from collections.abc import Iterator

import fairseq
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    ARCH_MODEL_REGISTRY,
)

from . import __version__, axes, lm, models
from .axes import value_residual
from .checkpoint_safety import CheckpointCorruptError, CheckpointRefusedError
from .fairseq_hooks import USER_DIR, plugin_model
from .models.axes_transformer import MODEL, add_axis_args

PROG = "fairseq-residual"
AXES = tuple(axes.tables())  # residual, depth_aggregation, tying, norm
BESIDE_AXES = tuple(option.name for option in value_residual.OPTIONS)  # --value-residual*: a model-wide option


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def declared_options() -> dict[str, argparse.Action]:
    """dest -> argparse action of every option the plugin adds to fairseq's transformer (axes, each choice's
    options, the options beside the axes), as ``residual_axes`` adds them."""
    parser = argparse.ArgumentParser(add_help=False)
    add_axis_args(parser)
    return {action.dest: action for action in parser._actions}  # argparse keeps no public list of its actions


def option_line(action: argparse.Action, default=None) -> str:
    shown = "" if default is None or "default" in (action.help or "") else f" (default {default})"
    return f"      {action.option_strings[0]} {action.metavar or ''}  {action.help}{shown}"


def axis_sections(actions: dict[str, argparse.Action]) -> Iterator[tuple[str, list[str]]]:
    """(axis header, one block of lines per choice) for every axis, then the options beside the axes."""
    for axis, table in axes.tables().items():
        help_text = actions[axis].help.split(";")[0]  # the rest of it lists the choices, shown below
        header = f"{flag(axis)} CHOICE: {help_text} (docs/axes.md)"
        blocks = []
        for name, choice in table.items():
            block = [f"  {name:<14} {choice.source}"]
            block += [option_line(actions[o.name], o.default) for o in choice.options]
            blocks.append(block)
        yield header, blocks
    used = {*AXES, *(o.name for table in axes.tables().values() for c in table.values() for o in c.options)}
    beside = [[option_line(action).replace("      ", "  ", 1)] for dest, action in actions.items() if dest not in used]
    yield "options beside the axes (every choice takes them):", beside


def plugin_archs() -> list[str]:
    return [arch for arch in ARCH_MODEL_REGISTRY if plugin_model(arch)]  # in the preset tables' order


def resolved(arch: str) -> argparse.Namespace:
    """The options ``--arch arch`` sets, from its own architecture function (what fairseq-train applies)."""
    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def shape(args) -> str:
    decoder_only = getattr(args, "encoder_layers", None) is None or getattr(args, "arch", "") in lm.LM_PRESETS
    depth = f"D{args.decoder_layers}" if decoder_only else f"E{args.encoder_layers}D{args.decoder_layers}"
    width = f"{args.decoder_embed_dim}/{args.decoder_ffn_embed_dim}/{args.decoder_attention_heads}"
    return f"{depth} {width}"


def changes(args, base, names) -> str:
    """What ``args`` sets among the options ``names`` beyond ``base`` (residual_axes alone): the axis choices that
    differ, and the other options that differ from what residual_axes gives with the same choices (so a choice's
    own defaults are not repeated)."""
    choices = {n: getattr(args, n) for n in (*AXES, *BESIDE_AXES) if getattr(args, n, None) is not None}
    same_choices = argparse.Namespace(**choices)
    ARCH_CONFIG_REGISTRY[MODEL](same_choices)
    changed = []
    for n in names:
        value, against = getattr(args, n, None), base if n in choices else same_choices
        if value is not None and value != getattr(against, n, None):
            changed.append(f"{flag(n)} {value}")
    return " ".join(changed) or "-"


def arch_line(arch: str, base, names) -> str:
    args = resolved(arch)
    args.arch = arch
    return f"  {arch:<28} {ARCH_MODEL_NAME_REGISTRY[arch]:<24} {shape(args):<16} {changes(args, base, names)}"


def family_lines(base, names) -> Iterator[tuple[str, list[str]]]:
    """(one line per family: its model, axis choices, settings and name pattern, the family's names)."""
    families: dict[str, list[str]] = {}
    for arch in plugin_archs():
        preset = models.PRESETS.get(arch) or lm.LM_PRESETS.get(arch)
        family = preset.family + ("_lm" if arch in lm.LM_PRESETS else "") if preset else arch
        families.setdefault(family, []).append(arch)
    for family, archs in families.items():
        what = changes(resolved(archs[0]), base, names)
        shown = archs if len(archs) <= 2 else [archs[0], "...", archs[-1]]
        yield f"  {family:<24} {ARCH_MODEL_NAME_REGISTRY[archs[0]]:<24} {what}  ({len(archs)}: {' '.join(shown)})", archs


def matches(pattern: str | None, *texts: str) -> bool:
    return pattern is None or any(re.search(pattern, text, re.IGNORECASE) for text in texts)


def list_command(options) -> None:
    actions = declared_options()
    pattern = re.escape(options.grep) if options.grep else None
    if not options.archs:
        for header, blocks in axis_sections(actions):
            axis = header.split()[0][2:].replace("-", "_")
            if options.axis and axis != options.axis:
                continue
            shown = [block for block in blocks if matches(pattern, header, "\n".join(block))]
            if shown:
                print(header)
                print("\n".join(line for block in shown for line in block))
                print()
    if options.axis:
        return
    base, names = resolved(MODEL), list(actions)
    defaults = " ".join(f"{flag(n)} {getattr(base, n)}" for n in (*AXES, "value_residual"))
    if options.archs:
        lines = [arch_line(arch, base, names) for arch in plugin_archs()]
        lines = [line for line in lines if matches(pattern, line)]
        print(f"--arch names ({len(lines)}): name, model, layers and width (embed/ffn/heads), what it sets beyond "
              f"{MODEL}'s defaults ({defaults})")  # fmt: skip
        print("\n".join(lines))
        return
    rows = [(line, archs) for line, archs in family_lines(base, names) if matches(pattern, line, *archs)]
    if rows:
        print(f"--arch families ({len(rows)}): family, model, what it sets beyond {MODEL}'s defaults ({defaults}), "
              "(names: first ... last)")
        print("\n".join(line for line, _ in rows))
        print(f"every name with its shape: {PROG} list --archs; any axis choice goes on top of any of them")


# what describe shows of a checkpoint's training set-up: (cfg group, option)
SET_UP = [("task", "_name"), ("task", "data"), ("task", "source_lang"), ("task", "target_lang"),
          ("criterion", "_name"), ("criterion", "label_smoothing"), ("optimizer", "_name"), ("optimization", "lr"),
          ("lr_scheduler", "_name"), ("lr_scheduler", "warmup_updates"), ("optimization", "max_update"),
          ("optimization", "max_epoch"), ("dataset", "max_tokens"), ("optimization", "update_freq"),
          ("optimization", "clip_norm"), ("common", "seed"), ("common", "fp16"), ("common", "bf16"),
          ("common", "user_dir")]  # fmt: skip


def _get(config, name):
    if config is None:
        return None
    try:
        return config.get(name) if hasattr(config, "get") else getattr(config, name, None)
    except Exception:  # noqa: BLE001  (an omegaconf node that cannot be read: shown as unset)
        return None


class _Dictionaries:
    """The one thing a model's build reads from its task: dictionaries, here of the checkpoint's vocabulary sizes."""

    def __init__(self, state_dict: dict):
        sizes = {side: state_dict[f"{side}.embed_tokens.weight"].size(0) for side in ("encoder", "decoder")
                 if f"{side}.embed_tokens.weight" in state_dict}  # fmt: skip
        self.source_dictionary = self._dictionary(sizes.get("encoder", sizes.get("decoder")))
        self.target_dictionary = self._dictionary(sizes.get("decoder"))

    @staticmethod
    def _dictionary(size):
        dictionary = Dictionary()
        for i in range(size - len(dictionary)):
            dictionary.add_symbol(f"w{i}")
        return dictionary


def parameter_count(model_args, state_dict: dict) -> tuple[int, str]:
    """(parameters, how counted): of the model rebuilt from the checkpoint's options (tied weights once, no
    buffers), else of the saved tensors (each storage once)."""
    try:
        model = ARCH_MODEL_REGISTRY[model_args.arch].build_model(copy.deepcopy(model_args), _Dictionaries(state_dict))
        return sum(p.numel() for p in model.parameters()), "the model rebuilt from its options"
    except Exception:  # noqa: BLE001  (an old or foreign checkpoint: its saved tensors are still countable)
        seen, total = set(), 0
        for tensor in state_dict.values():
            if isinstance(tensor, torch.Tensor):
                key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
                if key not in seen:
                    seen.add(key)
                    total += tensor.numel()
        return total, "the saved tensors, buffers included: the model could not be rebuilt"


def describe_command(options, parser) -> None:
    path = options.checkpoint
    if not os.path.isfile(path):
        parser.error(f"no checkpoint file at {path}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except (CheckpointRefusedError, CheckpointCorruptError) as err:
        parser.error(str(err))
    cfg = state.get("cfg")
    model_args = _get(cfg, "model") or state.get("args")
    if model_args is None:
        parser.error(f"{path} has no model configuration (cfg.model): not a fairseq training checkpoint")
    arch = _get(model_args, "arch") or _get(model_args, "_name")
    declared = declared_options()
    print(f"checkpoint   {path}")
    print(f"--arch       {arch}" + ("" if plugin_model(arch) else "  (not one of the plugin's architectures)"))
    print(f"model        {ARCH_MODEL_NAME_REGISTRY.get(arch, '?')}")
    picked = [(name, _get(model_args, name)) for name in (*AXES, *BESIDE_AXES)]
    print("axes         " + (" ".join(f"{flag(n)} {v}" for n, v in picked if v is not None) or "none recorded"))
    args = argparse.Namespace(**{k: _get(model_args, k) for k in ("encoder_layers", "decoder_layers",
                              "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads")})  # fmt: skip
    args.arch = arch
    if args.decoder_layers is not None:
        print(f"shape        {shape(args)} (layers, embed/ffn/heads)")
    count, how = parameter_count(model_args, state.get("model") or {})
    print(f"parameters   {count:,} ({how})")
    own = [(dest, _get(model_args, dest)) for dest in declared if dest not in (*AXES, *BESIDE_AXES)]
    print("plugin options (beside the axes):")
    for dest, value in own:
        if value is not None:
            print(f"  {flag(dest):<30} {value}")
    print("training set-up:")
    for group, name in SET_UP:
        value = _get(_get(cfg, group), name)
        if value not in (None, False):
            print(f"  {group + '.' + name:<30} {value}")
    history = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    progress = [f"{history[-1].get('num_updates')} updates"]
    if extra.get("train_iterator"):
        progress.append(f"epoch {extra['train_iterator'].get('epoch')}")
    if extra.get("best") is not None:
        progress.append(f"best {_get(_get(cfg, 'checkpoint'), 'best_checkpoint_metric') or 'loss'} {extra['best']:.4g}")
    print(f"trained      {', '.join(progress)}")
    print(f"versions     fairseq {fairseq.__version__}, fairseq-residual-plugins {__version__} "
          "(installed here; a checkpoint records neither)")  # fmt: skip
    print(f"decode with  fairseq-generate DATA --user-dir {USER_DIR} --path {path} (without --user-dir, fairseq "
          "cannot read the checkpoint: docs/cli.md)")  # fmt: skip


def axis_name(text: str) -> str:
    name = text.replace("-", "_").lstrip("_")
    if name not in AXES:
        raise argparse.ArgumentTypeError(f"unknown axis {text!r}: one of {', '.join(AXES)}")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("user-dir", help="print the plugin's directory, for --user-dir \"$(fairseq-residual user-dir)\"")
    listing = commands.add_parser("list", help="the axes, their choices and options, and the --arch names")
    listing.add_argument("--axis", type=axis_name, metavar="AXIS", help=f"only this axis: {', '.join(AXES)}")
    listing.add_argument("--grep", metavar="TEXT", help="only the choices, options and names that mention TEXT")
    listing.add_argument("--archs", action="store_true", help="every --arch name with its shape and axis choices")
    describe = commands.add_parser("describe", help="what a checkpoint is (arch, axes, options, set-up, versions)")
    describe.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint written by fairseq-train")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.command == "user-dir":
        print(os.path.dirname(os.path.abspath(__file__)))
    elif options.command == "list":
        list_command(options)
    else:
        describe_command(options, commands_parser(parser, "describe"))


def commands_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The subcommand's parser, so that its errors carry its usage line."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


if __name__ == "__main__":
    main()
