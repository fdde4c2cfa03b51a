#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv with the pinned stack and the plugin installed.
# Usage: bash scripts/setup_env.sh   (then use .venv/bin/python, or source .venv/bin/activate)
# Idempotent: a venv whose stamp matches scripts/requirements.txt is reused as is.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV_DIR:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"
want="$(cat "$root/scripts/requirements.txt" "$root/setup.py" | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "[setup] reusing $venv"
else
  "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || {
    echo "[setup] error: Python 3.11 is required (found $("$python" --version 2>&1)); set PYTHON=python3.11" >&2
    exit 1
  }
  echo "[setup] creating $venv (first run: about 2 minutes)"
  # console scripts record the venv's absolute path, so it is built in place; the stamp, written last,
  # is what marks it finished (a half-built venv has none and is rebuilt from scratch)
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # torch alone first, so that nothing later resolves it to another (CUDA) build
  "$venv/bin/python" -m pip install -q "$(grep '^torch==' "$root/scripts/requirements.txt")"
  "$venv/bin/python" -m pip install -q -r "$root/scripts/requirements.txt"
  "$venv/bin/python" -m pip install -q --no-deps -e "$root"
  echo "$want" > "$stamp"
fi
