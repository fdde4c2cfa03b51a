#!/usr/bin/env python
"""Train named architectures on a prepared dataset with one paper's set-up (recipes/train.sh).

    python -m scripts.training.train_recipe residual_iwslt_e12d12 iwslt14_en_de
    python -m scripts.training.train_recipe --hparams dca dca_e6d6,transformer_preln_e6d6 wmt14_de_en
    python -m scripts.training.train_recipe --dry-run --gpus 8 --nodes 4 crossformer_sg_e6d6 wmt14_en_de

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

from scripts.training.setups import choose_setup
from scripts.training.train_arguments import attach_save_dirs
from scripts.training.train_arguments import parse_args as parse_arguments
from scripts.training.train_golden import (  # noqa: F401  (re-exported for the tests)
    GOLDEN_HEADER,
    family_representatives,
    golden_command,
    golden_lines,
    golden_name,
    golden_text,
    write_golden,
)
from scripts.training.train_options import RANK_MODULE, TAG, last_value, resolve_data  # noqa: F401  (re-exported for the tests)
from scripts.training.train_plan import Plan, plan  # noqa: F401  (re-exported for the tests)
from scripts.training.train_run import describe, manifest_of, render, train  # noqa: F401  (re-exported for the tests)
from scripts.training.training_common import log, run_main


def parse_args(argv=None):
    """The recipe's options (train_arguments.py), with this file's docstring as ``--help``."""
    return parse_arguments(argv, __doc__)


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


if __name__ == "__main__":
    run_main(TAG, main)
