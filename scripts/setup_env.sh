#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv with the pinned stack and the plugin installed.
# Usage: bash scripts/setup_env.sh   (then use .venv/bin/python, or source .venv/bin/activate)
# Idempotent: a venv whose stamp matches scripts/requirements.txt and setup.py is reused as is.
#
# The pinned stack (1.5 GB, ~80 CPU-seconds of pip) is installed once per machine into a base venv in the user's
# cache, keyed by the hash of requirements.txt; each checkout's .venv is a hard-linked copy of it (seconds) with its
# scripts pointed at itself, and the plugin installed editable from the checkout. The same idea as the C kernels'
# cache (fairseq_plugins/kernels/loader.py), in the same directory. STACK_VENV=DIR puts that base venv elsewhere
# (e.g. a cluster's shared disk); SHARED_VENV=0 installs everything in .venv itself.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV_DIR:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"
want="$(cat "$root/scripts/requirements.txt" "$root/setup.py" | sha256sum | cut -d' ' -f1)"

# the pinned stack into $1 (a new venv), as pip resolves it; no plugin
install_stack() {
  "$python" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip
  # torch alone first, so that nothing later resolves it to another (CUDA) build
  "$1/bin/python" -m pip install -q "$(grep '^torch==' "$root/scripts/requirements.txt")"
  "$1/bin/python" -m pip install -q -r "$root/scripts/requirements.txt"
}

# sets base to the base venv of this requirements.txt (STACK_VENV, else in the cache; built once, under a lock; its
# stamp, written last, marks it finished), or to nothing when there is no usable cache directory. Called directly,
# not in $(...): bash runs a command substitution without errexit, so a failed install would go unnoticed there
shared_stack() {
  base=""
  [ "${SHARED_VENV:-1}" = 1 ] || return 0
  local where="${STACK_VENV:-}"
  if [ -z "$where" ]; then
    local cache="${XDG_CACHE_HOME:-}"
    case "$cache" in /*) ;; *) cache="${HOME:-}/.cache" ;; esac  # as the kernels' loader: only an absolute path
    case "$cache" in /*) ;; *) return 0 ;; esac
    where="$cache/fairseq_plugins/venv-$({ cat "$root/scripts/requirements.txt"; "$python" -VV; } | sha256sum | cut -c1-16)"
  fi
  mkdir -p "$(dirname "$where")" 2>/dev/null || return 0
  (
    flock 9
    if [ ! -f "$where/.complete" ]; then
      echo "[setup] installing the pinned stack once into $where (about 2 minutes)"
      rm -rf "$where"
      install_stack "$where"
      touch "$where/.complete"
    fi
  ) 9>"$where.lock"
  base="$where"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "[setup] reusing $venv"
else
  "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || {
    echo "[setup] error: Python 3.11 is required (found $("$python" --version 2>&1)); set PYTHON=python3.11" >&2
    exit 1
  }
  echo "[setup] creating $venv"
  # console scripts record the venv's absolute path, so it is built (or its scripts rewritten) for its place; the
  # stamp, written last, is what marks it finished (a half-built venv has none and is rebuilt from scratch)
  rm -rf "$venv" "$venv.partial"
  mkdir -p "$(dirname "$venv")"
  shared_stack
  if [ -n "$base" ]; then
    # hard links where the cache and the checkout share a file system, else a copy; a file is never edited in
    # place afterwards (sed -i and pip write new files), so the base stays as built
    cp -al "$base" "$venv.partial" 2>/dev/null || { rm -rf "$venv.partial"; cp -a "$base" "$venv.partial"; }
    rm -f "$venv.partial/.complete"
    { grep -lIr -F "$base" "$venv.partial/bin" || true; } | xargs -r sed -i "s|$base|$venv|g"
    mv "$venv.partial" "$venv"
  else
    install_stack "$venv"
  fi
  # the plugin from this checkout; setuptools is the venv's own (no isolated build environment to download)
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root"
  echo "$want" > "$stamp"
fi
