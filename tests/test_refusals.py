"""Every option of every choice is read by the built model or refused (issue 56), generated from the declarations:
each axis choice's ``options`` (fairseq_plugins/axes/) and the switched options beside the axes
(axes_transformer.SWITCHED_OPTIONS: --value-residual's, --guidance's), so a new option is covered without a new
test. Plus the refusals the sweep of issue 56 found missing: the guidance criterion on a model without guidance
(refused when the criterion is built, exit 1, not SIGABRT at the first batch), fairseq's depth, width, head and
drop options (negative, zero, NaN), and stale options in loaded checkpoints."""

import argparse
import copy
import math

import fairseq.models
import pytest
import torch
from fairseq import checkpoint_utils
from fairseq import options as fairseq_options
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins import axes, fairseq_hooks
from fairseq_plugins.criterions.label_smoothed_cross_entropy_with_guidance import (
    LabelSmoothedCrossEntropyWithGuidanceCriterion,
)
from fairseq_plugins.models.axes_transformer import MODEL, SWITCHED_OPTIONS
from fairseq_plugins.models.axes_transformer import (
    check_soft_guidance as check_guidance,
)
from fairseq_plugins.validation import (
    PluginOptionError,
    check_bool,
    check_choice,
    check_float,
    check_int,
)

from .forkserver import run_forked
from .helpers import REPO, TinyTask, parse_model_args, train_command

SHAPE = ["--encoder-layers", "3", "--decoder-layers", "2"]  # unequal: T-Fixup's --tfixup-decoder-depth shows


def settings() -> list[tuple[list[str], frozenset]]:
    """Every model setting that decides which options are read: (its flags, the option names it reads). Each axis
    choice (the other axes at their defaults), and each switch beside the axes, off and on."""
    found = []
    for axis, table in axes.tables().items():
        for name, choice in table.items():
            found.append(([f"--{axis.replace('_', '-')}", name], frozenset(o.name for o in choice.options)))
    for switch, (option, off, dependents) in SWITCHED_OPTIONS.items():
        for value in option.bounds[0] if option.check is check_choice else (off, "all"):
            read = frozenset() if value == off else frozenset(o.name for o in dependents)
            found.append(([f"--{switch.replace('_', '-')}", value], read))
    return found


def options() -> dict[str, axes.Option]:
    """Every declared option, by name (a shared option once, as the parser adds it)."""
    declared = {}
    for table in axes.tables().values():
        for choice in table.values():
            for option in choice.options:
                declared.setdefault(option.name, option)
    for _, _, dependents in SWITCHED_OPTIONS.values():
        for option in dependents:
            declared.setdefault(option.name, option)
    return declared


def other_value(option: axes.Option, current):
    """A valid value of ``option`` other than ``current`` (what the setting filled, or None: then a value that
    turns it on, since a switch left off, False, is no value to ignore)."""
    check, bounds = option.check, option.bounds
    if check is check_choice:
        return next(value for value in bounds[0] if value != current)
    if check is check_bool:
        return current is None or not current
    if check is check_int:  # a small value: larger ones may reach the depth, where choices degenerate alike
        return bounds[0] + 1 if current != bounds[0] + 1 else bounds[0]
    if check is check_float:
        low, high = bounds[0], min(bounds[1], bounds[0] + 1.0)
        return next(v for v in (low + (high - low) / 2, low + (high - low) / 4) if v != current)
    if check is check_guidance:
        return "all" if current != "all" else "ffn"
    raise AssertionError(f"other_value does not know {check.__name__} (option {option.name}): teach it")


def parsed(flags):
    args = parse_model_args(MODEL, [*SHAPE, *flags])
    ARCH_MODEL_REGISTRY[MODEL].architecture(args)  # the values the setting fills (what the model would read)
    return args


def build(args):
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY[MODEL].build_model(copy.deepcopy(args), TinyTask()).eval()


def fingerprint(model) -> tuple:
    """What a built model is: its modules with their plain attributes, its parameters and buffers, and its
    guidance loss (--guidance-norm changes only that)."""
    plain = (int, float, str, bool)
    modules = tuple(
        (name, type(m).__name__, tuple(sorted((k, v) for k, v in vars(m).items() if isinstance(v, plain) and k[0] != "_")))
        for name, m in model.named_modules()
    )  # fmt: skip
    state = tuple((k, tuple(v.shape), v.double().sum().item(), v.double().square().sum().item())
                  for k, v in model.state_dict().items())  # fmt: skip
    return modules, state, float(model.guidance_loss())


SETTINGS = settings()
OPTIONS = options()


@pytest.mark.parametrize("flags, read", SETTINGS, ids=[" ".join(flags) for flags, _ in SETTINGS])
def test_every_option_is_read_by_the_model_or_refused(flags, read):
    """For a setting and each declared option: one it does not read, set to any value, is refused by an error
    naming the option; one it reads, set to another valid value, builds another model (or is refused naming it,
    e.g. --hc-mode against --depth-aggregation hc-static)."""
    args = parsed(flags)
    base = None
    for name, option in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        changed = copy.deepcopy(args)
        setattr(changed, name, other_value(option, getattr(args, name, None)))
        if name not in read:
            with pytest.raises(PluginOptionError, match=f"^{flag} "):
                build(changed)
            continue
        try:
            model = build(changed)
        except PluginOptionError as err:
            assert flag in str(err), f"{flag} {getattr(changed, name)!r} with {flags}: refused for another reason: {err}"
            continue
        base = base or fingerprint(build(args))
        assert fingerprint(model) != base, f"{flag} {getattr(changed, name)!r} with {' '.join(flags)} builds the same model"


@pytest.mark.parametrize("flags, message", [
    (["--depth-aggregation", "laurel-rw", "--laurel-rank", "4"], "--laurel-rank applies only with --depth-aggregation laurel-lr or laurel-pa"),
    (["--depth-aggregation", "laurel-lr", "--laurel-pa-k", "2"], "--laurel-pa-k applies only with --depth-aggregation laurel-pa"),
    (["--depth-aggregation", "laurel-lr", "--laurel-rw-norm", "none"], "--laurel-rw-norm applies only with --depth-aggregation laurel-rw"),
    (["--value-residual-mode", "learnable"], "--value-residual-mode needs --value-residual decoder or both: the model has --value-residual none"),
    (["--guidance-norm", "l1"], "--guidance-norm applies only with soft guidance, .* the model has --guidance none:"),
    (["--tying", "ffn", "--guidance", "ffn", "--guidance-norm", "l1"], "--guidance ffn names only the blocks that --tying ffn ties"),
])  # fmt: skip
def test_the_options_the_sweep_found_ignored_are_refused(flags, message):
    with pytest.raises(PluginOptionError, match=message):
        build(parse_model_args(MODEL, [*SHAPE, *flags]))


def test_a_checkpoint_keeps_loading_with_the_defaults_it_stored_and_refuses_an_unread_override(tmp_path):
    """Before issue 56 every LAuReL model stored all four LAuReL options (an LR model --laurel-rw-norm none), and
    every model --guidance-norm l2: a loaded checkpoint clears what its model never read; an override (from_pretrained's
    keyword arguments) that the model does not read is refused like the command line's."""
    golden = REPO / "tests" / "golden" / "checkpoints" / "laurel_lr_e6d6.pt"
    state = checkpoint_utils.load_checkpoint_to_cpu(str(golden))
    args = state["cfg"]["model"]
    assert args.laurel_rw_norm == "none" and args.laurel_pa_k == 3  # stored, never read by an LR model
    vocab = state["model"]["encoder.embed_tokens.weight"].shape[0] - 4  # TinyTask adds fairseq's 4 specials
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, TinyTask(vocab))
    model.load_state_dict(state["model"])
    assert args.laurel_rw_norm is None and args.laurel_pa_k is None
    state = checkpoint_utils.load_checkpoint_to_cpu(str(golden), {"laurel_pa_k": 2})
    with pytest.raises(PluginOptionError, match="--laurel-pa-k applies only with --depth-aggregation laurel-pa"):
        ARCH_MODEL_REGISTRY[args.arch].build_model(state["cfg"]["model"], TinyTask(vocab))


def _load_golden_dca_k2(**overrides):
    data = REPO / "tests" / "golden" / "checkpoints"
    return checkpoint_utils.load_model_ensemble_and_task(
        [str(data / "dca_k2_e6d6.pt")],
        arg_overrides={"data": str(data / "data"), "source_lang": "src", "target_lang": "tgt", **overrides},
    )


@pytest.mark.parametrize("overrides, message", [
    ({"bem": 2}, (r"override of the checkpoint's options \(from_pretrained's keyword arguments or --model-overrides\): "
                 r"'bem' \(did you mean beam or .*\) names no fairseq or plugin option, so it would be ignored")),
    ({"dca_kk": 3, "no_such_option": 1}, r"overrides .*: 'dca_kk' \(did you mean dca_k\?\), 'no_such_option' name no"),
])  # fmt: skip
def test_a_misspelt_override_of_a_checkpoint_is_refused_naming_the_nearest_options(overrides, message):
    """fairseq sets every override on the stored args, whatever its name: a misspelt one was silently ignored."""
    with pytest.raises(PluginOptionError, match=message):
        _load_golden_dca_k2(**overrides)


def test_every_option_of_fairseqs_command_lines_is_a_known_override_name():
    """fairseq's own tools override options by name too (fairseq-validate: task): none of them may be refused."""
    getters = (fairseq_options.get_training_parser, fairseq_options.get_generation_parser,
               fairseq_options.get_validation_parser, fairseq_options.get_eval_lm_parser,
               fairseq_options.get_interactive_generation_parser)  # fmt: skip
    dests = {action.dest for get in getters for action in get(default_task="translation")._actions}
    assert dests - {"help"} <= fairseq_hooks.known_option_names()
    assert dests - {"help"} <= fairseq_hooks._config_option_names()  # found without the models' add_args


def test_without_overrides_no_option_names_are_looked_up(monkeypatch):
    """Every plugin model's build passes the check; collecting the names costs about a second of CPU."""
    for names in ("_config_option_names", "_add_args_option_names"):
        monkeypatch.setattr(fairseq_hooks, names, lambda: pytest.fail("looked up"))
    fairseq_hooks.check_override_names(argparse.Namespace())
    fairseq_hooks.check_override_names(argparse.Namespace(plugin_checkpoint_overrides=[]))


def test_overrides_of_config_options_read_no_models_add_args(monkeypatch):
    """fairseq-validate's and fairseq-generate's overrides are config options: the models' add_args (~0.5 s of
    every such command) are read only for a name the config does not hold."""
    monkeypatch.setattr(fairseq_hooks, "_add_args_option_names", lambda: pytest.fail("looked up"))
    fairseq_hooks.check_override_names(argparse.Namespace(plugin_checkpoint_overrides=["task", "data", "beam"]))


def test_overrides_naming_fairseq_or_plugin_options_still_load():
    models, cfg, _task = _load_golden_dca_k2(beam=2, lenpen=0.5, dropout=0.2, dca_k=2)
    assert cfg.generation.beam == 2 and cfg.generation.lenpen == 0.5 and models[0].cfg.dropout == 0.2


# ------------------------------------------------------------------ fairseq's own shape and drop options


@pytest.mark.parametrize("option, value, message", [
    ("--encoder-layers", "-1", r"--encoder-layers must be an integer in \[0, 100000\], got -1"),
    ("--decoder-layers", "-3", r"--decoder-layers must be an integer in \[0, 100000\], got -3"),
    ("--encoder-embed-dim", "-4", r"--encoder-embed-dim must be an integer in \[1, 1048576\], got -4"),
    ("--decoder-embed-dim", "0", r"--decoder-embed-dim must be an integer in \[1, 1048576\], got 0"),
    ("--encoder-ffn-embed-dim", "0", r"--encoder-ffn-embed-dim must be an integer in \[1, 1048576\], got 0"),
    ("--decoder-attention-heads", "0", r"--decoder-attention-heads must be an integer in \[1, 1048576\], got 0"),
    ("--encoder-attention-heads", "3", r"--encoder-embed-dim \(16\) must be a multiple of --encoder-attention-heads \(3\)"),
    ("--encoder-layerdrop", "nan", r"--encoder-layerdrop must be in \[0, 1\], got nan"),
    ("--decoder-layerdrop", "inf", r"--decoder-layerdrop must be in \[0, 1\], got inf"),
    ("--dropout", "nan", r"--dropout must be in \[0, 1\], got nan"),
    ("--attention-dropout", "-0.1", r"--attention-dropout must be in \[0, 1\], got -0.1"),
    ("--max-source-positions", "-1", r"--max-source-positions must be an integer in \[1, 16777216\], got -1"),
    ("--max-target-positions", "0", r"--max-target-positions must be an integer in \[1, 16777216\], got 0"),
    ("--decoder-output-dim", "0", r"--decoder-output-dim must be an integer in \[1, 1048576\], got 0"),
    ("--quant-noise-pq", "nan", r"--quant-noise-pq must be in \[0, 1\], got nan"),
])  # fmt: skip
def test_fairseqs_shape_and_drop_options_are_refused_naming_themselves(option, value, message):
    with pytest.raises(PluginOptionError, match=f"^{message}"):
        build(parse_model_args(MODEL, [option, value]))


@pytest.mark.parametrize("flags", [
    ["--depth-aggregation", "denseformer"], ["--value-residual", "both"], ["--depth-aggregation", "dca"],
])  # fmt: skip
def test_a_nan_layer_drop_does_not_pass_the_layer_drop_refusals(flags):
    """The choices that refuse layer drop compared it with ``> 0``, which NaN passes; set after parsing (the
    Python API), it reaches those checks too."""
    args = parse_model_args(MODEL, [*SHAPE, *flags])
    args.encoder_layerdrop = args.decoder_layerdrop = math.nan
    with pytest.raises(PluginOptionError, match="layerdrop"):
        build(args)


# ------------------------------------------------------------------ the guidance criterion


def test_the_guidance_criterion_refuses_a_model_without_guidance_when_it_is_built():
    """fairseq builds the model (fairseq.models.build_model) and then the criterion for the same task: the
    criterion refuses there, before any batch, not in its forward."""
    task, guided = TinyTask(), TinyTask()
    models = [fairseq.models.build_model(parse_model_args(MODEL, SHAPE), task),  # kept alive, as fairseq-train does
              fairseq.models.build_model(parse_model_args(MODEL, [*SHAPE, "--guidance", "all"]), guided)]  # fmt: skip
    with pytest.raises(PluginOptionError, match="needs a model with a guidance_loss"):
        LabelSmoothedCrossEntropyWithGuidanceCriterion(task, False, 0.1)
    LabelSmoothedCrossEntropyWithGuidanceCriterion(guided, False, 0.1)  # a model with guidance: accepted
    assert len(models) == 2


def test_the_guidance_criterion_on_a_model_without_guidance_exits_1_with_one_line(corpus_bin, tmp_path):
    extra = ["--criterion", "label_smoothed_cross_entropy_with_guidance"]
    proc = run_forked(train_command(corpus_bin, tmp_path, "transformer_preln_e6d6", extra=extra), check=False)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(errors) == 1 and "needs a model with a guidance_loss" in errors[0] and "Traceback" not in proc.stderr
    assert "begin training epoch" not in proc.stdout  # refused when built, before the first epoch (and its batches)
