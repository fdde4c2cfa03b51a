"""What the benchmark runs: the baseline and the families, their targets, the precisions and devices, and how
one model of a line-up (a ``Contender``: trainer, decoding copy, measurements) is built.

Importing this module loads the plugin exactly as fairseq-train --user-dir does; the other bench_* modules
import it first."""

import argparse
import copy
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

logging.getLogger("fairseq").setLevel(logging.WARNING)  # fairseq logs at import
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # see benchmark.py (torch may be imported already)
import torch

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "fairseq_plugins"

from fairseq import options, tasks
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.dataclass.utils import (
    _set_legacy_defaults,
    convert_namespace_to_omegaconf,
    omegaconf_no_object_check,
    override_module_args,
)
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.optim import OPTIMIZER_REGISTRY
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.tasks import TASK_REGISTRY
from fairseq.trainer import Trainer
from fairseq.utils import import_user_module
from omegaconf import OmegaConf

# exactly as fairseq-train --user-dir loads the plugin: the package, then every file of its models/ folder,
# so a family whose file is not yet imported by models/__init__.py is found too
import_user_module(argparse.Namespace(user_dir=str(PLUGIN_DIR)))
from fairseq_plugins.axes import declarations
from fairseq_plugins.models.presets import DEPTHS, PRESETS, WIDTHS  # noqa: F401
from fairseq_plugins.precision import enable_autocast

BASELINE = "transformer_preln"
DEFAULT_DEPTHS = ("e6d6", "e12d12", "e18d18", "e36d6")
# families that are fairseq's own transformer: no target, but transformer_postln is a useful control
NOT_BENCHMARKED = {BASELINE}

# training options a family needs, as in its recipes (a criterion that is not registered yet is dropped)
FAMILY_ARGS: dict[str, list[str]] = {
    "crossformer_sg": ["--criterion", "label_smoothed_cross_entropy_with_guidance"],
}

# precision name -> fairseq-train options. fp16: fairseq's own (half weights, dynamic loss scaling); bf16: the
# plugin's autocast (float32 weights, bfloat16 matrix products; fairseq_plugins/precision.py), applied to the
# built model with enable_autocast, which is what --autocast-dtype bfloat16 does (one code path for the families
# and the baseline)
PRECISIONS: dict[str, list[str]] = {"fp32": [], "fp16": ["--fp16"], "bf16": []}
AUTOCAST = {"bf16": torch.bfloat16}
SRC, TGT = "de", "en"
DEVICES = ("cpu", "cuda")
DEFAULT_PRECISIONS = {"cpu": ("fp32",), "cuda": ("fp32", "fp16", "bf16")}


@dataclass(frozen=True)
class Target:
    """A family's bound on its ratio to the matched baseline (an axis choice's ``Speed``, on its preset).

    metric: train / decode (throughput ratio), memory (peak-memory ratio), or train_flat (training ratio at
    the deepest measured depth over the ratio at the shallowest, depths ordered by total layers).
    depth: a depth name, or None for every measured depth.
    """

    family: str
    metric: str
    op: str  # ">=", "<=" or "<"
    bound: float
    depth: str | None = None

    def holds(self, value: float) -> bool:
        return {">=": value >= self.bound, "<=": value <= self.bound, "<": value < self.bound}[self.op]


# every axis choice's declared speed bounds (axes/__init__.py: ``speed``; issue 15 item 1, issue 27 item 3), each
# measured on the choice's preset (ratios to the matched baseline of the same run, width 256, one thread); plus
# Crossformer's soft guidance, which is no axis choice (axes/tying.py) and matches Pre-LN as issue 15 asks
DECLARED_TARGETS: tuple[Target, ...] = tuple(
    Target(choice.preset, bound.metric, bound.op, bound.bound, bound.depth)
    for table in declarations().values() for choice in table.values() for bound in choice.speed
)  # fmt: skip
TARGETS: tuple[Target, ...] = (*DECLARED_TARGETS,
                               *(Target("crossformer_sg", metric, ">=", 0.98) for metric in ("train", "decode")))  # fmt: skip


class BenchmarkError(Exception):
    """A bad option or missing input: reported as one line naming it, exit status 2."""


WIDTH_NAMES = {(infix.rstrip("_") or "base"): infix for infix in WIDTHS}


def registered_families() -> list[str]:
    """Every family of the preset table but the baseline, in registration order."""
    return list(dict.fromkeys(p.family for p in PRESETS.values() if p.family not in NOT_BENCHMARKED))


def check_device(device: str) -> None:
    """Stop with one clear line when --device cuda is asked for on a machine without a usable GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchmarkError(
            f"--device cuda: no CUDA device is available (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda or 'none'}); run on a GPU machine or use --device cpu"
        )


def precision_args(precision: str, device: str) -> list[str]:
    """fairseq-train options of a precision on a device (fairseq's fp16 on the CPU needs unflattened grads)."""
    return list(PRECISIONS[precision]) + (["--fp16-no-flatten-grads"] if precision == "fp16" and device == "cpu" else [])



def shape_args(opts) -> list[str]:
    """Command-line width overrides (the presets' widths otherwise)."""
    out = []
    for option, value in (("embed-dim", opts.embed_dim), ("ffn-embed-dim", opts.ffn_dim), ("attention-heads", opts.heads)):
        if value is not None:
            out += [f"--encoder-{option}", str(value), f"--decoder-{option}", str(value)]
    return out


def family_args(family: str) -> tuple[list[str], str | None]:
    """The family's extra training options, and a note when one of them cannot be used yet."""
    args = list(FAMILY_ARGS.get(family, []))
    if "--criterion" in args:
        criterion = args[args.index("--criterion") + 1]
        if criterion not in CRITERION_REGISTRY:
            i = args.index("--criterion")
            del args[i : i + 2]
            return args, f"criterion {criterion} not registered: trained with label_smoothed_cross_entropy"
    return args, None


@dataclass
class Contender:
    """One model of a depth's line-up: its trainer, its decoding copy and its measurements."""

    name: str  # family name, or the baseline's
    arch: str
    trainer: Trainer
    task: object
    decode_model: torch.nn.Module
    generator: object
    cfg: object
    criterion: str
    note: str | None
    precision: str = "fp32"  # a key of PRECISIONS
    device: str = "cpu"
    train_s: list[float] = field(default_factory=list)  # wall-clock seconds per measurement
    decode_s: list[float] = field(default_factory=list)
    train_cpu_s: list[float] = field(default_factory=list)  # this process's CPU seconds, same measurements
    decode_cpu_s: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


# (cfg field, the argument naming its registry entry, the registry): what fairseq stores as a Namespace of all the
# arguments when the entry has no dataclass (every plugin model)
_LEGACY_FIELDS = (("task", "task", TASK_REGISTRY), ("model", "arch", ARCH_MODEL_REGISTRY),
                  ("optimizer", "optimizer", OPTIMIZER_REGISTRY),
                  ("lr_scheduler", "lr_scheduler", LR_SCHEDULER_REGISTRY),
                  ("criterion", "criterion", CRITERION_REGISTRY))  # fmt: skip
_COMPOSED: dict[tuple, dict] = {}


def namespace_to_config(args: argparse.Namespace):
    """fairseq's convert_namespace_to_omegaconf(args), the same config. Its hydra composition (~0.4 s of CPU, most
    of building a contender at tiny width) depends only on the overrides fairseq derives from the arguments, which
    are the same for every contender of a line-up but one with its own criterion: it runs once per set of
    overrides, and the rest of fairseq's function (no hook: its tail is copied from fairseq/dataclass/utils.py)
    runs for each contender on a copy of that composition."""
    overrides, deletes = override_module_args(args)
    key = (tuple(overrides), tuple(deletes))
    if key not in _COMPOSED:
        cfg = convert_namespace_to_omegaconf(args)
        # the composition as fairseq had it before storing the Namespaces: those fields were None
        composed = OmegaConf.to_container(cfg)
        _COMPOSED[key] = {k: None if isinstance(v, argparse.Namespace) else v for k, v in composed.items()}
        return cfg
    cfg = OmegaConf.create(copy.deepcopy(_COMPOSED[key]))
    with omegaconf_no_object_check():
        for field_, name, registry in _LEGACY_FIELDS:
            if cfg[field_] is None and getattr(args, name, None):
                cfg[field_] = argparse.Namespace(**vars(args))
                _set_legacy_defaults(cfg[field_], registry[getattr(args, name)])
                cfg[field_]._name = getattr(args, name)
    OmegaConf.set_struct(cfg, True)
    return cfg


def build_contender(name: str, arch: str, data_dir: Path, opts, precision: str = "fp32", extra_args=()) -> Contender:
    extra, note = family_args(name)
    device = getattr(opts, "device", "cpu")
    parser = options.get_training_parser()
    options.add_generation_args(parser)
    argv = [
        str(data_dir), "--task", "translation", "--source-lang", SRC, "--target-lang", TGT,
        *(["--cpu"] if device == "cpu" else []),
        "--arch", arch, "--share-all-embeddings", "--seed", str(opts.seed),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(opts.max_tokens), "--num-workers", "0",
        # decoding: beam search with a forced length (see benchmark.py's docstring)
        "--beam", str(opts.beam), "--max-len-a", "0", "--max-len-b", str(opts.decode_len),
        "--min-len", str(opts.decode_len),
        *shape_args(opts), *precision_args(precision, device), *extra, *extra_args,
    ]  # fmt: skip
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = namespace_to_config(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(opts.seed)
    model = enable_autocast(task.build_model(cfg.model), AUTOCAST.get(precision))
    decode_model = copy.deepcopy(model)  # before the Trainer casts (fp16) or moves (CUDA) the training copy
    decode_model.prepare_for_inference_(cfg)  # what fairseq-generate does (beamable cross-attention)
    if precision == "fp16":
        decode_model.half()  # as fairseq-generate --fp16
    decode_model.to(device).eval()
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)  # moves model and criterion to CUDA unless --cpu
    generator = task.build_generator([decode_model], cfg.generation)
    return Contender(name, arch, trainer, task, decode_model, generator, cfg, cfg.criterion._name, note,
                     precision, device)  # fmt: skip
