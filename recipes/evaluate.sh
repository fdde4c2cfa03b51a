#!/usr/bin/env bash
# Translate a prepared dataset's test sets with a checkpoint and score them with sacrebleu (sacreBLEU and chrF
# with signatures, tokenised BLEU as the papers report it, the WMT multi-year and OPUS-100 averages).
# Usage: bash recipes/evaluate.sh DATASET CHECKPOINT [-- more fairseq-generate options]
#   DATASET: data-bin/NAME or a directory; CHECKPOINT: a .pt file or a save directory (averaged > best > last)
#   e.g. bash recipes/evaluate.sh wmt14_en_de checkpoints/wmt14_en_de/residual_e18d18
# Environment (defaults in brackets):
#   BEAM, LENPEN [the dataset's: 4 / 0.6 for WMT and OPUS-100, 5 / 1.0 for IWSLT-14 and Multi30k]
#   SETS [all]   comma-separated test set names, e.g. newstest2014
#   MAX_TOKENS [8000]   GPU [auto]   OUTPUT_DIR [CHECKPOINT_DIR/eval_STEM_DATASET]
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash recipes/evaluate.sh DATASET CHECKPOINT [-- fairseq-generate options]" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
warn_misspelt evaluate BEAM LENPEN SETS MAX_TOKENS GPU OUTPUT_DIR
args=(--max-tokens "${MAX_TOKENS:-8000}" --gpu "${GPU:-auto}")
if [ -n "${BEAM:-}" ]; then args+=(--beam "$BEAM"); fi
if [ -n "${LENPEN:-}" ]; then args+=(--lenpen "$LENPEN"); fi
if [ -n "${SETS:-}" ]; then args+=(--sets "$SETS"); fi
if [ -n "${OUTPUT_DIR:-}" ]; then args+=(--output-dir "$OUTPUT_DIR"); fi
exec "$py" -m scripts.training.evaluate_recipe "${args[@]}" "$@"
