"""What is generated where (``TARGETS``: a whole file, or the part between its markers), the check that names
every stale file, and the command that rewrites them (each written to a temporary name and moved into place)."""

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .architectures_page import architectures_list
from .file_lists import layout_files, testing_files
from .golden_tables import golden_lm, golden_train
from .grid_page import grid_md, readme_axes_table
from .markdown import COMMAND, REPO
from .options_page import options_md
from .speed_table import speed_table


def start_marker(name: str) -> str:
    return f"<!-- generated: {name} by `{COMMAND}`; do not edit by hand -->"


def end_marker(name: str) -> str:
    return f"<!-- end generated: {name} -->"


class StaleError(Exception):
    """A generated file cannot be regenerated as it stands (a part's markers are missing)."""


def with_part(text: str, name: str, body: str, path: str) -> str:
    """``text`` with the part ``name`` (between its markers) replaced by ``body``."""
    begin = re.search(rf"^<!-- generated: {re.escape(name)} .*-->$", text, re.MULTILINE)
    end = text.find(end_marker(name))
    if begin is None or end < begin.end():
        raise StaleError(f"{path}: no '{start_marker(name)}' ... '{end_marker(name)}' lines to generate between")
    return text[: begin.start()] + start_marker(name) + "\n" + body + text[end:]


@dataclass(frozen=True)
class Target:
    path: str  # relative to the repository
    render: Callable[[], str]
    part: str | None = None  # None: the whole file is generated

    def expected(self, current: str | None) -> str:
        if self.part is None:
            return self.render()
        if current is None:
            raise StaleError(f"{self.path}: missing (it holds the hand-written text around the generated part)")
        return with_part(current, self.part, self.render(), self.path)


TARGETS = (
    Target("docs/options.md", options_md),
    Target("docs/grid.md", grid_md),
    Target("README.md", readme_axes_table, "axes table"),
    Target("docs/architectures.md", architectures_list, "architectures"),
    Target("docs/layout.md", layout_files, "files"),
    Target("docs/testing.md", testing_files, "test files"),
    Target("docs/speed.md", speed_table, "speed table"),
    Target("tests/golden/train_commands.txt", golden_train),
    Target("tests/golden/lm_commands.txt", golden_lm),
)


def read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name in the same folder and move it into place: never a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def stale(targets=None) -> list[str]:
    """The paths of the targets whose file differs from what the declarations give (or cannot be generated)."""
    found = []
    for target in TARGETS if targets is None else targets:
        current = read(REPO / target.path)
        try:
            if target.expected(current) != current:
                found.append(target.path)
        except StaleError:
            found.append(target.path)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=sys.modules[__package__].__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every stale file")
    options = parser.parse_args(argv)
    if options.check:
        found = stale()
        for path in found:
            print(f"stale: {path}", file=sys.stderr)
        if found:
            print(f"{len(found)} generated file(s) stale; run `{COMMAND}` and review the diff", file=sys.stderr)
            return 1
        print(f"all {len(TARGETS)} generated files are up to date")
        return 0
    try:
        expected = {t.path: t.expected(read(REPO / t.path)) for t in TARGETS}  # everything first: all or nothing
    except StaleError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 1
    for path, text in expected.items():
        if read(REPO / path) != text:
            write_atomically(REPO / path, text)
            print(f"wrote {path}")
    return 0

