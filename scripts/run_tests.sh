#!/usr/bin/env bash
# The project's test command (README, and .ci/run calls exactly this): set up .venv if needed, then
# lint and run the whole test suite offline. Extra arguments go to pytest (e.g. -k residual).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup_env.sh
venv="${VENV_DIR:-$root/.venv}"
echo "[test] ruff check"
"$venv/bin/ruff" check .
echo "[test] pytest"
# tiny models run faster on one thread per process; the tests start their own subprocesses
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# the suite starts hundreds of processes that import the plugin and the scripts: each compiles them again unless
# their bytecode is cached (__pycache__, ignored by git), ~0.2 CPU-s a process, and pytest rewrites every test
# file's asserts again in each worker
unset PYTHONDONTWRITEBYTECODE
# two workers, one test file each at a time (module fixtures train models once per file), the slowest files first
# (tests/conftest.py SLOWEST_FIRST; --no-loadscope-reorder keeps that order); a test that runs past
# TEST_TIME_LIMIT seconds (default 1200, tests/conftest.py) fails with every thread's stack instead of hanging CI
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder tests "$@"
