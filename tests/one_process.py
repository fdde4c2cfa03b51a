"""Several fairseq command lines run in ONE Python process, each through its console script's own entry point
(``fairseq_cli.TOOL.cli_main``, what ``python -m fairseq_cli.TOOL`` runs): the start-up (importing torch, fairseq
and the plugin, about 6 s of CPU per process, more on a loaded machine) is paid once per batch instead of once per
command. Each command gets its own exit status and output (stdout and stderr together, in order), so a test can
check each as if it had run alone. Only for tests that are not about a process: a resumed run still starts in a
process of its own (one batch writes the checkpoints, a later batch resumes from them), and DDP ranks, stdin and
installed console scripts keep their real processes."""

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .helpers import REPO

MARK = "=== one_process"
# runs each command as ``python -m fairseq_cli.TOOL ARGV`` would (sys.argv[0] the module's file, so its parser's
# prog is TOOL.py; an exception through sys.excepthook, exit status 1), then prints its exit status; between commands it
# forgets what fairseq keeps per process: the best validation loss seen (checkpoint_utils.save_checkpoint.best;
# it decides whether checkpoint_best.pt is written and is stored in every checkpoint)
RUNNER = f"""
import importlib, json, logging, os, sys
logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                    level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout)  # first, as every tool does
from fairseq import checkpoint_utils
for tool, argv in json.loads(sys.argv[1]):
    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best
    module = importlib.import_module("fairseq_cli." + tool)
    sys.argv = [module.__file__, *argv]
    print("{MARK} START", flush=True)
    try:
        module.cli_main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr, flush=True)
    except BaseException:  # what the interpreter does with an uncaught exception (the plugin installs a hook)
        sys.excepthook(*sys.exc_info())
        code = 1
    print("{MARK} EXIT", code, flush=True)
"""


@dataclass
class Run:
    argv: list[str]
    returncode: int
    output: str  # stdout and stderr, interleaved as written

    def check(self) -> "Run":
        """This run, after asserting it succeeded (its output's tail in the message otherwise)."""
        assert self.returncode == 0, f"fairseq {' '.join(self.argv)} failed:\n{self.output[-6000:]}"
        return self


def run_in_one_process(commands: Sequence[tuple[str, Sequence]], timeout: int = 1200) -> list[Run]:
    """Run every (tool, argv) of ``commands`` (tool: train, generate, interactive, ...) in order in one new Python
    process; one Run per command. A command that fails does not stop the ones after it."""
    commands = [(tool, [str(a) for a in argv]) for tool, argv in commands]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(commands)], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)  # fmt: skip
    return split_runs(commands, proc.stdout, proc.returncode)


def split_runs(commands: list, stdout: str, returncode: int, stderr: str = "") -> list[Run]:
    """One Run per command from the output of RUNNER's process (its START/EXIT marks), after asserting the
    process ran every command and exited normally."""
    runs = []
    for (_, argv), part in zip(commands, stdout.split(f"{MARK} START\n")[1:], strict=False):
        output, marker, status = part.rpartition(f"{MARK} EXIT ")
        runs.append(Run(argv, int(status.split()[0]) if marker else -1, output if marker else part))
    assert len(runs) == len(commands) and returncode == 0, (
        f"the process running {len(commands)} fairseq commands stopped after {len(runs)} (exit {returncode}):\n"
        f"{stdout[-6000:]}" + (f"\n{stderr[-3000:]}" if stderr else "")
    )
    return runs
