"""The training recipe's command line (scripts/training/train_recipe.py, recipes/train.sh): its options, each
naming the recipe's environment variable, and where each architecture's checkpoints go."""

import argparse
from pathlib import Path

from scripts.training.setups import DATASETS, SETUPS_ORDER
from scripts.training.train_options import LAUNCHERS
from scripts.training.training_common import REPO, RecipeError, split_passthrough


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


def parse_args(argv=None, description: str | None = None):
    """The options of ``argv`` (default sys.argv); ``description`` heads ``--help`` (train_recipe.py's docstring)."""
    own, extra = split_passthrough(argv)
    p = Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
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
    check_archs_and_processes(args)
    return args


def check_archs_and_processes(args) -> None:
    """``args.archs`` from ARCH (each once), and CPU_PROCS only on CPU (the LM recipe's command line too)."""
    args.archs = [a for a in (args.arch or "").split(",") if a]
    if len(set(args.archs)) != len(args.archs):
        raise RecipeError(f"ARCH {args.arch!r} names an architecture twice")
    if args.gpus and args.cpu_procs > 1:
        raise RecipeError(f"--cpu-procs {args.cpu_procs} (CPU_PROCS) is for --gpus 0 (NUM_GPUS=0) only")


def attach_save_dirs(args) -> None:
    """``args.save_dir_for(arch, data name)``: SAVE_DIR (one arch), SAVE_DIR/ARCH (several) or the default."""

    def save_dir_for(arch: str, name: str) -> Path:
        if args.save_dir is None:
            return REPO / "checkpoints" / name / arch
        return args.save_dir if len(args.archs) == 1 else args.save_dir / arch

    args.save_dir_for = save_dir_for
