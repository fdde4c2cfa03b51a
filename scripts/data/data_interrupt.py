"""Interrupted runs of the data preparation scripts (scripts/data/prepare_*.py): SIGTERM stops a recipe as
Ctrl-C does, and the temporaries a killed run left behind are removed when the next one starts. Every name
here is also importable from data_common.
"""

import os
import re
import shutil
import signal
import threading
from pathlib import Path

from scripts.recipe_common import log

_TMP_NAME = re.compile(r"\.tmp-(\d+)$")  # recipe_common.atomic_path names NAME.tmp-PID


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(tag: str, work_dir: Path, *outputs: Path) -> list[Path]:
    """Delete the ``NAME.tmp-PID`` files and directories a killed earlier run left behind: everywhere under
    ``work_dir`` and beside each of ``outputs``. Those of a process that still runs (a concurrent run) stay."""
    stale: list[Path] = []

    def check(path: Path) -> bool:
        match = _TMP_NAME.search(path.name)
        if match and not _running(int(match.group(1))):
            stale.append(path)
            return True
        return False

    if work_dir.is_dir():
        for dirpath, dirnames, filenames in os.walk(work_dir):
            for name in filenames:
                check(Path(dirpath) / name)
            dirnames[:] = [d for d in dirnames if not check(Path(dirpath) / d)]
    for output in outputs:
        if output.parent.is_dir():
            for path in output.parent.glob(f"{output.name}.tmp-*"):
                check(path)
    for path in stale:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if stale:
        log(tag, f"removed {len(stale)} temporary file(s) of an interrupted earlier run: "
                 f"{', '.join(p.name for p in stale[:5])}{' ...' if len(stale) > 5 else ''}")  # fmt: skip
    return stale


def interrupt_on_sigterm() -> None:
    """SIGTERM (a scheduler's or ``kill``'s stop) raises KeyboardInterrupt in this process, as Ctrl-C (SIGINT)
    does: the ``finally`` of every atomic step then removes its temporary output and run_main exits with
    status 130.

    Forked pool workers must die of SIGTERM at once (``Pool.terminate`` sends it, then joins them). A worker
    that inherited this Python-level handler can lose the signal: CPython clears signals that arrive between
    ``fork`` and its after-fork reset, and the worker then blocks forever on the pool's queue lock (a
    preparation hung that way once, the pool's ``terminate`` waiting on it). So every fork from the main
    thread happens with the kernel's default action in place, which the child keeps."""
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:  # a child forked from another thread inherited the handler: die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    if not _FORK_HOOKS:
        _FORK_HOOKS.append(owner)
        os.register_at_fork(before=_sigterm_default_for_fork, after_in_parent=_sigterm_restore_after_fork)


_FORK_HOOKS: list[int] = []  # registered once per process
_SAVED_SIGTERM: list = []  # the handler set aside while the main thread forks


def _sigterm_default_for_fork() -> None:
    if threading.current_thread() is threading.main_thread():  # signal.signal works only there
        _SAVED_SIGTERM.append(signal.signal(signal.SIGTERM, signal.SIG_DFL))


def _sigterm_restore_after_fork() -> None:
    if threading.current_thread() is threading.main_thread() and _SAVED_SIGTERM:
        signal.signal(signal.SIGTERM, _SAVED_SIGTERM.pop())


def start(tag: str, work_dir: Path, *outputs: Path) -> None:
    """What every preparation script does first: stop cleanly on SIGTERM and remove what a killed run left."""
    interrupt_on_sigterm()
    remove_stale_temporaries(tag, work_dir, *outputs)
