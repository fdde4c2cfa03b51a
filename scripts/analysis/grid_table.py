"""Print docs/grid.md: every combination of the axes of ``residual_axes``, works or why not.

    python -m scripts.analysis.grid_table > docs/grid.md     # the same text as python -m scripts.regenerate writes

The table is rendered by scripts/regenerate/grid_page.py (``grid_md``), which writes every generated file at once; this
script prints that one page, for the callers that ask for it by this name (tests/test_axes_grid.py).
"""

import sys

from scripts import regenerate


def markdown() -> str:
    return regenerate.grid_md()


if __name__ == "__main__":
    sys.stdout.write(markdown())
