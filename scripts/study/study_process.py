"""A study's training and evaluation subprocesses (study_run.Study starts them): each one's output goes to a file,
it can be stopped, and the study wakes when it ends."""

import os
import subprocess
import time
from pathlib import Path

from scripts.study.study_common import REPO


class Process:
    """A training or evaluation subprocess whose output goes to a file."""

    def __init__(self, cmd: list[str], log_file: Path, threads: int, mode: str = "a", header: str = ""):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = log_file
        self.out = open(log_file, mode, encoding="utf-8")  # noqa: SIM115  (closed in done())
        self.out.write(header)
        self.out.flush()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.out, stderr=subprocess.STDOUT)
        self.started = time.time()
        # readable once the process ends (Linux; opened before anything can reap it, so never another's pid): the
        # study wakes as a run's phase ends instead of at its next poll (Study._wait)
        try:
            self.ended: int | None = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self.ended = None

    def poll(self) -> int | None:
        status = self.proc.poll()
        if status is not None:
            self._close()
        return status

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._close()

    def _close(self) -> None:
        self.out.close()
        if self.ended is not None:
            os.close(self.ended)
            self.ended = None
