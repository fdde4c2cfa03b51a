"""Run ``python -m MODULE ...`` (fairseq's console scripts, tests.parity_driver) and ``python -c CODE`` commands as forks of one
interpreter that has already imported torch and fairseq, instead of a new interpreter each time: importing them
is ~6 s of every such command on CI's machine, the command itself often under 2 s.

Each command is still its own process, as helpers.run's: forked from a server (one per test process, started on
first use) that imported only third-party modules, never the plugin, fairseq_cli or anything of this repository,
so the command imports the plugin (through --user-dir, or its own import) and runs as ``__main__`` as a new
interpreter would, with its own working directory, environment, stdin, stdout, stderr and exit status (a signal's is
negative). A command this cannot run faithfully (not ``sys.executable -m`` or ``-c``, or an environment variable the
interpreter or torch reads at start-up) runs in a new interpreter through helpers.run. A test about the process
itself (a new interpreter without the plugin, a resource limit) calls helpers.run directly."""

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

from .helpers import REPO, run

# read by the interpreter or by torch at start-up: a command that changes one needs a new interpreter
STARTUP_VARIABLES = ("PYTHON", "TORCH", "CUDA", "OMP_", "MKL_", "LD_", "KMP_")

# the server: import the heavy third-party modules (what the plugin and fairseq_cli import, but not they), then
# fork one child per request line {option: -m or -c, target: the module or code, argv, cwd, env, stdin, stdout,
# stderr}; reply {pid}, then {status}
SERVER = r"""
import builtins, json, logging, os, runpy, sys, traceback

# fairseq's modules call logging.basicConfig when imported (stderr, DEBUG): where a command configures logging
# first (fairseq-train: stdout) those calls do nothing, where it does not (fairseq-generate) they set it up. So
# record them, leave the root logger as a new interpreter's, and replay them at the command's first fairseq import
basic_config, replay = logging.basicConfig, []
logging.basicConfig = lambda *args, **kwargs: (replay.append((args, kwargs)), basic_config(*args, **kwargs))[1]
import torch, torch._dynamo, sympy
import fairseq, fairseq.checkpoint_utils, fairseq.criterions, fairseq.data, fairseq.distributed, fairseq.models
import fairseq.optim, fairseq.options, fairseq.sequence_generator, fairseq.tasks, fairseq.trainer
logging.basicConfig = basic_config
logging.root.handlers.clear()
logging.root.setLevel(logging.WARNING)
requests, replies = os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w")
real_import = builtins.__import__


def first_fairseq_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and (name == "fairseq" or name.startswith("fairseq.")):
        builtins.__import__ = real_import
        for args, kwargs in replay:
            logging.basicConfig(*args, **kwargs)
    return real_import(name, globals, locals, fromlist, level)


def child(r):
    requests.close()
    replies.close()
    os.chdir(r["cwd"])
    os.environ.clear()
    os.environ.update(r["env"])
    for fd, path, flags in ((0, r["stdin"], os.O_RDONLY), (1, r["stdout"], os.O_WRONLY), (2, r["stderr"], os.O_WRONLY)):
        os.dup2(os.open(path, flags), fd)
    code = 0
    builtins.__import__ = first_fairseq_import
    try:
        if r["option"] == "-m":
            sys.argv, sys.path[0] = [r["target"], *r["argv"]], os.getcwd()  # as python -m: the working directory first
            runpy.run_module(r["target"], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = ["-c", *r["argv"]], ""  # as python -c
            main = sys.modules["__main__"] = type(sys)("__main__")
            exec(compile(r["target"], "<string>", "exec"), main.__dict__)
    except SystemExit as stop:  # as the interpreter exits on it
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


for line in requests:
    r = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            code = child(r)
            import atexit

            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    try:
        os.setpgid(pid, pid)  # also here: the client may kill the group before the child has set it
    except OSError:
        pass
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
"""


def base_env() -> dict[str, str]:
    """helpers.run's environment for a command."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


class _Server:
    def __init__(self):
        req_read, self._req_write = os.pipe()
        self._rep_read, rep_write = os.pipe()
        self.env = base_env()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(req_read), str(rep_write)], cwd=REPO, env=self.env,
            pass_fds=(req_read, rep_write), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(req_read)
        os.close(rep_write)
        self.requests = os.fdopen(self._req_write, "w")
        self.replies = os.fdopen(self._rep_read, "r")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self):
        try:
            self.requests.close()  # the server's loop ends at end of file
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()

    def reply(self, timeout: float | None = None) -> dict:
        import select

        if timeout is not None and not select.select([self.replies], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("forked command", timeout)
        line = self.replies.readline()
        if not line:
            raise RuntimeError(f"the fork server died (exit status {self.proc.poll()})")
        return json.loads(line)


_SERVER: list[_Server] = []
_ONE_AT_A_TIME = threading.Lock()  # the server answers one command at a time


def _server() -> _Server:
    if not _SERVER or not _SERVER[0].alive():
        _SERVER[:] = [_Server()]
        atexit.register(_SERVER[0].close)
    return _SERVER[0]


def forkable(cmd: Sequence, env: dict | None) -> bool:
    return (
        len(cmd) >= 3 and str(cmd[0]) == sys.executable and cmd[1] in ("-m", "-c")
        and not any(k.startswith(STARTUP_VARIABLES) for k in (env or {}))
    )  # fmt: skip


def run_forked(cmd: Sequence, cwd=None, env=None, timeout: int = 600, input_text: str | None = None, check=True):
    """helpers.run for ``sys.executable -m MODULE ...`` or ``-c CODE ...``, forked from the server: the same
    arguments, result and checks."""
    if not forkable(cmd, env):
        return run(cmd, cwd=cwd, env=env, timeout=timeout, input_text=input_text, check=check)
    server = _server()
    full_env = dict(server.env, **(env or {}))
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryDirectory(prefix="forked-") as tmp:
        stdin = os.devnull
        if input_text is not None:
            stdin = os.path.join(tmp, "stdin")
            with open(stdin, "w") as f:
                f.write(input_text)
        paths = {name: os.path.join(tmp, name) for name in ("stdout", "stderr")}
        for path in paths.values():
            open(path, "w").close()
        request = {"option": cmd[1], "target": cmd[2], "argv": cmd[3:], "cwd": str(cwd or REPO), "env": full_env, "stdin": stdin, **paths}
        with _ONE_AT_A_TIME:
            server.requests.write(json.dumps(request) + "\n")
            server.requests.flush()
            try:
                pid = server.reply(timeout=timeout)["pid"]  # the first waits for the server's imports too
            except BaseException:
                server.proc.kill()  # late replies would answer the next command: a new server for it
                _SERVER.clear()
                raise
            try:
                status = server.reply(timeout=timeout)["status"]
            except BaseException:  # a timeout, or the test's time limit: the command and its children go
                try:
                    os.killpg(pid, signal.SIGKILL)
                    server.reply(timeout=60)
                except (OSError, subprocess.TimeoutExpired, RuntimeError):
                    server.proc.kill()
                    _SERVER.clear()
                raise
        with open(paths["stdout"]) as out, open(paths["stderr"]) as err:
            proc = subprocess.CompletedProcess(cmd, status, out.read(), err.read())
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc
