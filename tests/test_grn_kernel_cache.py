"""The kernel cache (the GRN kernels' and the mHC kernel's libraries) as a trust boundary (kernels/loader.py, docs/kernels.md): private directories, refused
foreign or writable entries and planted libraries, a verified hash, a build key that names the compiler and
the target, no home directory needed, a hung compiler killed with its children (issue 30); a full disk leaves no
temporary file, a hanging compiler costs one short time limit, an empty HOME or a relative XDG_CACHE_HOME is
ignored (issue 56)."""

import errno
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fairseq_plugins.kernels import grn_kernel, loader, mhc_kernel

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


# each library's module (its loaded(), failure and warning), parametrising every test below
KERNELS = {"grn_cpu": (grn_kernel, "GRN kernels unavailable"), "mhc_cpu": (mhc_kernel, "mHC kernel unavailable")}


@pytest.fixture(scope="module", params=sorted(KERNELS))
def built(request, tmp_path_factory) -> tuple[Path, str, object, str | None]:
    """A cache holding one built library and its record (built once per library), built as a new process does:
    the kernel's loaded() on a cache directory not there yet; with what loaded() returned and its failure."""
    cache = tmp_path_factory.mktemp("built") / "new" / "cache"
    kernel = KERNELS[request.param][0]
    state = {name: getattr(kernel, name) for name in ("_library", "_tried", "failure")}
    before = os.environ.get(loader.CACHE_ENV)
    os.environ[loader.CACHE_ENV] = str(cache)
    kernel._library, kernel._tried, kernel.failure = None, False, None
    try:
        library, failure = kernel.loaded(), kernel.failure
    finally:
        for name, value in state.items():
            setattr(kernel, name, value)
        if before is None:
            del os.environ[loader.CACHE_ENV]
        else:
            os.environ[loader.CACHE_ENV] = before
    return cache, request.param, library, failure


@pytest.fixture
def kernel(built):
    return KERNELS[built[1]][0]


@pytest.fixture
def cache(built, kernel, tmp_path, monkeypatch) -> Path:
    """A copy of the built cache, used by a loader in the state of a new process."""
    copy = tmp_path / "cache"
    shutil.copytree(built[0], copy, symlinks=True)
    copy.chmod(0o700)
    monkeypatch.setenv(loader.CACHE_ENV, str(copy))
    monkeypatch.setattr(kernel, "_library", None)
    monkeypatch.setattr(kernel, "_tried", False)
    monkeypatch.setattr(kernel, "failure", None)
    return copy


def library_file(cache: Path) -> Path:
    return next(cache.glob("*.so"))


def refused(caplog, needle: str, kernel) -> str:
    """Load as a new process would: the PyTorch code with one warning naming ``needle``."""
    assert kernel.loaded() is None
    name = {module: text for module, text in KERNELS.values()}[kernel]
    warnings = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(warnings) == 1 and needle in warnings[0], warnings
    return warnings[0]


def test_the_cache_is_created_private_and_loads(built):
    """The build of ``built`` (one compile per library, shared by the tests below) created the cache and loaded."""
    fresh, _, library, failure = built
    assert library is not None, failure
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert not stat.S_IMODE(library_file(fresh).stat().st_mode) & 0o022


@pytest.mark.parametrize("where", ["directory", "library", "record"])
def test_group_or_world_writable_entries_are_refused(cache, kernel, caplog, where):
    path = {"directory": cache, "library": library_file(cache), "record": next(cache.glob("*.sha256"))}[where]
    path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o022)
    assert str(path) in refused(caplog, "writable by group or others", kernel)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize("where", ["directory", "library"])
def test_entries_owned_by_another_user_are_refused(cache, kernel, caplog, where):
    os.chown(cache if where == "directory" else library_file(cache), 12345, -1)
    refused(caplog, "owned by uid 12345", kernel)


def test_a_planted_library_is_refused(cache, kernel, caplog):
    lib = library_file(cache)
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF  # another library under the recorded name
    lib.chmod(0o700)
    lib.write_bytes(bytes(data))
    refused(caplog, "sha256 is not the one recorded", kernel)


def test_a_symlinked_library_is_not_followed(cache, kernel, caplog, tmp_path):
    lib = library_file(cache)
    elsewhere = tmp_path / "elsewhere.so"
    shutil.copy(lib, elsewhere)
    lib.unlink()
    lib.symlink_to(elsewhere)
    assert kernel.loaded() is None and "unavailable" in caplog.text


def test_no_home_directory_is_needed_with_the_cache_variable(cache, kernel, monkeypatch, caplog):
    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(loader.pwd, "getpwuid", no_entry)
    monkeypatch.delenv("HOME", raising=False)
    assert kernel.loaded() is not None, kernel.failure
    monkeypatch.delenv(loader.CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    with pytest.raises(OSError, match=loader.CACHE_ENV):
        loader.cache_dir()


def fake_compiler(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{name} 1.0"; exit 0; fi\n{body}\n')
    script.chmod(0o755)
    return script


def test_the_build_key_names_the_compiler_version_and_the_target(tmp_path):
    cc = loader.compiler()
    target = loader.native_target(cc)
    assert "native" not in target  # what -march=native resolved to, read from the compiler (no /proc/cpuinfo)
    if target:
        assert loader.build_key(cc, loader.BASE_FLAGS, target) != loader.build_key(cc, loader.BASE_FLAGS, "x")
    assert loader.build_key(cc, loader.BASE_FLAGS, target, "mhc_cpu") != loader.build_key(cc, loader.BASE_FLAGS,
                                                                                           target)  # fmt: skip
    other = fake_compiler(tmp_path, "othercc", f'exec {cc[0]} "$@"')  # the same compiler, another version
    assert loader.build_key([str(other)], loader.BASE_FLAGS, target) != loader.build_key(cc, loader.BASE_FLAGS,
                                                                                          target)  # fmt: skip


def test_a_hung_compiler_is_killed_with_its_children(cache, kernel, tmp_path, monkeypatch, caplog):
    pids = tmp_path / "pids"
    hung = fake_compiler(tmp_path, "hungcc", f'case "$*" in *"###"*) exit 1;; esac\n'
                                             f'sleep 60 & echo $! >> {pids}\nsleep 60')  # fmt: skip
    monkeypatch.setenv("CC", str(hung))
    monkeypatch.setattr(loader, "BUILD_TIMEOUT", 1)
    refused(caplog, "was killed with its children", kernel)
    deadline = time.monotonic() + 5
    for pid in map(int, pids.read_text().split()):
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), f"the compiler's child {pid} outlived it"
    assert not list(cache.glob(".build-*"))  # its private build directory is gone


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has stopped running
    except FileNotFoundError:
        return False


LOAD_ALONE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("loader", sys.argv[1])
loader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loader)
loader.load()
"""


def test_concurrent_builds_on_an_empty_cache_leave_one_library(tmp_path):
    env = {**os.environ, loader.CACHE_ENV: str(tmp_path / "cache")}
    cmd = [sys.executable, "-c", LOAD_ALONE, loader.__file__]  # the loader alone: no torch import, fast
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    names = sorted((p.name for p in (tmp_path / "cache").iterdir()), key=lambda name: name.endswith(".so"))  # hashes
    assert [n.rsplit(".", 1)[-1] for n in names] == ["sha256", "so"], names  # the same bytes, one name


def test_an_empty_or_relative_home_or_cache_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.delenv(loader.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid, says the XDG specification: ignored
    assert loader.cache_dir() == tmp_path / ".cache" / "fairseq_plugins"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert loader.cache_dir() == tmp_path / "xdg" / "fairseq_plugins"
    monkeypatch.delenv("XDG_CACHE_HOME")
    entry = SimpleNamespace(pw_dir=str(tmp_path / "home"))
    monkeypatch.setattr(loader.pwd, "getpwuid", lambda uid: entry)
    for home in ("", "relative"):  # not /.cache, nor a cache relative to the working directory
        monkeypatch.setenv("HOME", home)
        assert loader.cache_dir() == tmp_path / "home" / ".cache" / "fairseq_plugins"
    entry.pw_dir = "/"  # no usable home at all: refused, saying what to set
    monkeypatch.setenv("HOME", "")
    with pytest.raises(OSError, match=f"HOME=''.*{loader.CACHE_ENV}"):
        loader.cache_dir()


@pytest.mark.parametrize("where", ["library", "record", "rename"])
def test_a_full_disk_leaves_no_temporary_file_and_names_the_cache(built, kernel, tmp_path, monkeypatch, caplog,
                                                                  where):  # fmt: skip
    empty = tmp_path / "empty"
    monkeypatch.setenv(loader.CACHE_ENV, str(empty))
    for name, value in (("_library", None), ("_tried", False), ("failure", None)):
        monkeypatch.setattr(kernel, name, value)
    monkeypatch.setattr(loader, "_compile", lambda *args: library_file(built[0]).read_bytes())  # built already
    real_write = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(empty)) and (len(data) > 100) == (where == "library"):
            real_write(fd, bytes(data[: len(data) // 2]))  # part of it, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def rename(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    if where == "rename":
        monkeypatch.setattr(os, "rename", rename)
    refused(caplog, f"in the cache {empty}: {os.strerror(errno.ENOSPC)}", kernel)
    assert not [p.name for p in empty.iterdir() if p.name.endswith(".tmp")]


def test_a_hanging_compiler_costs_one_short_time_limit(tmp_path, monkeypatch, caplog):
    hung = tmp_path / "hangcc"
    hung.write_text("#!/bin/sh\nsleep 60\n")  # even --version
    hung.chmod(0o755)
    monkeypatch.setenv("CC", str(hung))
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(loader.TIMEOUT_ENV, "0.5")
    for kernel in (grn_kernel, mhc_kernel):
        for name, value in (("_library", None), ("_tried", False), ("failure", None)):
            monkeypatch.setattr(kernel, name, value)
    start = time.monotonic()
    assert grn_kernel.loaded() is None and mhc_kernel.loaded() is None  # the second library does not wait again
    assert time.monotonic() - start < 10
    for kernel in (grn_kernel, mhc_kernel):
        assert "did not finish in 0.5 s" in kernel.failure and loader.TIMEOUT_ENV in kernel.failure, kernel.failure
    assert "not run again" in mhc_kernel.failure


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_a_bad_build_time_limit_is_refused_naming_the_variable(cache, kernel, monkeypatch, caplog, value):
    monkeypatch.setenv(loader.TIMEOUT_ENV, value)
    monkeypatch.setattr(loader, "_load", lambda *args: pytest.fail("the limit was not checked first"))
    refused(caplog, f"{loader.TIMEOUT_ENV}={value!r} (allowed: a positive number of seconds", kernel)
