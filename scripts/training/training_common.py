"""Shared pieces of the training and evaluation scripts (scripts/training/*.py, run by recipes/train.sh,
evaluate.sh and main_job.sh).

The scripts run as modules from the repository root (``python -m scripts.training.train_recipe``).
"""

from scripts.recipe_common import (  # noqa: F401  (re-exported: the training scripts import everything from here)
    MANIFEST,
    PLUGIN_DIR,
    REPO,
    RecipeError,
    atomic_path,
    exit_text,
    fairseq_module,
    log,
    read_lines,
    read_manifest,
    run_command,
    run_main,
    split_passthrough,
    write_json,
    write_lines,
)
