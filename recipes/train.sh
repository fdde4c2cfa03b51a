#!/usr/bin/env bash
# Train an architecture on a prepared dataset with the papers' hyper-parameters (scripts/training/train_recipe.py
# says which table each number comes from), on every visible GPU in fp16, or on the CPU.
# Usage: bash recipes/train.sh ARCH DATASET [-- more fairseq-train options]
#   e.g. bash recipes/train.sh residual_iwslt_e12d12 iwslt14_en_de
#        NUM_GPUS=8 bash recipes/train.sh crossformer_sg_e6d6 wmt14_en_de -- --keep-last-epochs 2
# Environment (defaults in brackets):
#   DATA_BIN [data-bin/DATASET]   SAVE_DIR [checkpoints/DATASET/ARCH]
#   HPARAMS [auto]   residual | crossformer | dca (auto: by the architecture's family)
#   FP16 [auto]      auto (on with GPUs) | 1 | 0;  ResiDual models in fp16 get --dual-residual-scale 0.05
#   NUM_GPUS [all visible]   MAX_UPDATE [the paper's]   MAX_TOKENS [4096]   AVERAGE_LAST [the paper's]
#   SEED [1]   DRY_RUN [0]   1: print the fairseq-train command only
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash recipes/train.sh ARCH DATASET [-- fairseq-train options]" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
args=(--hparams "${HPARAMS:-auto}" --fp16 "${FP16:-auto}" --max-tokens "${MAX_TOKENS:-4096}" --seed "${SEED:-1}")
if [ -n "${DATA_BIN:-}" ]; then args+=(--data-bin "$DATA_BIN"); fi
if [ -n "${SAVE_DIR:-}" ]; then args+=(--save-dir "$SAVE_DIR"); fi
if [ -n "${NUM_GPUS:-}" ]; then args+=(--gpus "$NUM_GPUS"); fi
if [ -n "${MAX_UPDATE:-}" ]; then args+=(--max-update "$MAX_UPDATE"); fi
if [ -n "${AVERAGE_LAST:-}" ]; then args+=(--average-last "$AVERAGE_LAST"); fi
dry="$(bool_var DRY_RUN 0)"
if [ "$dry" = 1 ]; then args+=(--dry-run); fi
exec "$py" "$root/scripts/training/train_recipe.py" "${args[@]}" "$@"
