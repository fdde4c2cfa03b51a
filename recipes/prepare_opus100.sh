#!/usr/bin/env bash
# OPUS-100 (English-centric, both directions in one model) as in the ResiDual paper: joint SentencePiece
# (64k), a <2xx> target-language token before each source sentence. Downloads about 2.5 GB.
# Usage: bash recipes/prepare_opus100.sh [more options of scripts/data/prepare_opus100.py]
# Environment (defaults in brackets):
#   RAW_DIR              a local directory holding opus-100-corpus/: no download
#   LANGS [all]          comma-separated non-English languages, e.g. de,fr,zh
#   VOCAB_SIZE [64000]   VALID_LINES [200]  per pair and direction   WORKERS [8]   VERIFY_COUNTS [1]
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
exec "$py" "$root/scripts/data/prepare_opus100.py" "${args[@]}" "$@"
