#!/usr/bin/env bash
# WMT14 En-De (4.5M pairs, joint BPE 32k) or En-Fr (36M pairs, joint BPE 40k) as fairseq's prepare scripts do:
# Moses normalisation/tokenisation (sacremoses), clean-corpus, valid newstest2013, test newstest2014 and, for
# En-De, newstest2010-2016 (ResiDual tables 6-7). Downloads about 1.5 GB (En-De) or 4 GB (En-Fr).
# Usage: bash recipes/prepare_wmt14.sh [more options of python -m scripts.data.prepare_wmt14]
# Environment (defaults in brackets):
#   SRC [en], TGT [de]   en-de, de-en, en-fr or fr-en
#   RAW_DIR              a local directory with the unpacked corpora and SGM test files: no download
#   YEARS                newstest years to prepare as test sets [2010-2016 for En-De, 2014 for En-Fr]
#   BPE_MERGES           [32000 En-De, 40000 En-Fr]   WORKERS [8]   VERIFY_COUNTS [1]
#   DOWNLOAD_DIR [work_dirs/data/wmt14_download]   WORK_DIR [work_dirs/data/wmt14_en_XX]
#   DEST_DIR [data-bin/wmt14_SRC_TGT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
args=(--src "${SRC:-en}" --tgt "${TGT:-de}" --workers "${WORKERS:-8}")
if [ -n "${RAW_DIR:-}" ]; then args+=(--raw-dir "$RAW_DIR"); fi
if [ -n "${YEARS:-}" ]; then args+=(--years "$YEARS"); fi
if [ -n "${BPE_MERGES:-}" ]; then args+=(--bpe-merges "$BPE_MERGES"); fi
if [ -n "${DOWNLOAD_DIR:-}" ]; then args+=(--download-dir "$DOWNLOAD_DIR"); fi
if [ -n "${WORK_DIR:-}" ]; then args+=(--work-dir "$WORK_DIR"); fi
if [ -n "${DEST_DIR:-}" ]; then args+=(--dest-dir "$DEST_DIR"); fi
verify="$(bool_var VERIFY_COUNTS 1)"
if [ "$verify" = 0 ]; then args+=(--no-verify-counts); fi
exec "$py" -m scripts.data.prepare_wmt14 "${args[@]}" "$@"
