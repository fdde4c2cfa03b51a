#!/usr/bin/env bash
# A study: a grid of architectures x seeds (x set-up variants) on Multi30k (or any prepared dataset), equal
# budget, learning curves, sacrebleu BLEU/chrF with paired bootstrap against the first architecture, plots.
# Resumable: run the same command again after an interruption. See scripts/study/study.py.
# Usage: bash recipes/study.sh [more options of scripts/study/study.py] [-- fairseq-train options for every run]
# Environment (defaults in brackets; each is also an option of the script, e.g. ARCHS = --archs):
#   ARCHS         [transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12 residual_iwslt_e12d12]
#                 the first is the baseline of the comparisons
#   SEEDS [1 2]   VARIANTS [warmup] (warmup, nowarmup, warmdecay)   LRS [1e-3], WARMUPS [400]: choose per
#                 model on valid loss (every candidate with the first seed, the later seeds at the choice)
#   ARCH_LRS [none] an architecture's own lr (and warm-up) chosen before, e.g. by an LRS study, or its own
#                 grid: 'ARCH=LR ARCH=LR@WARMUP ARCH=LR,LR,LR ...'; the others still choose from LRS/WARMUPS
#   MAX_UPDATE [1000] updates per run, or TRAIN_MINUTES [0] training minutes per run (MAX_UPDATE then caps)
#   PATIENCE [0]  stop a run after this many validations without a lower valid loss (0: MAX_UPDATE only)
#   MODEL_ARGS    [width 128: --encoder-embed-dim 128 ...]; '' keeps the presets' width
#   MULTI30K_DIR  a local Multi30k copy (no download)      DATA_BIN  a prepared dataset instead
#   TRAIN_LINES [0: all]   VOCAB_SIZE [8000; 4000 with LM=1]   SRC [de], TGT [en]   VERIFY_COUNTS [1]   MAX_TOKENS [4096]
#   JOBS [cores] runs side by side   THREADS [cores / JOBS]   VALID_EVERY [MAX_UPDATE / 8]   BOOTSTRAP [1000]
#   LEVEL_MARGIN [1.0] BLEU: "level" only when every seed's 95% CI of the difference is inside +-margin
#   PAIRS [none]  more paired comparisons, SYSTEM:BASELINE pairs of ARCHS names, space-separated (e.g. a
#                 combination against each of its parts: 'tfixup_denseformer_iwslt_e12d12:tfixup_iwslt_e12d12
#                 tfixup_denseformer_iwslt_e12d12:denseformer_iwslt_e12d12'): the statistics of the comparisons
#                 against the first, in a section of their own (each run at its chosen lr; REPORT_ONLY=1 too)
#   FALLING_LAST [3], FALLING_SLOPE [0.01]: still falling = valid-loss slope over the last 3 validations
#                 below -0.01 per 100 updates
#   LM [0]        1: a language-model study (TASK=language_modeling): MULTI30K_DIR's TGT side prepared by
#                 scripts/lm/prepare_lm.py, or DATA_BIN of recipes/prepare_lm.sh (its recipe.json says so
#                 without LM); ARCHS [transformer_preln_lm_d6 dca_lm_d6], perplexity and a paired bootstrap on
#                 per-sentence log-likelihoods instead of BLEU (scripts/study/study_lm.py)
#   OUT_DIR       [work_dirs/study]
#   REPORT_ONLY [0]  1: train nothing, report the runs finished so far (the report lists the missing ones)
#   EXECUTOR [local] local: JOBS runs here; submitit-local: every run a submitit job here; slurm: the runs
#                 as SLURM job arrays through submitit, requeued at a time limit or preemption and resumed from
#                 their checkpoint (docs/study_tool.md), with PARTITION [cluster's], GPUS_PER_RUN [0: CPU],
#                 CPUS_PER_TASK [THREADS or 8], MEM [cluster's], TIME_LIMIT [240 minutes], ARRAY_PARALLELISM [all],
#                 SLURM_ARGS [none] more sbatch options 'account=abc qos=high' (GPUS_PER_RUN, TIME_LIMIT:
#                 submitit-local too)
#   DRY_RUN [0]   1: print the job scripts (slurm: the sbatch script) and the runs' commands; submit nothing
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# main_job.sh runs this file with its own entry point (the main job is a small study)
module="${STUDY_MODULE:-scripts.study.study}"
export STUDY_COMMAND="${STUDY_COMMAND:-bash recipes/study.sh${*:+ $*}}"
args=()
opt() { if [ -n "${!1+set}" ]; then args+=("$2" "${!1}"); fi; }
# MODEL_ARGS may be '' on purpose (preset width): any set variable counts; the others only when not empty
opt MODEL_ARGS --model-args
for pair in ARCHS:--archs SEEDS:--seeds VARIANTS:--variants MAX_UPDATE:--max-update TRAIN_MINUTES:--train-minutes \
            LRS:--lrs WARMUPS:--warmups MAX_TOKENS:--max-tokens VALID_EVERY:--valid-every JOBS:--jobs \
            THREADS:--threads BOOTSTRAP:--bootstrap MULTI30K_DIR:--raw-dir DATA_BIN:--data-bin \
            TRAIN_LINES:--train-lines VOCAB_SIZE:--vocab-size SRC:--src TGT:--tgt OUT_DIR:--out-dir \
            PATIENCE:--patience LEVEL_MARGIN:--level-margin FALLING_LAST:--falling-last FALLING_SLOPE:--falling-slope \
            TASK:--task PAIRS:--pairs ARCH_LRS:--arch-lrs EXECUTOR:--executor PARTITION:--partition \
            GPUS_PER_RUN:--gpus-per-run CPUS_PER_TASK:--cpus-per-task MEM:--mem TIME_LIMIT:--time-limit \
            ARRAY_PARALLELISM:--array-parallelism SLURM_ARGS:--slurm-args; do
  name="${pair%%:*}"
  if [ -n "${!name:-}" ]; then args+=("${pair#*:}" "${!name}"); fi
done
verify="$(bool_var VERIFY_COUNTS 1)"
if [ "$verify" = 0 ]; then args+=(--no-verify-counts); fi
lm="$(bool_var LM 0)"
if [ "$lm" = 1 ]; then
  if [ -n "${TASK:-}" ] && [ "$TASK" != language_modeling ]; then
    echo "[study] error: LM=1 with TASK=$TASK: LM=1 means TASK=language_modeling; set one of them" >&2; exit 1
  fi
  args+=(--task language_modeling)
fi
report_only="$(bool_var REPORT_ONLY 0)"
if [ "$report_only" = 1 ]; then args+=(--report-only); fi
dry_run="$(bool_var DRY_RUN 0)"
if [ "$dry_run" = 1 ]; then args+=(--dry-run); fi
exec "$py" -m "$module" "${args[@]}" "$@"
