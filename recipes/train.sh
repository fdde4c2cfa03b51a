#!/usr/bin/env bash
# Train architectures on a prepared dataset with one paper's set-up; every value and its source is printed
# and stored in SAVE_DIR/train_setup.json (scripts/training/setups.py holds the table).
# Usage: bash recipes/train.sh ARCH[,ARCH...] DATASET [-- more fairseq-train options]
#   e.g. bash recipes/train.sh residual_iwslt_e12d12 iwslt14_en_de
#        HPARAMS=dca bash recipes/train.sh dca_e6d6,transformer_preln_e6d6 wmt14_de_en
#        DRY_RUN=1 NUM_GPUS=8 NUM_NODES=4 bash recipes/train.sh crossformer_sg_e6d6 wmt14_en_de
# Environment (defaults in brackets):
#   HPARAMS [auto]   auto (the first architecture's family default) | paper | authors | residual-paper |
#                    residual-authors | crossformer-paper | dca; one set-up for every ARCH of the run
#   NUM_GPUS [all visible]  GPUs per node; 0 = CPU     NUM_NODES [1]   CPU_PROCS [1] processes with NUM_GPUS=0
#   LAUNCHER [auto]  more than one process: slurm inside a SLURM allocation (SLURM_JOB_ID), else torchrun;
#                    several torchrun nodes read NODE_RANK, MASTER_ADDR, MASTER_PORT [29500]
#   MAX_TOKENS [the set-up's, 4096]  largest batch per GPU, lowered so that nodes x GPUs x MAX_TOKENS x
#                    update-freq is exactly the set-up's tokens per update (TOKENS_PER_UPDATE overrides it)
#   FP16 [auto]      auto (the set-up's precision on GPUs, fp32 on CPU) | 1 | 0
#   DIRECTION [setup]  setup: data in another direction is an error | data: train it, recorded as a deviation
#   DATA_BIN [data-bin/DATASET]   SAVE_DIR [checkpoints/DATASET/ARCH; SAVE_DIR/ARCH with several]
#   MAX_UPDATE, AVERAGE_LAST, SEED [the set-up's]
#   DRY_RUN [0]      1: print the set-up and the command(s), with no GPUs and no data needed
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash recipes/train.sh ARCH DATASET [-- fairseq-train options]  (ARCH: one, or several comma-separated)" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
warn_misspelt train HPARAMS NUM_GPUS NUM_NODES CPU_PROCS LAUNCHER NODE_RANK MASTER_ADDR MASTER_PORT MAX_TOKENS TOKENS_PER_UPDATE FP16 DATA_BIN SAVE_DIR MAX_UPDATE SEED DRY_RUN DIRECTION AVERAGE_LAST
args=(--hparams "${HPARAMS:-auto}" --fp16 "${FP16:-auto}" --nodes "${NUM_NODES:-1}" --cpu-procs "${CPU_PROCS:-1}"
      --launcher "${LAUNCHER:-auto}" --direction "${DIRECTION:-setup}")
if [ -n "${DATA_BIN:-}" ]; then args+=(--data-bin "$DATA_BIN"); fi
if [ -n "${SAVE_DIR:-}" ]; then args+=(--save-dir "$SAVE_DIR"); fi
if [ -n "${NUM_GPUS:-}" ]; then args+=(--gpus "$NUM_GPUS"); fi
if [ -n "${MAX_TOKENS:-}" ]; then args+=(--max-tokens "$MAX_TOKENS"); fi
if [ -n "${TOKENS_PER_UPDATE:-}" ]; then args+=(--tokens-per-update "$TOKENS_PER_UPDATE"); fi
if [ -n "${MAX_UPDATE:-}" ]; then args+=(--max-update "$MAX_UPDATE"); fi
if [ -n "${AVERAGE_LAST:-}" ]; then args+=(--average-last "$AVERAGE_LAST"); fi
if [ -n "${SEED:-}" ]; then args+=(--seed "$SEED"); fi
dry="$(bool_var DRY_RUN 0)"
if [ "$dry" = 1 ]; then args+=(--dry-run); fi
exec "$py" -m scripts.training.train_recipe "${args[@]}" "$@"
