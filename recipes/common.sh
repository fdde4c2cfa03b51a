# Sourced by every recipe (not run on its own): sets $root (the repository) and $py (the Python that runs
# the recipe's tools, python -m scripts.GROUP.MODULE, and fairseq).
#   RECIPE_PYTHON=/path/to/python  use that interpreter as it is and skip scripts/setup_env.sh (the tests do)
#   VENV_DIR=...                   otherwise scripts/setup_env.sh creates or reuses this venv (default .venv)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${RECIPE_PYTHON:-}" ]; then
  py="$RECIPE_PYTHON"
else
  bash "$root/scripts/setup_env.sh"
  py="${VENV_DIR:-$root/.venv}/bin/python"
fi
# the tools run as modules of the scripts package (python -m scripts.GROUP.MODULE) from any directory: the
# repository root goes on PYTHONPATH rather than being cd'd into, so relative paths in variables and options keep
# meaning the caller's directory
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# progress lines of the Python steps appear as they happen, also through pipes and tee
export PYTHONUNBUFFERED=1
# warnings fairseq's own code raises on every command and no user can act on (hydra's compatibility API, which
# fairseq calls; torch.cuda.amp in fairseq's task; pin_memory without a GPU; the mask types of fairseq's
# attention) are silenced for the recipes' commands; any other warning still shows, and a PYTHONWARNINGS of the
# user's own comes last, so it wins
quiet="ignore:::hydra.experimental.initialize,ignore:::hydra.experimental.compose,ignore:::hydra.core.default_element"
quiet+=",ignore:::hydra.compose,ignore::FutureWarning:fairseq.tasks.fairseq_task"
# hydra's schema warning runs off the top of the stack: it is reported from sys (console scripts) or runpy (-m)
quiet+=",ignore::UserWarning:sys,ignore::UserWarning:runpy"
quiet+=",ignore:'pin_memory' argument is set as true but no accelerator is found:UserWarning"
quiet+=",ignore:Support for mismatched key_padding_mask and attn_mask is deprecated:UserWarning"
export PYTHONWARNINGS="$quiet${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
unset quiet

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
  "$py" -m scripts.recipe_common misspelt "$@" RECIPE_PYTHON VENV_DIR || true  # a warning never stops a recipe
}
