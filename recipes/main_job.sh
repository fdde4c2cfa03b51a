#!/usr/bin/env bash
# The main job: ResiDual's depth claim on Multi30k De->En at CPU scale, end to end: set up .venv, download and
# prepare Multi30k, train Pre-LN and ResiDual at E12D12 (width 64) side by side for 800 updates, each at the peak
# lr its own grid chose (docs/study/lr_e12d12), translate and score them, and print the table, the plot's path
# and a reading. About 25 minutes on 2 idle CPU cores with the defaults. See scripts/training/main_job.py.
# Usage: bash recipes/main_job.sh [more options] [-- fairseq-train options for every run]
# Environment: those of recipes/study.sh, with the main job's defaults:
#   ARCHS [transformer_preln_iwslt_e12d12 residual_iwslt_e12d12]
#   ARCH_LRS [transformer_preln_iwslt_e12d12=8e-3 residual_iwslt_e12d12=4e-3]   SEEDS [1]   MAX_UPDATE [800]
#   MODEL_ARGS [width 64]   JOBS [every run at once]   OUT_DIR [work_dirs/main_job]
#   MULTI30K_DIR  a local Multi30k copy (no download)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export STUDY_MODULE=scripts.training.main_job
export STUDY_COMMAND="${STUDY_COMMAND:-bash recipes/main_job.sh${*:+ $*}}"
exec bash "$here/study.sh" "$@"
