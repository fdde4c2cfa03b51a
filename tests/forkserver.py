"""Run ``python -m MODULE ...`` (fairseq's console scripts, tests.parity_driver) and ``python -c CODE`` commands as forks of one
interpreter that has already imported torch and fairseq, instead of a new interpreter each time: importing them
is ~6 s of every such command on CI's machine, the command itself often under 2 s.

Each command is still its own process, as helpers.run's: forked from a server (one per test process, started on
first use) that imported only third-party modules, never the plugin, fairseq_cli or anything of this repository,
so the command imports the plugin (through --user-dir, or its own import) and runs as ``__main__`` as a new
interpreter would, with its own working directory, environment, stdin, stdout, stderr and exit status (a signal's is
negative). A command this cannot run faithfully (not ``sys.executable -m`` or ``-c``, or an environment variable the
interpreter or torch reads at start-up) runs in a new interpreter through helpers.run. A command that must run
without the plugin, or under a resource limit it sets itself, forks too (test_checkpoint_safety): the server never
imports the plugin, and the limit holds for the command's process only.

forked_python_modules() (the fixture python_modules_forked) does the same for the processes the code under test
starts: the study tool's runs, the recipes' steps, submitit's jobs (see SHIM below)."""

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

import pytest

from . import compose_cache, gc_tuning
from .helpers import REPO, run

# read by the interpreter or by torch at start-up: a command that changes one needs a new interpreter
STARTUP_VARIABLES = ("PYTHON", "TORCH", "CUDA", "OMP_", "MKL_", "LD_", "KMP_")

# the servers' last import step (in SERVER and SOCKET_SERVER): fairseq's first composition of its config (hydra's
# compose, in every command's convert_namespace_to_omegaconf) builds its override parser's tables and imports hydra's
# modules: ~0.8 s of CPU in a command forked cold, ~0.45 s warm (~0.5 s once per server); composed once here, with
# warnings ignored (none recorded: a command still prints its own) and logging off; a command's composition starts warm
WARM_UP = """try:
    import warnings as warm_warnings
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    with warm_warnings.catch_warnings():
        warm_warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        convert_namespace_to_omegaconf(fairseq.options.parse_args_and_arch(fairseq.options.get_training_parser(),
                                                                           ["-", "--arch", "transformer", "--cpu"]))
except Exception:  # a server that cannot compose one starts its commands cold, as before
    pass
finally:
    logging.disable(logging.NOTSET)
"""

# before the warm-up: the caches of tests/compose_cache.py (why there), filled by the warm-up's composition
COMPOSE_CACHE = compose_cache.SERVER_LINES

# after the imports: the imported heap frozen and the collector's thresholds raised (tests/gc_tuning.py: why), in
# the server and so in every command it forks
GC = gc_tuning.SERVER_LINES

# the server: import the heavy third-party modules (what the plugin and fairseq_cli import, but not they), then
# fork one child per request line {option: -m or -c, target: the module or code, argv, cwd, env, stdin, stdout,
# stderr}; reply {pid}, then {status}
SERVER = r"""
import builtins, json, logging, os, runpy, sys

# fairseq's modules call logging.basicConfig when imported (stderr, DEBUG): where a command configures logging
# first (fairseq-train: stdout) those calls do nothing, where it does not (fairseq-generate) they set it up. So
# record them, leave the root logger as a new interpreter's, and replay them at the command's first fairseq import
basic_config, replay = logging.basicConfig, []
logging.basicConfig = lambda *args, **kwargs: (replay.append((args, kwargs)), basic_config(*args, **kwargs))[1]
import torch, torch._dynamo, sympy
import fairseq, fairseq.checkpoint_utils, fairseq.criterions, fairseq.data, fairseq.distributed, fairseq.models
import fairseq.optim, fairseq.options, fairseq.sequence_generator, fairseq.tasks, fairseq.trainer
{COMPOSE_CACHE}{WARM_UP}{GC}logging.basicConfig = basic_config
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
        sys.excepthook(*sys.exc_info())  # as the interpreter reports an uncaught exception (the plugin sets a hook)
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
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # at the client's end of file: nothing to finalize (~1.5 s of CPU with torch and fairseq imported)
""".replace("{COMPOSE_CACHE}", COMPOSE_CACHE).replace("{WARM_UP}", WARM_UP).replace("{GC}", GC)


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


# ---------------------------------------------------------------------------------------------------------------
# The same for the processes a test does not start itself: the study tool's fairseq-train, evaluation and
# validation, the recipes' ``python -m scripts...`` steps, submitit's jobs. Inside forked_python_modules() every new
# interpreter finds SHIM as its sitecustomize (a directory first on PYTHONPATH); started as ``python [-u] -m
# MODULE`` with MODULE in SHIM_MODULES, or as a fairseq console script of this interpreter (fairseq-train), it does not import the
# module but hands its standard streams, working directory, environment, sys.path, ignored signals and warning
# options to a server of the same start-up environment (one per set of STARTUP_VARIABLES, started on first use) and
# stays the real process: the command each run records and /proc shows is the real one, its exit status (a
# signal's too) is the forked command's, a signal sent to it reaches the command, and if it is killed the command is
# killed. Anything else, or a server that cannot take it, runs as it would without the shim. What differs: the
# command's own pid (the shim's is the one its parent knows) and its parent; a test about the process itself (a
# pid it names, a new interpreter's imports) leaves its file without python_modules_forked. The servers' children
# are waited for, so their CPU time counts in the test process's (/usr/bin/time).

SHIM_VARIABLE = "FAIRSEQ_PLUGINS_TEST_FORK_SOCKET"
SHIM_MODULES = ("fairseq_cli.", "scripts.", "submitit.core._submit")  # the last: a submitit job (RunJob)

SHIM = f'''
import os, sys


def _forward():
    path = os.environ.get("{SHIM_VARIABLE}")
    argv = sys.orig_argv
    unbuffered = argv[1:2] == ["-u"]
    i = 2 if unbuffered else 1
    if not path or len(argv) < i + 2:
        return
    if argv[i] == "-m" and argv[i + 1].startswith({SHIM_MODULES!r}):
        target, args = ["-m", argv[i + 1]], argv[i + 2 :]
    elif os.path.dirname(argv[i]) == os.path.join(sys.prefix, "bin") and os.path.basename(argv[i]).startswith("fairseq-"):
        target, args = ["script", argv[i]], argv[i + 1 :]  # a console script of fairseq's
    else:
        return
    import json, signal, socket

    ignored = [int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) == signal.SIG_IGN]
    request = {{"target": target, "argv": args, "orig_argv": argv, "cwd": os.getcwd(),
               "env": dict(os.environ), "path": list(sys.path), "warnoptions": list(sys.warnoptions),
               "unbuffered": unbuffered or bool(os.environ.get("PYTHONUNBUFFERED")), "ignored": ignored}}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        if conn.recv(64) != b"run":
            return
    except OSError:
        return
    def forward(number, frame):
        try:
            conn.send(b"signal %d" % number)
        except OSError:  # the command has just ended
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        if s not in ignored:
            signal.signal(s, forward)
    message = b""
    while not message.startswith(b"exit "):
        message = conn.recv(64)
        if not message:
            os._exit(1)
    code = int(message.split()[1])
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 255)


_forward()
del _forward
'''

# a server for the shim's commands: SERVER's imports, then one fork per request (the connection to the shim, its
# three streams), which forks the command and relays signals and the exit status
SOCKET_SERVER = r"""
import builtins, importlib, io, json, logging, os, runpy, signal, socket, sys, threading, warnings

initial_filters = list(warnings.filters)  # no PYTHONWARNINGS here: the interpreter's defaults
basic_config, replay = logging.basicConfig, []
logging.basicConfig = lambda *args, **kwargs: (replay.append((args, kwargs)), basic_config(*args, **kwargs))[1]
import torch, torch._dynamo, sympy
import fairseq, fairseq.checkpoint_utils, fairseq.criterions, fairseq.data, fairseq.distributed, fairseq.models
import fairseq.optim, fairseq.options, fairseq.sequence_generator, fairseq.tasks, fairseq.trainer
{COMPOSE_CACHE}{WARM_UP}{GC}logging.basicConfig = basic_config
logging.root.handlers.clear()
logging.root.setLevel(logging.WARNING)
added_filters = warnings.filters[: len(warnings.filters) - len(initial_filters)]  # what the imports added
assert warnings.filters[len(added_filters) :] == initial_filters
real_import = builtins.__import__
control = socket.socket(fileno=int(sys.argv[1]))


def first_fairseq_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and (name == "fairseq" or name.startswith("fairseq.")):
        builtins.__import__ = real_import
        for args, kwargs in replay:
            logging.basicConfig(*args, **kwargs)
    return real_import(name, globals, locals, fromlist, level)


def stream(fd, write, unbuffered, old):
    # as the interpreter makes its standard streams (Python/pylifecycle.c create_stdio)
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffer = raw if write and unbuffered else (io.BufferedWriter if write else io.BufferedReader)(raw)
    return io.TextIOWrapper(buffer, encoding=old.encoding, errors=old.errors, newline="\n",
                            line_buffering=write and not unbuffered and (fd == 2 or raw.isatty()),
                            write_through=write and unbuffered)


def command(r):
    os.chdir(r["cwd"])
    os.environ.clear()
    os.environ.update(r["env"])
    option, target = r["target"]
    # as python -m: the working directory first; as a script: its directory
    sys.path[:] = [os.getcwd() if option == "-m" else os.path.dirname(target), *r["path"]]
    sys.orig_argv, sys.warnoptions[:] = r["orig_argv"], r["warnoptions"]
    importlib.invalidate_caches()  # a directory's listing is read anew, as by a new interpreter
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(s, signal.SIG_IGN if s in r["ignored"] else signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    for s in (signal.SIGPIPE, signal.SIGXFSZ):  # the interpreter ignores these
        signal.signal(s, signal.SIG_IGN)
    if signal.SIGINT not in r["ignored"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    warnings.filters[:] = initial_filters
    warnings._processoptions(r["warnoptions"])
    warnings.filters[:0] = added_filters
    warnings.onceregistry.clear()
    warnings._filters_mutated()
    sys.stdin, sys.stdout, sys.stderr = (stream(fd, fd > 0, r["unbuffered"], old)
                                         for fd, old in ((0, sys.stdin), (1, sys.stdout), (2, sys.stderr)))
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    builtins.__import__ = first_fairseq_import
    code, signalled = 0, 0
    try:
        sys.argv = [target, *r["argv"]]
        if option == "-m":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # as the interpreter: the traceback, then it dies by SIGINT
        sys.excepthook(*sys.exc_info())
        code, signalled = 1, signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # as the interpreter at exit: its non-daemon threads, then atexit's functions
    import atexit

    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    if signalled:
        signal.signal(signalled, signal.SIG_DFL)
        os.kill(os.getpid(), signalled)
    return code


def relay(conn, fds, r):
    # the forked process between the shim and the command: the command's exit status to the shim, the shim's
    # signals to the command, and the command killed if the shim goes
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            conn.close()
            os.setpgid(0, 0)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            code = command(r)
        finally:
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # also here: the shim may go (and the group be killed) before the child has set it
    except OSError:
        pass
    for fd in fds:
        os.close(fd)

    def wait():
        _, status = os.waitpid(pid, 0)
        try:
            conn.send(b"exit %d" % os.waitstatus_to_exitcode(status))
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=wait, daemon=True).start()
    try:
        conn.send(b"run")
        gone = False
    except OSError:  # the shim was killed while handing its command over (a study stopping a run it has just
        gone = True  # started): the command goes with it, as below, instead of training on unseen (issue 55's CI)
    while True:
        try:
            message = b"" if gone else conn.recv(64)
        except OSError:
            message = b""
        if not message:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            threading.Event().wait()  # until wait() ends this process
        try:
            os.kill(pid, int(message.split()[1]))
        except (OSError, ValueError, IndexError):
            pass




def reap(*_):
    # the relays, waited for (not ignored: a waited-for process's CPU time counts in its parent's, up to the test's)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


signal.signal(signal.SIGCHLD, reap)
control.send(b"ready")
while True:
    message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
    if not message:
        break
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            relay(socket.socket(fileno=fds[0]), fds[1:], json.loads(message))
        finally:
            os._exit(1)
    for fd in fds:
        os.close(fd)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
try:
    while True:
        os.wait()
except ChildProcessError:
    pass
sys.stderr.flush()
os._exit(0)  # nothing to finalize (~1.5 s of CPU with torch and fairseq imported)
""".replace("{COMPOSE_CACHE}", COMPOSE_CACHE).replace("{WARM_UP}", WARM_UP).replace("{GC}", GC)

# start-up variables (names, or a prefix ending in "_") a command and its server may differ in: the shim hands them
# over (sys.path, the standard streams' buffering, the warning filters); read later than start-up:
# CUDA_VISIBLE_DEVICES at a process's first CUDA call, which the servers never make (submitit's local jobs set it
# empty), and torchrun's settings for each rank (TORCHELASTIC_*: its run, its own error file) and
# TORCH_NCCL_ASYNC_ERROR_HANDLING when the rank starts its process group or fails
_HANDED_OVER = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONWARNINGS", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING")  # fmt: skip


class _ShimServer:
    def __init__(self, env: dict, log: str):
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", SOCKET_SERVER, str(theirs.fileno())], cwd=REPO, env=env,
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        theirs.close()
        self.control.settimeout(600)
        try:
            self.ready = self.control.recv(16) == b"ready"
        except OSError:
            self.ready = False
        self.control.settimeout(None)
        self.lock = threading.Lock()

    def close(self):
        self.control.close()  # the server's loop ends
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Dispatcher:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="fork-shim-")
        with open(os.path.join(self.dir, "sitecustomize.py"), "w") as f:
            f.write(SHIM)
        self.path = os.path.join(self.dir, "socket")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.servers: dict[tuple, _ShimServer] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._dispatch, args=(conn,), daemon=True).start()

    def _server(self, env: dict) -> _ShimServer | None:
        startup = {k: v for k, v in env.items() if k.startswith(STARTUP_VARIABLES) and not k.startswith(_HANDED_OVER)}
        # MKL reads MKL_NUM_THREADS, else OMP_NUM_THREADS, and so does torch for its thread count: unset, it is
        # OMP_NUM_THREADS's value, and the two start-ups are the same (a study sets both for its runs, the test only
        # OMP_NUM_THREADS for the study: one server for the two instead of two)
        if "OMP_NUM_THREADS" in startup:
            startup.setdefault("MKL_NUM_THREADS", startup["OMP_NUM_THREADS"])
        key = tuple(sorted(startup.items()))
        with self.lock:
            if key not in self.servers:
                server_env = {k: v for k, v in env.items() if not k.startswith(_HANDED_OVER) and k != SHIM_VARIABLE}
                self.servers[key] = _ShimServer(server_env, os.path.join(self.dir, "servers.log"))
            server = self.servers[key]
        return server if server.ready and server.proc.poll() is None else None

    def _dispatch(self, conn):
        fds: list[int] = []
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            server = self._server(json.loads(message)["env"]) if len(fds) == 3 else None
            if server is None:
                conn.send(b"local")
                return
            with server.lock:
                socket.send_fds(server.control, [message], [conn.fileno(), *fds])
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
            for fd in fds:
                os.close(fd)

    def close(self):
        self.listener.close()
        for server in self.servers.values():
            server.control.close()  # every server's loop ends at once, then each is waited for
        for server in self.servers.values():
            server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def forked_python_modules():
    """While inside: every ``python [-u] -m fairseq_cli.X`` or ``-m scripts.X`` and every fairseq console script
    (fairseq-train ...) started from this process, its children or theirs (the study tool's runs, a recipe's
    steps), runs as a fork of a server that has imported
    torch and fairseq, through SHIM (see above)."""
    dispatcher = _Dispatcher()
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", SHIM_VARIABLE)}
    os.environ["PYTHONPATH"] = os.pathsep.join([dispatcher.dir, *filter(None, [saved["PYTHONPATH"]])])
    os.environ[SHIM_VARIABLE] = dispatcher.path
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        dispatcher.close()


@pytest.fixture(scope="module")
def python_modules_forked():
    """forked_python_modules() around a test file: its tests' study and recipe processes start in milliseconds."""
    with forked_python_modules():
        yield
