"""Building, caching and loading the kernel libraries (``LIBRARIES``: the GRN kernels grn_cpu.c, the mHC kernel
mhc_cpu.c) without trusting the cache more than the user. Each library is built, cached and verified on its
own (one that fails to build does not take the other with it), under the same rules.

The trust model (docs/kernels.md says it for users):
- The cache directory (``$FAIRSEQ_PLUGINS_CACHE``, else ``$XDG_CACHE_HOME/fairseq_plugins``, else
  ``$HOME/.cache/fairseq_plugins``; an XDG_CACHE_HOME or HOME that is empty or relative is ignored, as the XDG
  specification says, and the passwd entry's home directory used instead) is created with mode 0700. It, the
  library and its hash record must be owned by the effective user and writable by no one else; anything else is
  refused with a warning naming the path, and the PyTorch code runs. The directory is opened once and every
  file is reached through that descriptor, without following links, so a path swapped after the check is not
  read.
- A library is published under its content hash (``<name>-<sha256>.so``): written under a fresh temporary
  name, fsynced and hard-linked into place (a file that exists is never replaced, so no process's mapping
  changes under it). The record ``<name>-<build key>.sha256`` names it; it is replaced atomically. A write
  that fails (a full disk) removes its temporary file and names the cache in its error.
- Loading reads the library through one descriptor, checks its sha256 against the record, and loads that same
  descriptor (``/proc/self/fd/N`` on Linux), so what was verified is what runs; the descriptor is kept open,
  so its name is never reused for another library (the dynamic loader would return the earlier one).
- The build key covers what the machine code depends on: the library's name and source, the compiler's
  resolved path and ``--version``, the flags, and the target the compiler resolves ``-march=native`` to (from
  ``cc -###``; if that cannot be read the build is portable, without ``-march=native``).
- The compiler runs in its own session, in a private temporary directory (also its TMPDIR), and is killed as a
  process group if it exceeds the time limit (``$FAIRSEQ_PLUGINS_BUILD_TIMEOUT`` seconds, default
  BUILD_TIMEOUT; its probes get at most PROBE_TIMEOUT), so no child outlives it and writes into the cache. A
  compiler that timed out is not run again by this process (the other library falls back at once).
"""

import contextlib
import ctypes
import hashlib
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

try:
    import pwd
except ImportError:  # not a POSIX system: HOME alone
    pwd = None

HERE = Path(__file__).parent
# name -> its sources, the first compiled (grn_cpu.c includes grn_loops.c), all in the build key
LIBRARIES = {
    "grn_cpu": (HERE / "grn_cpu.c", HERE / "grn_loops.c"),
    # the first includes the others
    "mhc_cpu": (HERE / "mhc_cpu.c", HERE / "mhc_mix.c", HERE / "mhc_coef.c", HERE / "mhc_post.c", HERE / "hc_coef.c"),
}
DEFAULT = "grn_cpu"
BASE_FLAGS = ("-O3", "-fno-math-errno", "-shared", "-fPIC")
OPENMP_FLAG = "-fopenmp"
# seconds: a hung compiler falls back like a missing one. A build takes seconds (measured with gcc 12, -O3
# -march=native -fopenmp, on a 2-core EPYC: grn_cpu 3.6 s and mhc_cpu 3.9 s at load 4.5; 4.6 and 5.8 s with the
# probes at load 8): 60 s leaves a 10x margin, and a hanging compiler costs it once a process
BUILD_TIMEOUT = 60.0
PROBE_TIMEOUT = 10.0  # cc --version and cc -###: milliseconds when the compiler works
CACHE_ENV = "FAIRSEQ_PLUGINS_CACHE"
TIMEOUT_ENV = "FAIRSEQ_PLUGINS_BUILD_TIMEOUT"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_KEPT_OPEN: list[int] = []  # descriptors of the loaded libraries (see _load_verified)
_HUNG: dict[tuple[str, ...], str] = {}  # compilers that timed out in this process, and how


class Refused(OSError):
    """A cache entry that is not private to this user: not used, not touched."""


class TimedOut(OSError):
    """A compiler that did not finish in time (killed with its children; not tried again)."""


def cache_dir() -> Path:
    """The cache directory; no home directory is needed when FAIRSEQ_PLUGINS_CACHE is set. XDG_CACHE_HOME and
    HOME count only as absolute paths (the XDG specification ignores relative ones; an empty HOME would put the
    cache in /.cache)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.path.isabs(os.environ.get("XDG_CACHE_HOME", "")):
        return Path(os.environ["XDG_CACHE_HOME"]) / "fairseq_plugins"
    return Path(_home()) / ".cache" / "fairseq_plugins"


def _home() -> str:
    """$HOME if it is an absolute path, else the passwd entry's home directory if that is one (not /)."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return home
    entry = ""
    with contextlib.suppress(KeyError, AttributeError):  # a uid without a passwd entry (containers); no pwd
        entry = pwd.getpwuid(os.geteuid()).pw_dir
    if os.path.isabs(entry) and entry.strip("/"):
        return entry
    said = f"HOME={home!r}" if "HOME" in os.environ else "HOME is unset"
    raise OSError(f"no cache directory: {said} (allowed: an absolute path) and the user has no home directory in "
                  f"the passwd database; set {CACHE_ENV} to a private directory")  # fmt: skip


def build_timeout() -> float:
    """The compiler's time limit: $FAIRSEQ_PLUGINS_BUILD_TIMEOUT seconds, else BUILD_TIMEOUT."""
    value = os.environ.get(TIMEOUT_ENV)
    if not value:
        return BUILD_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise OSError(f"{TIMEOUT_ENV}={value!r} (allowed: a positive number of seconds, default {BUILD_TIMEOUT:g})")
    return seconds


def _check_private(st: os.stat_result, path: Path, kind: int) -> None:
    if stat.S_IFMT(st.st_mode) != kind:
        raise Refused(f"refusing {path}: not a {'directory' if kind == stat.S_IFDIR else 'regular file'}")
    if st.st_uid != os.geteuid():
        raise Refused(f"refusing {path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise Refused(f"refusing {path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")


def open_private_dir(path: Path) -> int:
    """A descriptor of ``path`` (created with mode 0700 if missing), checked to be private to this user."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        _check_private(os.fstat(fd), path, stat.S_IFDIR)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fd_path(fd: int, fallback: Path) -> str:
    """A path that names the file of descriptor fd itself (Linux), else the path it was opened from."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(fallback)


def _read_private(dfd: int, name: str, path: Path) -> tuple[int, bytes]:
    """(descriptor, content) of file ``name`` in directory dfd, opened without following links and checked."""
    fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=dfd)
    try:
        _check_private(os.fstat(fd), path / name, stat.S_IFREG)
        chunks = []
        while block := os.read(fd, 1 << 20):
            chunks.append(block)
        return fd, b"".join(chunks)
    except BaseException:
        os.close(fd)
        raise


def _write_new(dfd: int, name: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file ``name`` in dfd (it must not exist) and flush it to disk; if that fails (a
    full disk), the file is removed."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run cmd in its own session; on timeout kill its whole process group (the compiler's children too)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimedOut(f"{cmd[0]} did not finish in {timeout} s and was killed with its children") from None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def compiler() -> list[str]:
    """$CC (may carry arguments, e.g. ``ccache gcc``) with its program resolved to a real path."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    found = shutil.which(cc[0]) if cc else None
    if found is None:
        raise OSError(f"no C compiler: {os.environ.get('CC') or 'cc'} not found (set CC)")
    return [os.path.realpath(found), *cc[1:]]


def native_target(cc: list[str], timeout: float = PROBE_TIMEOUT) -> str:
    """What the compiler turns -march=native into on this machine (gcc's -m options and --params, clang's
    -target-cpu and -target-features from ``-###``), or "" if it cannot say (then no -march=native). Raises
    TimedOut for a compiler that hangs."""
    try:
        done = _run([*cc, "-march=native", "-###", "-x", "c", "-c", os.devnull, "-o", os.devnull], timeout)
    except TimedOut:
        raise
    except OSError:
        return ""
    if done.returncode == 0:
        words: list[str] = []
        for line in done.stderr.splitlines():
            with contextlib.suppress(ValueError):
                words += shlex.split(line)
        picked = [w for i, w in enumerate(words) if w.startswith(("-m", "--param"))
                  or (i and words[i - 1] in ("-target-cpu", "-target-feature", "-tune-cpu"))]  # fmt: skip
        if any(re.match(r"-march=(?!native)|[+-]\w", w) for w in picked) or "-target-cpu" in words:
            return " ".join(picked)
    return ""


def build_key(cc: list[str], flags: tuple[str, ...], target: str, name: str = DEFAULT,
              timeout: float = PROBE_TIMEOUT) -> str:  # fmt: skip
    version = _run([*cc, "--version"], timeout)
    if version.returncode:
        raise OSError(f"{cc[0]} --version failed: {version.stderr.strip()[-300:]}")
    parts = [name, *(p.read_text() for p in LIBRARIES[name]), *cc, version.stdout, *flags, target]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _compile(cc: list[str], flags: tuple[str, ...], dfd: int, path: Path, name: str, timeout: float) -> bytes:
    """Compile in a fresh private directory of the cache; its output is read through the cache's descriptor."""
    workdir = Path(tempfile.mkdtemp(prefix=".build-", dir=path))
    try:
        wfd = os.open(workdir.name, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC, dir_fd=dfd)
        try:
            _check_private(os.fstat(wfd), workdir, stat.S_IFDIR)
            env = {**os.environ, "TMPDIR": str(workdir)}
            cmd = [*cc, *flags, "-o", str(workdir / f"{name}.so"), str(LIBRARIES[name][0]), "-lm"]
            done = _run(cmd, timeout, cwd=workdir, env=env)
            if done.returncode:
                raise OSError(f"{cc[0]} failed: {done.stderr.strip()[-500:]}")
            fd, data = _read_private(wfd, f"{name}.so", workdir)
            os.close(fd)
            return data
        finally:
            os.close(wfd)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _publish(dfd: int, path: Path, record: str, data: bytes, name: str) -> None:
    """The library under its content hash (never replacing a file), then the record naming it (atomically).
    Raises OSError naming the cache if a write fails (a full disk), with no temporary file left behind."""
    digest = hashlib.sha256(data).hexdigest()
    tmp = f".{name}-{os.getpid()}-{os.urandom(6).hex()}.tmp"
    try:
        _write_new(dfd, tmp, data, 0o500)
        try:
            os.link(tmp, f"{name}-{digest}.so", src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:  # another process published the same bytes: it is verified when loaded
            pass
        finally:
            os.unlink(tmp, dir_fd=dfd)
        _write_new(dfd, tmp, f"{digest}\n".encode(), 0o600)
        try:
            os.rename(tmp, record, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    except OSError as err:
        raise OSError(f"could not store the built {name} library in the cache {path}: {err.strerror or err} (free "
                      f"space there, or set {CACHE_ENV} to another private directory)") from err  # fmt: skip
    with contextlib.suppress(OSError):
        os.fsync(dfd)


def _load_verified(dfd: int, path: Path, record: str, name: str) -> ctypes.CDLL:
    fd, text = _read_private(dfd, record, path)
    os.close(fd)
    digest = text.decode(errors="replace").strip()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise OSError(f"{path / record} is not a sha256 record")
    file = f"{name}-{digest}.so"
    fd, data = _read_private(dfd, file, path)
    try:
        if hashlib.sha256(data).hexdigest() != digest:
            raise Refused(f"refusing {path / file}: its sha256 is not the one recorded when it was built")
        lib = ctypes.CDLL(_fd_path(fd, path / file))  # the verified descriptor's file, not the path again
    except BaseException:
        os.close(fd)
        raise
    # the descriptor stays open while the process lives: the dynamic loader takes a name it has loaded before
    # for the same library, so a closed and reused /proc/self/fd/N would load the earlier library again
    # (the GRN library in place of the mHC one) instead of the file just verified
    _KEPT_OPEN.append(fd)
    return lib


def load(name: str = DEFAULT) -> ctypes.CDLL:
    """Library ``name`` of LIBRARIES, from the cache or built into it. Raises OSError (Refused for a cache that is
    not private)."""
    if name not in LIBRARIES:
        raise ValueError(f"no kernel library {name!r} (there are {sorted(LIBRARIES)})")
    cc = compiler()
    if tuple(cc) in _HUNG:  # this process waited for it once already
        raise TimedOut(f"{_HUNG[tuple(cc)]} before; not run again (raise {TIMEOUT_ENV} for a slow compiler)")
    timeout = build_timeout()
    try:
        return _load(name, cc, timeout)
    except TimedOut as err:
        _HUNG[tuple(cc)] = str(err)
        raise TimedOut(f"{err} (raise {TIMEOUT_ENV} for a slow compiler)") from None


def _load(name: str, cc: list[str], timeout: float) -> ctypes.CDLL:
    probe = min(PROBE_TIMEOUT, timeout)
    target = native_target(cc, probe)
    base = (*BASE_FLAGS, "-march=native") if target else BASE_FLAGS
    path = cache_dir()
    dfd = open_private_dir(path)
    try:
        for flags in ((*base, OPENMP_FLAG), base):  # without OpenMP (e.g. no libomp) the kernels run one thread
            record = f"{name}-{build_key(cc, flags, target, name, probe)}.sha256"
            with contextlib.suppress(FileNotFoundError):
                return _load_verified(dfd, path, record, name)
            try:
                data = _compile(cc, flags, dfd, path, name, timeout)
            except TimedOut:
                raise
            except OSError:
                if flags == base:
                    raise
                continue
            _publish(dfd, path, record, data, name)
            return _load_verified(dfd, path, record, name)
        raise AssertionError("unreachable")
    finally:
        os.close(dfd)
