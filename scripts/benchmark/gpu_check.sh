#!/usr/bin/env bash
# One command for a GPU machine: every family trains N updates in fp16 and bf16 on CUDA, eager and with its idea
# modules compiled (torch.compile, inductor: Triton kernels), with finite loss, decodes incrementally as in one pass, and reports its GRN code path, time ratio to Pre-LN and peak memory, in
# gpu_check/gpu_check.md and .json. Exit 1 on any failure; without CUDA it says so and exits 0.
#   bash scripts/benchmark/gpu_check.sh [--updates N] [--family NAME ...] [--out DIR]   (see python -m scripts.benchmark.gpu_check --help)
# PYTHON selects the interpreter (default: python on PATH, the environment fairseq is installed in).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$here/../..${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m scripts.benchmark.gpu_check "$@"
