"""Shared pieces of the training and evaluation scripts (scripts/training/*.py, run by recipes/train.sh,
evaluate.sh and main_job.sh).

Scripts here are run as files, so this folder is on ``sys.path``; importing this module first also puts
``scripts/`` (for recipe_common) and the repository root (for ``fairseq_plugins``) there.
"""

import sys
from pathlib import Path

for _path in (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2]):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from recipe_common import (  # noqa: F401  (re-exported: the training scripts import everything from here)
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
