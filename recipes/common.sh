# Sourced by every recipe (not run on its own): sets $root (the repository) and $py (the Python that runs
# the recipe's scripts/*/*.py and fairseq).
#   RECIPE_PYTHON=/path/to/python  use that interpreter as it is and skip scripts/setup_env.sh (the tests do)
#   VENV_DIR=...                   otherwise scripts/setup_env.sh creates or reuses this venv (default .venv)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${RECIPE_PYTHON:-}" ]; then
  py="$RECIPE_PYTHON"
else
  bash "$root/scripts/setup_env.sh"
  py="${VENV_DIR:-$root/.venv}/bin/python"
fi
# progress lines of the Python steps appear as they happen, also through pipes and tee
export PYTHONUNBUFFERED=1

# bool_var NAME DEFAULT: print 1 or 0 for the environment variable NAME; anything else stops the recipe
bool_var() {
  local value="${!1:-$2}"
  case "$value" in
    1 | true | yes) echo 1 ;;
    0 | false | no) echo 0 ;;
    *) echo "error: $1=$value: expected 1 or 0" >&2; return 1 ;;
  esac
}

# warn_misspelt TAG NAME...: a set variable that nearly spells one of the recipe's NAMEs (SEEDS for SEED,
# MAX_UPDATES for MAX_UPDATE) is named in a warning, since nothing reads it and the recipe would keep the default
warn_misspelt() {
  "$py" "$root/scripts/recipe_common.py" misspelt "$@" RECIPE_PYTHON VENV_DIR || true  # a warning never stops a recipe
}
