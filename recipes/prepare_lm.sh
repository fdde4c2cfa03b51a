#!/usr/bin/env bash
# A language-modeling corpus for fairseq's language_modeling task: SentencePiece (or the corpus's own tokens),
# binarized with fairseq-preprocess --only-source. See scripts/lm/prepare_lm.py and docs/language_models.md.
# Usage: bash recipes/prepare_lm.sh [more options of scripts/lm/prepare_lm.py]
#   e.g. MULTI30K_DIR=path/to/multi30k bash recipes/prepare_lm.sh          (offline, CPU scale: Multi30k English)
#        CORPUS=file TEXT_FILE=my_text.txt bash recipes/prepare_lm.sh       (any local text file)
#        CORPUS=lm1b bash recipes/prepare_lm.sh                             (the DCA paper's LM1B; downloads 1.7 GB)
# Environment (defaults in brackets):
#   CORPUS [multi30k]       multi30k | file | lm1b | wikitext103
#   LANG_SIDE [en]          multi30k: the side (de, en or fr)
#   MULTI30K_DIR            multi30k: local directory with train/val/test_2016_flickr.LANG.gz: no download
#   VERIFY_COUNTS [1]       multi30k: require the published line counts 29000/1014/1000
#   RAW_DIR                 lm1b, wikitext103: the extracted download: no download
#   TEXT_FILE, VALID_FILE, TEST_FILE   file: the texts; without VALID_FILE/TEST_FILE the last HOLDOUT lines
#   HOLDOUT [5%, at most 1000]         of TEXT_FILE are held out for each
#   SEGMENTATION [sentencepiece; wikitext103: none]
#   VOCAB_SIZE [multi30k 4000 (its English side allows at most 7928); file 8000; lm1b and wikitext103 32000]
#   WORK_DIR, DEST_DIR      [work_dirs/data/NAME], [data-bin/NAME]: NAME lm_multi30k_LANG, lm1b, wikitext103, lm_STEM
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
corpus="${CORPUS:-multi30k}"
args=(--corpus "$corpus" --lang "${LANG_SIDE:-en}")
if [ "$corpus" = multi30k ] && [ -n "${MULTI30K_DIR:-}" ]; then args+=(--raw-dir "$MULTI30K_DIR"); fi
if [ "$corpus" != multi30k ] && [ -n "${RAW_DIR:-}" ]; then args+=(--raw-dir "$RAW_DIR"); fi
if [ "$(bool_var VERIFY_COUNTS 1)" = 0 ]; then args+=(--no-verify-counts); fi
if [ -n "${TEXT_FILE:-}" ]; then args+=(--train "$TEXT_FILE"); fi
if [ -n "${VALID_FILE:-}" ]; then args+=(--valid "$VALID_FILE"); fi
if [ -n "${TEST_FILE:-}" ]; then args+=(--test "$TEST_FILE"); fi
if [ -n "${HOLDOUT:-}" ]; then args+=(--holdout "$HOLDOUT"); fi
if [ -n "${SEGMENTATION:-}" ]; then args+=(--segmentation "$SEGMENTATION"); fi
if [ -n "${VOCAB_SIZE:-}" ]; then args+=(--vocab-size "$VOCAB_SIZE"); fi
if [ -n "${WORK_DIR:-}" ]; then args+=(--work-dir "$WORK_DIR"); fi
if [ -n "${DEST_DIR:-}" ]; then args+=(--dest-dir "$DEST_DIR"); fi
exec "$py" -m scripts.lm.prepare_lm "${args[@]}" "$@"
