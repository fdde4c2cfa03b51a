"""What every recipe script shares (scripts/data, scripts/training, scripts/analysis, scripts/benchmark):
errors and logging, atomic files, running fairseq's tools, and the manifest a prepared dataset carries.

- a step writes under a temporary name and renames its result into place when it is complete, so a
  half-finished step never looks finished (``atomic_path``);
- errors are ``RecipeError``: the recipe stops with one clear line naming the variable or option, and
  exit status 1 (``run_main``).

Scripts live in one folder per concern of the ``scripts`` package and run as modules from the repository root
(``python -m scripts.data.prepare_multi30k``); each folder's own helper module (data_common, training_common,
analysis_common) re-exports what its scripts need from here.
"""

import contextlib
import difflib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "fairseq_plugins"
MANIFEST = "recipe.json"  # written into every data-bin directory the recipes build


class RecipeError(Exception):
    """A problem with the recipe's inputs or settings: reported as one line, exit status 1."""


def split_passthrough(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(the recipe's own arguments, those after ``--``, which go to the fairseq tool unchanged)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def run_main(tag: str, main: Callable[[], None]) -> None:
    """Run ``main``; a RecipeError becomes ``[tag] error: ...`` on stderr and exit status 1."""
    try:
        main()
    except RecipeError as err:
        print(f"[{tag}] error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"[{tag}] interrupted", file=sys.stderr, flush=True)
        sys.exit(130)


def log(tag: str, message: str) -> None:
    print(f"[{tag}] {message}", flush=True)


def exit_text(status: int) -> str:
    """A child's exit status for a message: a negative one is the signal that killed it, by name, and SIGKILL
    with no one asking is most often the kernel's out-of-memory killer."""
    if status >= 0:
        return f"exit {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        return f"killed by signal {-status}"
    hint = " (without a Ctrl-C or kill of yours, most often the out-of-memory killer: `dmesg` says)" if name == "SIGKILL" else ""
    return f"killed by {name}{hint}"


def env_flag(value: str | None, name: str) -> bool:
    """'1'/'0' (also true/false/yes/no) from an environment variable, with a message naming it."""
    text = (value or "").strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise RecipeError(f"{name}={value!r}: expected 1 or 0")


def misspelt_variables(environ, known: Sequence[str]) -> list[tuple[str, str]]:
    """Set variables that are not a recipe's but nearly spell one of its ``known`` (SEED for SEEDS, MAX_UPDATES
    for MAX_UPDATE), as (set name, meant name): the shell passes them on and nothing reads them, so the recipe
    would silently keep the default."""
    near = []
    for name in sorted(environ):
        if name.isupper() and name not in known:
            match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
            if match:
                near.append((name, match[0]))
    return near


def warn_misspelt(tag: str, known: Sequence[str]) -> None:
    for name, meant in misspelt_variables(os.environ, known):
        print(f"[{tag}] warning: {name} is set but is not a variable of this recipe, so it is ignored; "
              f"did you mean {meant}?", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- files


def open_text(path: Path, mode: str = "rt"):
    """Open plain or gzipped UTF-8 text (by suffix)."""
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def read_lines(path: Path) -> list[str]:
    """Lines of a plain or gzipped text file without their line ends; a corrupt file is a RecipeError."""
    try:
        with open_text(path) as f:
            return [line.rstrip("\r\n") for line in f]
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as err:
        raise RecipeError(f"{path}: unreadable or truncated ({type(err).__name__}: {err})") from err


def count_lines(path: Path) -> int:
    """Lines of a plain or gzipped file, streamed (training corpora have tens of millions)."""
    try:
        with open_text(path) as f:
            return sum(1 for _ in f)
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as err:
        raise RecipeError(f"{path}: unreadable or truncated ({type(err).__name__}: {err})") from err


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``final`` (file or directory) that replaces ``final`` on success.

    The temporary name is removed if the body fails, so an interrupted step leaves nothing that looks done.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_lines(path: Path, lines: Iterable[str]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, data) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- fairseq


def fairseq_module(tool: str) -> list[str]:
    """Run a fairseq console script with this interpreter, so no PATH lookup can pick another install."""
    return [sys.executable, "-m", f"fairseq_cli.{tool}"]


def run_command(tag: str, cmd: Sequence, env: dict | None = None, quiet: bool = False) -> str:
    """Run ``cmd``; on failure raise a RecipeError with the end of its output."""
    cmd = [str(c) for c in cmd]
    proc = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=quiet, text=True, check=False
    )
    if proc.returncode != 0:
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-3000:] if quiet else "(output above)"
        raise RecipeError(f"{Path(cmd[2]).name if cmd[1] == '-m' else cmd[0]} failed ({exit_text(proc.returncode)}): {tail}")
    return proc.stdout or ""


def write_manifest(dest: Path, manifest: dict) -> None:
    write_json(dest / MANIFEST, manifest)


def read_manifest(data_dir: Path) -> dict:
    path = data_dir / MANIFEST
    if not path.is_file():
        raise RecipeError(
            f"{data_dir}: no {MANIFEST}; prepare the data with recipes/prepare_*.sh (or give DATA_BIN of one)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


if __name__ == "__main__":  # recipes/common.sh's warn_misspelt: python recipe_common.py misspelt TAG NAME...
    if sys.argv[1:2] == ["misspelt"] and len(sys.argv) > 3:
        warn_misspelt(sys.argv[2], sys.argv[3:])
