"""The pieces of one fairseq-train command of the training recipe (scripts/training/train_recipe.py): the
architecture and its data, the direction and embeddings the set-up wants, precision, checkpoints, the
options only one model has, and how the processes are launched. train_plan.plan puts them together.
"""

import re
import sys
from pathlib import Path

from scripts.training.setups import DATASETS
from scripts.training.training_common import (
    REPO,
    RecipeError,
    fairseq_module,
    read_manifest,
)

TAG = "train"
GUIDANCE_CRITERION = "label_smoothed_cross_entropy_with_guidance"
RANK_MODULE = "scripts.training.fairseq_rank"  # torchrun -m: one rank of fairseq-train
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
    """The model name of ``arch``; an unknown name stops with the plugin's families listed, a language model's
    (``{family}_lm_*``, fairseq's ``transformer_lm*``) with where language models are trained."""
    if re.search(r"(^|_)lm(_|$)", arch):
        raise RecipeError(
            f"{arch!r} (ARCH) is a decoder-only language model, not a translation architecture: train it on a "
            f"language-modeling corpus (recipes/prepare_lm.sh) with recipes/train_lm.sh {arch} DATASET, or compare "
            "language models "
            "with LM=1 bash recipes/study.sh (docs/language_models.md)"
        )
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


# -------------------------------------------------------------------------------------- command pieces


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


def optimizer_options(v: dict) -> list[str]:
    """The optimizer, schedule and dropout of a set-up's values ``v`` (translation and language models alike)."""
    return ["--optimizer", v["optimizer"], "--adam-betas", v["adam_betas"], "--lr", repr(v["lr"]),
            "--lr-scheduler", v["lr_scheduler"], "--warmup-updates", str(v["warmup_updates"]),
            "--warmup-init-lr", repr(v["warmup_init_lr"]), "--weight-decay", repr(v["weight_decay"]),
            "--clip-norm", repr(v["clip_norm"]), "--dropout", repr(v["dropout"]),
            "--attention-dropout", repr(v["attention_dropout"])]  # fmt: skip


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


def placement_options(gpus: int, world: int, launcher: str, env) -> list[str]:
    """CPU or GPUs, and the distributed options of ``world`` processes."""
    options = [] if gpus else ["--cpu"]
    if world > 1:
        options += ["--distributed-world-size", str(world)]
        if not gpus:  # NCCL needs GPUs; fairseq's c10d DDP wrapper does not run on CPU tensors here
            options += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
        if launcher == "slurm":
            options += ["--distributed-port", env.get("MASTER_PORT") or DEFAULT_PORT]
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
        return [*run, "--standalone", "-m", RANK_MODULE]
    for var in ("NODE_RANK", "MASTER_ADDR"):
        if not env.get(var) and not args.dry_run:
            raise RecipeError(f"NUM_NODES={args.nodes} with torchrun: set {var} on every node "
                                  "(NODE_RANK 0..NUM_NODES-1, MASTER_ADDR the address of node 0; MASTER_PORT "
                                  f"default {DEFAULT_PORT})")  # fmt: skip
    notes.append(f"run the per-node command on each of the {args.nodes} nodes with NODE_RANK=0..{args.nodes - 1}, "
                 f"MASTER_ADDR=<node 0's address> and MASTER_PORT (default {DEFAULT_PORT})")  # fmt: skip
    return [*run, "--nnodes", str(args.nodes), "--node-rank", env.get("NODE_RANK") or "${NODE_RANK}",
            "--master-addr", env.get("MASTER_ADDR") or "${MASTER_ADDR}",
            "--master-port", env.get("MASTER_PORT") or f"${{MASTER_PORT:-{DEFAULT_PORT}}}", "-m", RANK_MODULE]  # fmt: skip


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
    from scripts.training.multilingual import (
        train_args,  # only here: the multilingual data's own helper
    )

    return list(train_args(manifest))
