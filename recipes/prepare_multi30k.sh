#!/usr/bin/env bash
# Multi30k task 1 (de/en/fr, 29k training pairs): joint SentencePiece, binarized for fairseq.
# Usage: bash recipes/prepare_multi30k.sh [more options of python -m scripts.data.prepare_multi30k]
# Environment (defaults in brackets):
#   SRC [de], TGT [en]       direction, any two of de en fr
#   MULTI30K_DIR             local directory with train/val/test_2016_flickr.LANG.gz: no download
#   VOCAB_SIZE [8000]        joint SentencePiece pieces
#   TRAIN_LINES [0]          use only the first N training pairs (0 = all)
#   VERIFY_COUNTS [1]        require the published line counts 29000/1014/1000
#   WORK_DIR, DEST_DIR       [work_dirs/data/multi30k_L1_L2], [data-bin/multi30k_SRC_TGT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
args=(--src "${SRC:-de}" --tgt "${TGT:-en}" --vocab-size "${VOCAB_SIZE:-8000}" --train-lines "${TRAIN_LINES:-0}")
if [ -n "${MULTI30K_DIR:-}" ]; then args+=(--raw-dir "$MULTI30K_DIR"); fi
if [ -n "${WORK_DIR:-}" ]; then args+=(--work-dir "$WORK_DIR"); fi
if [ -n "${DEST_DIR:-}" ]; then args+=(--dest-dir "$DEST_DIR"); fi
verify="$(bool_var VERIFY_COUNTS 1)"
if [ "$verify" = 0 ]; then args+=(--no-verify-counts); fi
exec "$py" -m scripts.data.prepare_multi30k "${args[@]}" "$@"
