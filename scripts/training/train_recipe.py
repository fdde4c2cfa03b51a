#!/usr/bin/env python
"""Train named architectures on a prepared dataset with one paper's set-up (recipes/train.sh).

    python scripts/training/train_recipe.py residual_iwslt_e12d12 iwslt14_en_de
    python scripts/training/train_recipe.py --hparams dca dca_e6d6,transformer_preln_e6d6 wmt14_de_en
    python scripts/training/train_recipe.py --dry-run --gpus 8 --nodes 4 crossformer_sg_e6d6 wmt14_en_de

The set-up (``--hparams``, HPARAMS) fixes every hyper-parameter, the direction, embedding sharing,
precision, checkpoint choice and early stopping, each with its source (scripts/training/setups.py; the dry
run prints them, and the run stores them in SAVE_DIR/train_setup.json). It is chosen once for all the
architectures of a run (several are separated by commas and trained one after the other): ``auto`` is the
family default of the first architecture, ``paper``/``authors`` that family's paper or its authors'
configuration, or a set-up by name (residual-paper, residual-authors, crossformer-paper, dca). Runs that
share a set-up get the same command except ``--arch``, ``--save-dir`` and the options only their model has
(the guidance criterion of crossformer_sg, ResiDual's dual-branch scale in half precision).

Batches are exact: ``processes x --max-tokens x --update-freq`` equals the set-up's tokens per update for
any number of GPUs and nodes (``--max-tokens`` is lowered per GPU where needed; a count that cannot split
the batch stops with the counts that can). One process runs fairseq-train itself; more run under torchrun
(scripts/training/fairseq_rank.py, the same path on CPU with gloo as on GPUs with NCCL) or, inside a SLURM
allocation, under srun with fairseq's own SLURM detection. ``--dry-run`` needs neither GPUs nor data: a
dataset name without a data directory is planned from the set-up and the assumptions are printed.
Anything after ``--`` goes to fairseq-train last, so it overrides the recipe (and the dry run says which
set-up values it changes).

Golden commands: ``--write-golden tests/golden/train_commands.txt`` rewrites the checked-in table of
every (set-up, dataset, family, GPU count) command that tests/test_golden_commands.py compares.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from setups import (
    DATASETS,
    FIELDS,
    MULTILINGUAL,
    SETUPS,
    SETUPS_ORDER,
    Sourced,
    choose_setup,
    exact_worlds,
    override,
    setup_rows,
    split_batch,
)
from training_common import (
    PLUGIN_DIR,
    REPO,
    RecipeError,
    fairseq_module,
    log,
    read_manifest,
    run_main,
    split_passthrough,
    write_json,
    write_lines,
)

TAG = "train"
GUIDANCE_CRITERION = "label_smoothed_cross_entropy_with_guidance"
RANK_SCRIPT = Path(__file__).resolve().with_name("fairseq_rank.py")
LAUNCHERS = ("auto", "torchrun", "slurm")
DEFAULT_PORT = "29500"
MULTILINGUAL_TASK = "translation_multi_simple_epoch"
# the direction of each dataset's default data-bin (prepare_*.sh without SRC/TGT)
DEFAULT_DIRECTION = {"iwslt14": ("de", "en"), "wmt14_en_de": ("en", "de"), "wmt14_en_fr": ("en", "fr"),
                     "multi30k": ("de", "en")}  # fmt: skip
PREPARE = {"iwslt14": "prepare_iwslt14.sh", "wmt14_en_de": "prepare_wmt14.sh", "wmt14_en_fr": "prepare_wmt14.sh",
           "opus100": "prepare_opus100.sh", "multi30k": "prepare_multi30k.sh"}  # fmt: skip
BLEU_ARGS = '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}'


# ------------------------------------------------------------------------------------- architectures


def registered_architectures() -> dict[str, str]:
    """{arch: model} of every architecture fairseq knows once the plugin is imported."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    import fairseq_plugins  # noqa: F401  (registers the plugin's architectures)

    return dict(ARCH_MODEL_NAME_REGISTRY)


def check_architecture(arch: str) -> str:
    """The model name of ``arch``; an unknown name stops with the plugin's families listed."""
    archs = registered_architectures()
    if arch not in archs:
        plugin = sorted({a.rsplit("_", 1)[0] + "_*" for a in archs if re.search(r"_e\d+d\d+$", a)})
        close = [a for a in sorted(archs) if a.split("_")[0] == arch.split("_")[0]][:8]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise RecipeError(
            f"unknown architecture {arch!r} (ARCH): not registered with fairseq after importing fairseq_plugins. "
            f"Families: {', '.join(plugin)} with depths e6d6 e12d12 e18d18 e24d24 e12d6 e18d6 e24d6 e36d6{hint}"
        )
    return archs[arch]


def arch_width(arch: str) -> str | None:
    from fairseq_plugins.models.presets import PRESETS

    preset = PRESETS.get(arch)
    return f"{preset.width.embed_dim}/{preset.width.ffn_dim}/{preset.width.heads}" if preset else None


def cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---------------------------------------------------------------------------------------- arguments


def nonnegative(name: str, env: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} ({env}) {text!r}: expected an integer >= 0") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} ({env}) {value}: must be >= 0")
        return value

    return parse


def positive(name: str, env: str):
    def parse(text: str) -> int:
        value = nonnegative(name, env)(text)
        if value == 0:
            raise argparse.ArgumentTypeError(f"{name} ({env}) 0: must be > 0")
        return value

    return parse


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the option, exit status 1, as every RecipeError
        raise RecipeError(message)


def parse_args(argv=None):
    own, extra = split_passthrough(argv)
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
               usage="%(prog)s [options] ARCH[,ARCH...] DATASET [-- fairseq-train options]")  # fmt: skip
    p.add_argument("arch", nargs="?", help="registered --arch names, comma-separated, e.g. residual_e6d6,transformer_preln_e6d6")
    p.add_argument("dataset", nargs="?", help="data-bin/NAME (e.g. iwslt14_de_en) or a directory; in a dry run also a "
                                              f"dataset name without data ({', '.join(DATASETS)}[_SRC_TGT])")  # fmt: skip
    p.add_argument("--data-bin", type=Path, help="the binarized data directory (DATA_BIN; default data-bin/DATASET)")
    p.add_argument("--save-dir", type=Path, help="checkpoints (SAVE_DIR; default checkpoints/DATASET/ARCH; "
                                                 "with several architectures SAVE_DIR/ARCH)")  # fmt: skip
    p.add_argument("--hparams", default="auto", help="the set-up (HPARAMS): auto (the first architecture's family "
                                                     "default), paper, authors, " + ", ".join(SETUPS_ORDER))  # fmt: skip
    p.add_argument("--fp16", default="auto", choices=("auto", "1", "0"),
                   help="FP16: auto (the set-up's precision on GPUs, fp32 on CPU), 1 (half precision) or 0 (fp32)")
    p.add_argument("--gpus", type=nonnegative("--gpus", "NUM_GPUS"),
                   help="GPUs per node (NUM_GPUS; default all visible; 0 = CPU)")
    p.add_argument("--nodes", type=positive("--nodes", "NUM_NODES"), default=1, help="nodes (NUM_NODES; default 1)")
    p.add_argument("--cpu-procs", type=positive("--cpu-procs", "CPU_PROCS"), default=1,
                   help="CPU processes per node with --gpus 0 (CPU_PROCS; default 1; more train with gloo)")
    p.add_argument("--launcher", default="auto", choices=LAUNCHERS,
                   help="LAUNCHER for more than one process: auto (slurm inside a SLURM allocation, else torchrun)")
    p.add_argument("--max-update", type=nonnegative("--max-update", "MAX_UPDATE"), help="override the set-up's updates")
    p.add_argument("--max-tokens", type=positive("--max-tokens", "MAX_TOKENS"),
                   help="largest batch per GPU (MAX_TOKENS; default the set-up's; lowered to split the batch exactly)")
    p.add_argument("--tokens-per-update", type=positive("--tokens-per-update", "TOKENS_PER_UPDATE"),
                   help="override the set-up's tokens per update")
    p.add_argument("--average-last", type=positive("--average-last", "AVERAGE_LAST"),
                   help="average the last N update checkpoints (default: as the set-up chooses checkpoints)")
    p.add_argument("--seed", type=nonnegative("--seed", "SEED"), help="random seed (SEED; default the set-up's)")
    p.add_argument("--direction", default="setup", choices=("setup", "data"),
                   help="DIRECTION: setup (data in another direction than the set-up's is an error) or data "
                        "(train the data's direction; recorded as a deviation)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the set-up and the command(s) and stop (DRY_RUN=1)")
    p.add_argument("--write-golden", type=Path, metavar="FILE", help="write the golden command table and stop")
    args = p.parse_args(own)
    args.extra = extra
    if args.write_golden is None and (args.arch is None or args.dataset is None):
        raise RecipeError("ARCH and DATASET are required: usage: train_recipe.py ARCH[,ARCH...] DATASET")
    args.archs = [a for a in (args.arch or "").split(",") if a]
    if len(set(args.archs)) != len(args.archs):
        raise RecipeError(f"ARCH {args.arch!r} names an architecture twice")
    if args.gpus and args.cpu_procs > 1:
        raise RecipeError(f"--cpu-procs {args.cpu_procs} (CPU_PROCS) is for --gpus 0 (NUM_GPUS=0) only")
    return args


# --------------------------------------------------------------------------------------------- data


def parse_dataset_name(name: str) -> tuple[str, tuple[str, str] | None] | None:
    """(dataset, direction or None) of a data-bin name such as iwslt14_de_en, wmt14_de_en, opus100."""
    if name in DATASETS and not name.startswith("wmt14_"):
        return name, None
    m = re.fullmatch(r"(iwslt14|multi30k|wmt14)_([a-z]{2})_([a-z]{2})", name)
    if not m:
        return None
    base, src, tgt = m.groups()
    if base == "wmt14":
        other = {src, tgt} - {"en"}
        if "en" not in (src, tgt) or len(other) != 1 or f"wmt14_en_{other.pop()}" not in DATASETS:
            return None
        base = f"wmt14_en_{({src, tgt} - {'en'}).pop()}"
    return base, (src, tgt)


def resolve_data(args, read: bool = True) -> tuple[Path, dict | None, str]:
    """(data directory, its manifest or None when only planned, the data-bin name)."""
    name = Path(args.dataset).name if Path(args.dataset).is_dir() else args.dataset
    path = args.data_bin or (Path(args.dataset) if Path(args.dataset).is_dir() else REPO / "data-bin" / args.dataset)
    if read and path.is_dir():
        return path, read_manifest(path), name
    if not args.dry_run:
        raise RecipeError(f"DATASET={args.dataset!r}: no data directory {path}; prepare it with recipes/prepare_*.sh "
                          "or set DATA_BIN (DRY_RUN=1 plans a run without data)")  # fmt: skip
    if parse_dataset_name(Path(name).name) is None:
        raise RecipeError(f"DATASET={args.dataset!r}: no data directory {path}, and for a dry run without data the "
                          f"name must be one of {', '.join(DATASETS)} or DATASET_SRC_TGT (e.g. iwslt14_en_de)")  # fmt: skip
    return path, None, Path(name).name


# --------------------------------------------------------------------------------------------- plan


@dataclass
class Plan:
    arch: str
    model: str
    setup: str
    why: str
    dataset: str
    data: Path
    save_dir: Path
    rows: dict[str, Sourced]
    direction: str
    precision: str
    processes: int  # per node
    nodes: int
    gpus: int
    launcher: str  # single | torchrun | slurm
    max_tokens: int
    update_freq: int
    tokens_per_update: int  # of the final command, pass-through included
    command: list[str]
    assumed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.processes * self.nodes


def last_value(cmd: list[str], option: str) -> str | None:
    """The value of the last ``option`` in ``cmd`` (the one argparse keeps)."""
    if option not in cmd:
        return None
    i = len(cmd) - 1 - cmd[::-1].index(option)
    return cmd[i + 1] if i + 1 < len(cmd) else None


def check_direction(rows, manifest, assumed_manifest: bool, name_direction, args, assumed, notes) -> tuple[str, str]:
    """(source, target) to train, checked against the set-up's direction."""
    want = rows["direction"].value
    if assumed_manifest:
        have = name_direction or (want if isinstance(want, tuple) else DEFAULT_DIRECTION[manifest["dataset"]])
        assumed.append(f"direction {have[0]}->{have[1]} ({'from the name' if name_direction else 'the set-up' if isinstance(want, tuple) else 'the default data-bin'})")  # fmt: skip
    else:
        have = (manifest["source_lang"], manifest["target_lang"])
    if isinstance(want, tuple) and have != want:
        if args.direction == "data":
            notes.append(f"DEVIATION: trains {have[0]}->{have[1]}; the set-up trains {want[0]}->{want[1]} "
                         f"({rows['direction'].source})")  # fmt: skip
        else:
            dataset = manifest["dataset"]
            raise RecipeError(
                f"the data is {have[0]}->{have[1]} but the set-up trains {want[0]}->{want[1]} "
                f"({rows['direction'].source}): prepare that direction (SRC={want[0]} TGT={want[1]} bash "
                f"recipes/{PREPARE[dataset]}), choose another HPARAMS, or set DIRECTION=data (--direction data) "
                "to train the data's direction as a recorded deviation"
            )
    return have


def embedding_options(rows, manifest, assumed_manifest: bool, assumed, notes) -> list[str]:
    kind = rows["embeddings"]
    joined = manifest.get("joined_dictionary")
    if joined is None:
        joined = True
        (assumed if assumed_manifest else notes).append(
            "a joined source/target dictionary (every prepare_*.sh builds one; recipe.json has no joined_dictionary)"
        )
    if kind.value == "share-all":
        if not joined:
            raise RecipeError(
                f"the set-up shares all embeddings ({kind.source}), which needs one joined dictionary, but the data "
                f"has separate source and target dictionaries (recipe.json: joined_dictionary false): prepare it "
                "with a joined dictionary or choose a set-up with separate embeddings (HPARAMS=crossformer-paper)"
            )
        return ["--share-all-embeddings"]
    if joined:
        notes.append("the data has a joined dictionary: source and target embeddings are separate matrices over "
                     "the same vocabulary, so the parameter count differs from the set-up's (separate dictionaries)")  # fmt: skip
    return ["--share-decoder-input-output-embed"]


def precision_options(precision: str, gpus: int) -> list[str]:
    if precision == "fp16":  # on CPU plain --fp16 asserts CUDA; --fp16-no-flatten-grads trains in half precision
        return ["--fp16"] + (["--fp16-no-flatten-grads"] if gpus == 0 else [])
    return {"fp32": [], "amp": ["--amp"], "memory-efficient-fp16": ["--memory-efficient-fp16"]}[precision]


def checkpoint_options(kind: str, segmentation: str) -> list[str]:
    if kind == "best-loss":
        return ["--no-epoch-checkpoints"]
    if kind == "best-bleu":
        remove = ["sentencepiece"] if segmentation == "sentencepiece" else []
        return ["--no-epoch-checkpoints", "--eval-bleu", "--eval-bleu-args", BLEU_ARGS, "--eval-bleu-detok", "moses",
                "--eval-bleu-remove-bpe", *remove, "--best-checkpoint-metric", "bleu",
                "--maximize-best-checkpoint-metric"]  # fmt: skip
    if kind == "last-10-epochs":
        return ["--keep-last-epochs", "10"]
    n = int(kind.removeprefix("average-"))
    return ["--no-epoch-checkpoints", "--save-interval-updates", "1000", "--keep-interval-updates", str(n)]


def arch_options(model: str, rows, precision: str) -> list[str]:
    """The options only this architecture's model has: the one difference between runs of one set-up."""
    if model == "crossformer_sg":
        options = ["--criterion", GUIDANCE_CRITERION, "--guidance-weight", repr(rows["guidance_weight"].value)]
    else:
        options = ["--criterion", "label_smoothed_cross_entropy"]
    scale = rows["dual_residual_scale"].value
    if model == "residual_transformer" and scale is not None and precision in ("fp16", "memory-efficient-fp16"):
        options += ["--dual-residual-scale", repr(scale)]  # ResiDual appendix H.3: keeps the dual stream in range
    return options


def choose_launcher(args, world: int, env) -> str:
    if world == 1:
        return "single"
    if args.launcher != "auto":
        return args.launcher
    return "slurm" if env.get("SLURM_JOB_ID") else "torchrun"


def launcher_prefix(launcher: str, args, processes: int, env, notes) -> list[str]:
    if launcher == "single":
        return fairseq_module("train")
    if launcher == "slurm":
        # one task per process; no --gpus-per-task: fairseq sets the device from SLURM_LOCALID, which needs
        # every GPU of the node visible to every task
        return ["srun", "--nodes", str(args.nodes), "--ntasks-per-node", str(processes), *fairseq_module("train")]
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    if args.nodes == 1:
        return [*run, "--standalone", str(RANK_SCRIPT)]
    for var in ("NODE_RANK", "MASTER_ADDR"):
        if not env.get(var) and not args.dry_run:
            raise RecipeError(f"NUM_NODES={args.nodes} with torchrun: set {var} on every node "
                                  "(NODE_RANK 0..NUM_NODES-1, MASTER_ADDR the address of node 0; MASTER_PORT "
                                  f"default {DEFAULT_PORT})")  # fmt: skip
    notes.append(f"run the per-node command on each of the {args.nodes} nodes with NODE_RANK=0..{args.nodes - 1}, "
                 f"MASTER_ADDR=<node 0's address> and MASTER_PORT (default {DEFAULT_PORT})")  # fmt: skip
    return [*run, "--nnodes", str(args.nodes), "--node-rank", env.get("NODE_RANK") or "${NODE_RANK}",
            "--master-addr", env.get("MASTER_ADDR") or "${MASTER_ADDR}",
            "--master-port", env.get("MASTER_PORT") or f"${{MASTER_PORT:-{DEFAULT_PORT}}}", str(RANK_SCRIPT)]  # fmt: skip


def plan(args, arch: str, setup: str, why: str, env=None, visible: int | None = None, read_data: bool = True) -> Plan:
    """Everything a run of ``arch`` needs, and its command; pure (no GPU or data needed in a dry run)."""
    env = os.environ if env is None else env
    model = check_architecture(arch)
    data, manifest, name = resolve_data(args, read_data)
    assumed: list[str] = []
    notes: list[str] = []
    assumed_manifest = manifest is None
    name_direction = None
    if assumed_manifest:
        dataset, name_direction = parse_dataset_name(name)
        manifest = {"dataset": dataset}
        assumed.append(f"no data at {data}: planned as {dataset} prepared by recipes/{PREPARE[dataset]}")
    rows = setup_rows(setup, manifest["dataset"])

    # the user's overrides replace the set-up's values, and say so
    for option, fld, value in (("--max-update (MAX_UPDATE)", "max_update", args.max_update),
                               ("--max-tokens (MAX_TOKENS)", "max_tokens", args.max_tokens),
                               ("--tokens-per-update (TOKENS_PER_UPDATE)", "tokens_per_update", args.tokens_per_update),
                               ("--seed (SEED)", "seed", args.seed),
                               ("--average-last (AVERAGE_LAST)", "checkpoint",
                                f"average-{args.average_last}" if args.average_last else None)):  # fmt: skip
        if value is not None:
            override(rows, fld, value, option)

    # processes and exact batches
    gpus = (visible if visible is not None else cuda_devices()) if args.gpus is None else args.gpus
    processes = gpus or args.cpu_procs
    world = processes * args.nodes
    tokens = rows["tokens_per_update"].value
    split = split_batch(tokens, world, rows["max_tokens"].value)
    if split is None:
        raise RecipeError(
            f"{tokens} tokens per update ({rows['tokens_per_update'].source}) cannot be split exactly over "
            f"{world} processes ({args.nodes} node(s) x {processes} {'GPU(s)' if gpus else 'CPU process(es)'}) with at "
            f"most {rows['max_tokens'].value} tokens per GPU batch: processes x --max-tokens x --update-freq must "
            f"equal {tokens}, and lowering --max-tokens (MAX_TOKENS) cannot help when the process count does not "
            f"divide it. Choose NUM_NODES x NUM_GPUS (--nodes x --gpus; CPU_PROCS on CPU) among "
            f"{', '.join(map(str, exact_worlds(tokens)))}, or set TOKENS_PER_UPDATE (--tokens-per-update)"
        )
    max_tokens, update_freq = split
    if max_tokens < rows["max_tokens"].value:
        notes.append(f"--max-tokens lowered from {rows['max_tokens'].value} to {max_tokens} per GPU so that "
                     f"{world} x {max_tokens} x {update_freq} = {tokens}")  # fmt: skip
    launcher = choose_launcher(args, world, env)
    if launcher == "slurm" and world > 1 and processes == 1:
        raise RecipeError("LAUNCHER=slurm with one process per node: fairseq's SLURM detection then counts the node's "
                          "GPUs itself (and the batch would change); use NUM_GPUS >= 2 per node or LAUNCHER=torchrun")  # fmt: skip
    if launcher == "slurm" and env.get("SLURM_NNODES") and int(env["SLURM_NNODES"]) != args.nodes:
        raise RecipeError(f"NUM_NODES={args.nodes} (--nodes) but the SLURM allocation has SLURM_NNODES={env['SLURM_NNODES']}")
    if gpus and launcher != "slurm":
        available = visible if visible is not None else cuda_devices()
        if gpus > available:
            if not args.dry_run:
                raise RecipeError(f"--gpus {gpus} (NUM_GPUS): only {available} CUDA device(s) visible")
            assumed.append(f"{gpus} GPU(s) per node (this machine has {available}: planning only)")

    # precision
    want = rows["precision"].value
    if args.fp16 == "0":
        precision = "fp32"
    elif args.fp16 == "1":
        precision = want if want in ("fp16", "memory-efficient-fp16") else "fp16"
    else:
        precision = want if gpus else "fp32"
    if precision != want:
        why_not = "FP16=" + args.fp16 if args.fp16 != "auto" else "on CPU (FP16=1 trains in half precision there too)"
        notes.append(f"precision {precision}: the set-up's is {want} ({rows['precision'].source}); {why_not}")

    # the command
    if rows["direction"].value == MULTILINGUAL:
        direction = MULTILINGUAL
        task = multilingual_options(manifest, assumed_manifest, assumed)
    else:
        src, tgt = check_direction(rows, manifest, assumed_manifest, name_direction, args, assumed, notes)
        direction = f"{src}->{tgt}"
        task = ["--task", "translation", "--source-lang", src, "--target-lang", tgt]
    width = arch_width(arch)
    if rows["width"].value != "any" and width and width != rows["width"].value:
        notes.append(f"{arch} has width {width}; the set-up was run at {rows['width'].value} ({rows['width'].source})")
    v = {k: r.value for k, r in rows.items()}
    cmd = [data, "--user-dir", PLUGIN_DIR, "--arch", arch, *task,
           "--optimizer", v["optimizer"], "--adam-betas", v["adam_betas"], "--lr", repr(v["lr"]),
           "--lr-scheduler", v["lr_scheduler"], "--warmup-updates", str(v["warmup_updates"]),
           "--warmup-init-lr", repr(v["warmup_init_lr"]), "--weight-decay", repr(v["weight_decay"]),
           "--clip-norm", repr(v["clip_norm"]), "--dropout", repr(v["dropout"]),
           "--attention-dropout", repr(v["attention_dropout"]), "--activation-dropout", repr(v["activation_dropout"]),
           "--label-smoothing", repr(v["label_smoothing"]),
           *embedding_options(rows, manifest, assumed_manifest, assumed, notes)]  # fmt: skip
    if v["max_positions"]:
        cmd += ["--max-source-positions", str(v["max_positions"]), "--max-target-positions", str(v["max_positions"])]
    cmd += ["--max-tokens", str(max_tokens), "--update-freq", str(update_freq), "--max-update", str(v["max_update"])]
    cmd += precision_options(precision, gpus)
    if v["fp16_init_scale"] and precision != "fp32":
        cmd += ["--fp16-init-scale", str(v["fp16_init_scale"])]
    cmd += checkpoint_options(v["checkpoint"], manifest.get("segmentation", "bpe"))
    if v["patience"]:
        cmd += ["--patience", str(v["patience"])]
    cmd += ["--seed", str(v["seed"]), "--log-format", "simple", "--log-interval", "100"]
    if not gpus:
        cmd += ["--cpu"]
    if world > 1:
        cmd += ["--distributed-world-size", str(world)]
        if not gpus:  # NCCL needs GPUs; fairseq's c10d DDP wrapper does not run on CPU tensors here
            cmd += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
        if launcher == "slurm":
            cmd += ["--distributed-port", env.get("MASTER_PORT") or DEFAULT_PORT]
    cmd += ["--save-dir", args.save_dir_for(arch, name), *arch_options(model, rows, precision)]
    extra_flags = {a for a in args.extra if a.startswith("--")}
    # pass-through options replace the recipe's (argparse keeps the last); the arch-bound ones are then dropped
    bound = arch_options(model, rows, precision)
    if "--dual-residual-scale" in extra_flags and "--dual-residual-scale" in bound:
        i = cmd.index("--dual-residual-scale")
        del cmd[i : i + 2]
    changed = sorted(f for f in extra_flags if f in cmd)
    if changed:
        notes.append(f"pass-through after -- overrides the recipe's {', '.join(changed)}")
    cmd = [str(c) for c in launcher_prefix(launcher, args, processes, env, notes) + cmd + list(args.extra)]
    given = [last_value(cmd, o) or "1" for o in ("--max-tokens", "--update-freq", "--distributed-world-size")]
    final = tokens
    if not all(g.isdigit() for g in given):  # e.g. a per-epoch --update-freq list
        notes.append(f"DEVIATION: pass-through batch options {' '.join(given)}: tokens per update not checked")
    elif (final := int(given[0]) * int(given[1]) * int(given[2])) != tokens:
        notes.append(f"DEVIATION: the pass-through options give {final} tokens per update; the set-up's is {tokens}")
    return Plan(arch, model, setup, why, manifest["dataset"], data, Path(args.save_dir_for(arch, name)), rows,
                direction, precision, processes, args.nodes, gpus, launcher, max_tokens, update_freq, final, cmd,
                assumed, notes)  # fmt: skip


def multilingual_options(manifest: dict, assumed_manifest: bool, assumed: list[str]) -> list[str]:
    """fairseq's translation_multi_simple_epoch options for data prepared for it (scripts/training/multilingual.py)."""
    if assumed_manifest:
        assumed.append("the language pairs, language tokens and temperature sampling come from the prepared data's "
                       "recipe.json (scripts/training/multilingual.py): not in a dry run without data")  # fmt: skip
        return ["--task", MULTILINGUAL_TASK]
    if manifest.get("task") != MULTILINGUAL_TASK:
        raise RecipeError(
            f"the set-up trains {MULTILINGUAL_TASK} (all directions, one model) but the data's recipe.json has task "
            f"{manifest.get('task', 'translation')!r}: prepare it again with recipes/prepare_opus100.sh"
        )
    from multilingual import train_args  # only here: the multilingual data's own helper

    return list(train_args(manifest))


# ----------------------------------------------------------------------------------------- printing


def render(cmd: list[str]) -> str:
    """The command as a shell line; ``${VAR}`` placeholders stay unquoted so the shell expands them."""
    return " ".join(c if c.startswith("${") else shlex.quote(c) for c in cmd)


def describe(p: Plan) -> list[str]:
    lines = [f"set-up {p.setup} ({p.why}) for {p.arch} on {p.dataset} ({p.direction}):"]
    for name in FIELDS:
        value = p.rows[name].value
        shown = f"{value[0]}->{value[1]}" if isinstance(value, tuple) else str(value)
        lines.append(f"  {name:<20} {shown:<22} {p.rows[name].source}")
    lines += [f"assumed: {a}" for a in p.assumed] + [f"note: {n}" for n in p.notes]
    unit = "GPU(s)" if p.gpus else "CPU process(es)"
    lines.append(f"tokens per update: {p.nodes} node(s) x {p.processes} {unit} x --max-tokens {p.max_tokens} x "
                 f"--update-freq {p.update_freq} = {p.tokens_per_update}")  # fmt: skip
    return lines


def manifest_of(p: Plan, args) -> dict:
    return {
        "arch": p.arch, "model": p.model, "setup": p.setup, "setup_chosen_by": p.why, "dataset": p.dataset,
        "data": str(p.data), "direction": p.direction, "precision": p.precision,
        "values": {k: {"value": list(r.value) if isinstance(r.value, tuple) else r.value, "source": r.source}
                   for k, r in p.rows.items()},
        "nodes": p.nodes, "processes_per_node": p.processes, "gpus_per_node": p.gpus, "launcher": p.launcher,
        "max_tokens": p.max_tokens, "update_freq": p.update_freq, "tokens_per_update": p.tokens_per_update,
        "assumed": p.assumed, "notes": p.notes, "passthrough": list(args.extra), "command": p.command,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ running


def stream(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd``, echo its output as it comes, return (exit status, the output)."""
    lines = []
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return proc.returncode, "".join(lines)


def summarize(output: str) -> dict:
    """Facts from fairseq-train's log (simple or json format): parameters, updates, last validation loss."""
    params = re.findall(r"num\. (?:shared )?model params: ([\d,]+)", output)
    updates = re.findall(r"num_updates\"?:? \"?(\d+)", output)
    valid = re.findall(r"valid on 'valid' subset \| loss ([\d.]+)|\"valid_loss\": \"([\d.]+)\"", output)
    valid = ["".join(v) for v in valid]
    return {
        "parameters": int(params[-1].replace(",", "")) if params else None,
        "num_updates": int(updates[-1]) if updates else None,
        "valid_loss": float(valid[-1]) if valid else None,
    }


def average_last(save_dir: Path, n: int) -> str | None:
    """Average the last ``n`` update checkpoints into checkpoint_avgN.pt (scripts/training/average_checkpoints.py)."""
    found = sorted(save_dir.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    if len(found) < n:
        log(TAG, f"only {len(found)} update checkpoints, fewer than {n}: no average")
        return None
    output = save_dir / f"checkpoint_avg{n}.pt"
    cmd = [sys.executable, str(Path(__file__).with_name("average_checkpoints.py")), "--inputs", str(save_dir),
           "--num-update-checkpoints", str(n), "--output", str(output)]  # fmt: skip
    if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
        raise RecipeError("checkpoint averaging failed (output above)")
    return str(output)


def train(p: Plan, args) -> None:
    p.save_dir.mkdir(parents=True, exist_ok=True)
    write_json(p.save_dir / "train_setup.json", manifest_of(p, args))
    start = time.monotonic()
    status, output = stream(p.command)
    seconds = time.monotonic() - start
    if status != 0:
        raise RecipeError(f"fairseq-train failed (exit {status}); its output is above")
    summary = {"arch": p.arch, "dataset": p.dataset, "data": str(p.data), "command": p.command, "setup": p.setup,
               "hparams": {k: r.value for k, r in p.rows.items()}, "gpus": p.gpus, "nodes": p.nodes,
               "fp16": p.precision != "fp32", "precision": p.precision, "update_freq": p.update_freq,
               "tokens_per_update": p.tokens_per_update, "train_seconds": round(seconds, 1), **summarize(output)}  # fmt: skip
    kind = p.rows["checkpoint"].value
    if kind.startswith("average-"):
        summary["averaged"] = average_last(p.save_dir, int(kind.removeprefix("average-")))
    write_json(p.save_dir / "train_summary.json", summary)
    log(TAG, f"done in {seconds / 60:.1f} min: {p.save_dir}")


def attach_save_dirs(args) -> None:
    """``args.save_dir_for(arch, data name)``: SAVE_DIR (one arch), SAVE_DIR/ARCH (several) or the default."""

    def save_dir_for(arch: str, name: str) -> Path:
        if args.save_dir is None:
            return REPO / "checkpoints" / name / arch
        return args.save_dir if len(args.archs) == 1 else args.save_dir / arch

    args.save_dir_for = save_dir_for


def main(argv=None, env=None):
    args = parse_args(argv)
    attach_save_dirs(args)
    if args.write_golden:
        write_golden(args.write_golden)
        return
    resolve_data(args)  # the cheap checks first: the architectures import fairseq
    setup, why = choose_setup(args.hparams, args.archs[0])
    plans = [plan(args, arch, setup, why, env) for arch in args.archs]  # every command is checked before any runs
    for p in plans:
        for line in describe(p):
            log(TAG, line)
        where = "per-node command" if p.launcher == "torchrun" and p.nodes > 1 else "command"
        print(f"# {p.arch}: {where}; {p.tokens_per_update} tokens per update "
              f"({p.world} x {p.max_tokens} x {p.update_freq})\n{render(p.command)}", flush=True)  # fmt: skip
    if args.dry_run:
        return
    for p in plans:
        train(p, args)


# ------------------------------------------------------------------------------------------- golden


def family_representatives(width: str) -> dict[str, str]:
    """{family: one arch} from the preset table: depth E6D6 at the set-up's width where the family has it."""
    from fairseq_plugins.models.presets import PRESETS

    families: dict[str, list[str]] = {}
    for arch, preset in PRESETS.items():
        families.setdefault(preset.family, []).append(arch)

    def rank(arch):
        preset = PRESETS[arch]
        w = f"{preset.width.embed_dim}/{preset.width.ffn_dim}/{preset.width.heads}"
        return (w != width, (preset.encoder_layers, preset.decoder_layers) != (6, 6), arch)

    return {family: min(archs, key=rank) for family, archs in sorted(families.items())}


def golden_name(setup: str, dataset: str) -> str:
    """The data-bin name of the set-up's direction (what prepare_*.sh writes for it)."""
    want = SETUPS[setup][dataset]["direction"].value
    if isinstance(want, tuple):
        return f"{dataset.split('_')[0]}_{want[0]}_{want[1]}"
    return dataset if dataset == "opus100" else f"{dataset.split('_')[0]}_{'_'.join(DEFAULT_DIRECTION[dataset])}"


def golden_lines() -> list[str]:
    """Every (set-up, dataset, family, GPU count) command with repository-relative paths, as two kinds of line:

        SETUP DATASET gpus=N: the command up to the architecture's own options, with {arch} for the name
        SETUP DATASET gpus=N FAMILY: the family's arch, then its own options (the command's tail)

    so a command is its template with ``{arch}`` replaced plus its tail, and a set-up's fairness (one command
    for every family up to the architecture) is the file's shape: a family whose template differs stops here.
    """
    lines = []
    for setup in SETUPS_ORDER:
        for dataset in DATASETS:
            if dataset not in SETUPS[setup]:
                continue
            name = golden_name(setup, dataset)
            families = family_representatives(SETUPS[setup][dataset]["width"].value)
            for gpus in (0, 1, 8):
                key = f"{setup} {dataset} gpus={gpus}"
                template, tails = None, []
                for family, arch in families.items():
                    args = parse_args([arch, name, "--hparams", setup, "--gpus", str(gpus), "--dry-run"])
                    attach_save_dirs(args)
                    cmd = plan(args, arch, setup, f"HPARAMS={setup}", env={}, visible=0, read_data=False).command
                    cut = len(cmd) - 1 - cmd[::-1].index("--criterion")  # arch_options come last
                    text = golden_text(cmd[:cut]).replace(arch, "{arch}")
                    if template not in (None, text):
                        raise RecipeError(f"{key}: {arch}'s command differs from the other families' beyond the "
                                          f"architecture's own options:\n{template}\n{text}")  # fmt: skip
                    template = text
                    tails.append(f"{key} {family}: {arch} {golden_text(cmd[cut:])}")
                lines += [f"{key}: {template}", *tails]
    return lines


def golden_text(cmd: list[str]) -> str:
    return render(cmd).replace(shlex.quote(sys.executable), "python").replace(f"{REPO}/", "")


def golden_command(lines: list[str], setup: str, dataset: str, gpus: int, family: str) -> str:
    """The full command of one combination, read back from golden lines."""
    key = f"{setup} {dataset} gpus={gpus}"
    template = next(line.split(": ", 1)[1] for line in lines if line.startswith(key + ": "))
    arch, tail = next(line.split(": ", 1)[1] for line in lines if line.startswith(f"{key} {family}: ")).split(" ", 1)
    return template.replace("{arch}", arch) + " " + tail


GOLDEN_HEADER = [
    "# fairseq-train commands of every (set-up, dataset, family, GPU count): tests/test_golden_commands.py",
    "# a command = its 'SETUP DATASET gpus=N:' line with {arch} replaced + the tail of its family's line",
    "# regenerate: python scripts/training/train_recipe.py --write-golden tests/golden/train_commands.txt",
]


def write_golden(path: Path) -> None:
    lines = golden_lines()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, GOLDEN_HEADER + lines)
    commands = sum(1 for line in lines if "{arch}" not in line)
    log(TAG, f"{commands} commands ({len(lines)} lines) written to {path}")


if __name__ == "__main__":
    run_main(TAG, main)
