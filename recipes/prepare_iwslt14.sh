#!/usr/bin/env bash
# IWSLT-14 De<->En as fairseq's prepare-iwslt14.sh (Moses tokenisation with sacremoses, clean-corpus, lowercase,
# joint BPE 10k), binarized in one direction. ResiDual trains EN->DE, Crossformer DE->EN.
# Usage: bash recipes/prepare_iwslt14.sh [more options of python -m scripts.data.prepare_iwslt14]
# Environment (defaults in brackets):
#   SRC [de], TGT [en]   de-en or en-de (both directions share the tokenised and BPE files)
#   RAW_DIR              a local directory with the contents of de-en.tgz: no download
#   BPE_MERGES [10000]   WORKERS [4]   VERIFY_COUNTS [1]  (the 6,750 test segments)
#   JOINED_DICTIONARY [1]  0: one dictionary per language (Crossformer's IWSLT set-up: separate source and
#                          target embeddings); recipe.json then records "joined_dictionary": false
#   WORK_DIR [work_dirs/data/iwslt14]   DEST_DIR [data-bin/iwslt14_SRC_TGT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
args=(--src "${SRC:-de}" --tgt "${TGT:-en}" --bpe-merges "${BPE_MERGES:-10000}" --workers "${WORKERS:-4}")
if [ -n "${RAW_DIR:-}" ]; then args+=(--raw-dir "$RAW_DIR"); fi
if [ -n "${WORK_DIR:-}" ]; then args+=(--work-dir "$WORK_DIR"); fi
if [ -n "${DEST_DIR:-}" ]; then args+=(--dest-dir "$DEST_DIR"); fi
verify="$(bool_var VERIFY_COUNTS 1)"
if [ "$verify" = 0 ]; then args+=(--no-verify-counts); fi
joined="$(bool_var JOINED_DICTIONARY 1)"
if [ "$joined" = 0 ]; then args+=(--no-joined-dictionary); fi
exec "$py" -m scripts.data.prepare_iwslt14 "${args[@]}" "$@"
