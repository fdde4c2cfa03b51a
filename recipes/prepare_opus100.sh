#!/usr/bin/env bash
# OPUS-100 (English-centric, both directions in one model) as the ResiDual authors train it: joint SentencePiece
# (64k), one shared dictionary, binarized per pair for fairseq's translation_multi_simple_epoch task (which adds
# the target-language token and samples directions with temperature 5). Downloads about 2.5 GB.
# Usage: bash recipes/prepare_opus100.sh [more options of python -m scripts.data.prepare_opus100]
# Environment (defaults in brackets):
#   RAW_DIR              a local directory holding opus-100-corpus/: no download
#   LANGS [all]          comma-separated non-English languages, e.g. de,fr,zh; all: the 94 pairs with dev and
#                        test sets, 188 directions
#   VOCAB_SIZE [64000]   VALID_LINES [200]  dev pairs per pair   WORKERS [8]   VERIFY_COUNTS [1]
#   WORK_DIR [work_dirs/data/opus100]   DEST_DIR [data-bin/opus100]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
args=(--langs "${LANGS:-all}" --vocab-size "${VOCAB_SIZE:-64000}" --valid-lines "${VALID_LINES:-200}"
      --workers "${WORKERS:-8}")
if [ -n "${RAW_DIR:-}" ]; then args+=(--raw-dir "$RAW_DIR"); fi
if [ -n "${WORK_DIR:-}" ]; then args+=(--work-dir "$WORK_DIR"); fi
if [ -n "${DEST_DIR:-}" ]; then args+=(--dest-dir "$DEST_DIR"); fi
verify="$(bool_var VERIFY_COUNTS 1)"
if [ "$verify" = 0 ]; then args+=(--no-verify-counts); fi
exec "$py" -m scripts.data.prepare_opus100 "${args[@]}" "$@"
