"""Print docs/grid.md: every combination of the axes of ``residual_axes``, works or why not.

    python scripts/analysis/grid_table.py > docs/grid.md     # the same text as python scripts/regenerate.py writes

The table is rendered by scripts/regenerate.py (``grid_md``), which writes every generated file at once; this
script prints that one page, for the callers that ask for it by this name (tests/test_axes_grid.py).
"""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("regenerate", Path(__file__).resolve().parents[1] / "regenerate.py")
regenerate = sys.modules.get("regenerate") or importlib.util.module_from_spec(_spec)
if "regenerate" not in sys.modules:
    sys.modules["regenerate"] = regenerate
    _spec.loader.exec_module(regenerate)


def markdown() -> str:
    return regenerate.grid_md()


if __name__ == "__main__":
    sys.stdout.write(markdown())
