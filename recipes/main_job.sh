#!/usr/bin/env bash
# The main job: ResiDual against its Pre-LN baseline on Multi30k De->En at CPU scale, end to end: set up
# .venv, download and prepare Multi30k, train both models, evaluate them with sacrebleu and write a comparison
# table (OUT_DIR/results.md and results.json). About 25 minutes on 2 CPU cores with the defaults.
# Usage: bash recipes/main_job.sh [more options of scripts/training/main_job.py]
# Environment (defaults in brackets):
#   MULTI30K_DIR       a local Multi30k copy (train/val/test_2016_flickr.LANG.gz): no download
#   ARCHS              [residual_iwslt_e6d6 transformer_preln_iwslt_e6d6]
#   MODEL_ARGS         [width 128: --encoder-embed-dim 128 ... ]; '' keeps the presets' width (256)
#   TRAIN_MINUTES [22] training time per model     MAX_UPDATE [0]  also stop after N updates (0: time only)
#   MAX_TOKENS [2048]  tokens per batch             SRC [de], TGT [en]
#   PARALLEL [auto]    train the models at the same time (auto: with 2 or more cores)
#   THREADS [0]        threads per model (0: cores / models trained at once)
#   TRAIN_LINES [0]    only the first N training pairs (quick checks)   VERIFY_COUNTS [1]
#   VOCAB_SIZE [8000]  joint SentencePiece pieces
#   OUT_DIR            [work_dirs/main_job]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
args=(--train-minutes "${TRAIN_MINUTES:-22}" --max-update "${MAX_UPDATE:-0}" --max-tokens "${MAX_TOKENS:-2048}"
      --src "${SRC:-de}" --tgt "${TGT:-en}" --parallel "${PARALLEL:-auto}" --threads "${THREADS:-0}"
      --train-lines "${TRAIN_LINES:-0}" --vocab-size "${VOCAB_SIZE:-8000}")
if [ -n "${ARCHS:-}" ]; then args+=(--archs "$ARCHS"); fi
# MODEL_ARGS may be set to '' on purpose (preset width), so only an unset variable means the default
if [ -n "${MODEL_ARGS+set}" ]; then args+=(--model-args "$MODEL_ARGS"); fi
if [ -n "${MULTI30K_DIR:-}" ]; then args+=(--raw-dir "$MULTI30K_DIR"); fi
if [ -n "${OUT_DIR:-}" ]; then args+=(--out-dir "$OUT_DIR"); fi
verify="$(bool_var VERIFY_COUNTS 1)"
if [ "$verify" = 0 ]; then args+=(--no-verify-counts); fi
exec "$py" "$root/scripts/training/main_job.py" "${args[@]}" "$@"
