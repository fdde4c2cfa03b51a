"""Regenerate every generated file of the repository from the declarations, or list the stale ones.

    python -m scripts.regenerate            # rewrite each generated file (temporary name, then moved into place)
    python -m scripts.regenerate --check    # write nothing; exit 1 naming every stale file

What it writes, and what from (tests/test_generated_docs.py fails while any of them is stale):

    docs/options.md                   every option of the plugin: each axis choice's ``Option`` declarations
                                      (axes/*.py), the options beside the axes (``axes_transformer.SWITCHED_OPTIONS``,
                                      ``--autocast-dtype``), the criterion's; then the fairseq options each choice
                                      refuses, found by asking the choice's own check
    docs/grid.md                      every combination of the axes: works, or the refusal ``check_compatible`` gives;
                                      and every choice's declared capabilities (``axes.CAPABILITIES``)
    README.md  (axes table)           the residual x depth-aggregation part of that grid
    docs/architectures.md (names)     every family of ``--arch`` names from the preset tables (models/presets.py,
                                      models/families.py, lm/presets.py) and what each sets
    docs/layout.md (files)            every module and script with its docstring's first sentence
    docs/testing.md (files)           every test file with its docstring's first sentence
    docs/speed.md (speed table)       every family's CPU-time ratios to Pre-LN at each depth and its peak memory,
                                      from the benchmark's merged report docs/benchmark_all.json
    tests/golden/train_commands.txt   the training recipe's commands (scripts/training/train_golden.py)
    tests/golden/lm_commands.txt      the LM recipe's commands (scripts/lm/train_lm.py)

A file named with a part in parentheses is partly hand-written: only the text between its
``<!-- generated: NAME ...-->`` and ``<!-- end generated: NAME -->`` lines is generated. Every other file is
generated whole, and says so in its second line (the golden tables in their ``# regenerate:`` header line, whose
own command writes the same text).

One module per generated page (``options_page``, ``grid_page``, ``architectures_page``, ``file_lists``,
``golden_tables``, ``speed_table``), the Markdown pieces they share (``markdown``), and ``targets`` (what goes where, the check and
the command).

Why here and not in ``fairseq_plugins/``: the files are the repository's documentation and test expectations,
not part of the installed plugin, and the golden tables come from the recipes under scripts/, which the
plugin must not import.
"""

from .grid_page import grid_md
from .markdown import COMMAND, GENERATED, flag
from .options_page import criterion_options, plugin_model_options
from .targets import TARGETS, StaleError, main, read, stale, start_marker

__all__ = ["COMMAND", "GENERATED", "TARGETS", "StaleError", "criterion_options", "flag", "grid_md", "main",
           "plugin_model_options", "read", "stale", "start_marker"]
