#!/usr/bin/env bash
# Train language models of the plugin ({family}_lm_*) on a prepared LM corpus with a named set-up; every value
# and its source is printed and stored in SAVE_DIR/train_setup.json (scripts/lm/lm_setups.py holds the table).
# Usage: bash recipes/train_lm.sh ARCH[,ARCH...] DATASET [-- more fairseq-train options]
#   e.g. bash recipes/train_lm.sh dca_lm_d6,transformer_preln_lm_d6 lm1b
#        HPARAMS=dca-cpu bash recipes/train_lm.sh dca_lm_d6 lm_multi30k_en
#        DRY_RUN=1 NUM_GPUS=8 NUM_NODES=4 bash recipes/train_lm.sh dca_k2_lm_d12 lm1b
# Environment (defaults in brackets):
#   HPARAMS [dca-paper]   dca-paper (DCA sec. 5: length 128, 2048 sequences, AdamW 0.9/0.98, wd 0.1, lr 1.6e-3,
#                         1000 warm-up updates, inverse sqrt) | dca-cpu (the same optimizer at CPU scale)
#   NUM_GPUS [all visible]  GPUs per node; 0 = CPU     NUM_NODES [1]   CPU_PROCS [1] processes with NUM_GPUS=0
#   LAUNCHER [auto]  more than one process: slurm inside a SLURM allocation, else torchrun (NODE_RANK, MASTER_ADDR,
#                    MASTER_PORT [29500] on several nodes)
#   MAX_TOKENS [the set-up's]  largest batch per GPU in tokens, lowered so that nodes x GPUs x sequences x length
#                    x update-freq is exactly the set-up's tokens per update (TOKENS_PER_UPDATE overrides it)
#   FP16 [auto]      auto (the set-up's precision on GPUs, fp32 on CPU) | 1 | 0
#   DATA_BIN [data-bin/DATASET]   SAVE_DIR [checkpoints/DATASET/ARCH; SAVE_DIR/ARCH with several]
#   MAX_UPDATE, SEED [the set-up's]
#   DRY_RUN [0]      1: print the set-up and the command(s), with no GPUs and no data needed
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash recipes/train_lm.sh ARCH DATASET [-- fairseq-train options]  (ARCH: one, or several comma-separated)" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
warn_misspelt train_lm HPARAMS NUM_GPUS NUM_NODES CPU_PROCS LAUNCHER NODE_RANK MASTER_ADDR MASTER_PORT MAX_TOKENS TOKENS_PER_UPDATE FP16 DATA_BIN SAVE_DIR MAX_UPDATE SEED DRY_RUN
args=(--hparams "${HPARAMS:-dca-paper}" --fp16 "${FP16:-auto}" --nodes "${NUM_NODES:-1}" --cpu-procs "${CPU_PROCS:-1}"
      --launcher "${LAUNCHER:-auto}")
if [ -n "${DATA_BIN:-}" ]; then args+=(--data-bin "$DATA_BIN"); fi
if [ -n "${SAVE_DIR:-}" ]; then args+=(--save-dir "$SAVE_DIR"); fi
if [ -n "${NUM_GPUS:-}" ]; then args+=(--gpus "$NUM_GPUS"); fi
if [ -n "${MAX_TOKENS:-}" ]; then args+=(--max-tokens "$MAX_TOKENS"); fi
if [ -n "${TOKENS_PER_UPDATE:-}" ]; then args+=(--tokens-per-update "$TOKENS_PER_UPDATE"); fi
if [ -n "${MAX_UPDATE:-}" ]; then args+=(--max-update "$MAX_UPDATE"); fi
if [ -n "${SEED:-}" ]; then args+=(--seed "$SEED"); fi
dry="$(bool_var DRY_RUN 0)"
if [ "$dry" = 1 ]; then args+=(--dry-run); fi
exec "$py" -m scripts.lm.train_lm "${args[@]}" "$@"
