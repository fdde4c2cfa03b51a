"""The mHC kernels under AddressSanitizer and UndefinedBehaviorSanitizer: tests/mhc_kernel_sanitizer_driver.c
compiled with mhc_cpu.c (and the mhc_mix.c it includes), run over a sweep of well-formed shapes (one and two
threads, exact-size buffers) and malformed calls that must return error codes, as the GRN kernels' sanitizer
test does. Skipped, saying why, where the compiler has no sanitizers."""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from fairseq_plugins.kernels import loader

DRIVER = Path(__file__).with_name("mhc_kernel_sanitizer_driver.c")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def build(tmp_path: Path, openmp: bool) -> subprocess.CompletedProcess:
    cc = shlex.split(os.environ.get("CC") or "cc")
    flags = ["-O1", "-g", "-w", *SANITIZE, *(["-fopenmp"] if openmp else [])]
    cmd = [*cc, *flags, "-I", str(loader.HERE), "-o", str(tmp_path / "driver"), str(DRIVER), "-lm"]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)


def test_the_kernels_are_clean_under_the_sanitizers(tmp_path):
    if shutil.which(shlex.split(os.environ.get("CC") or "cc")[0]) is None:
        pytest.skip("no C compiler: the kernels are not built here, the PyTorch code runs")
    done = build(tmp_path, openmp=True)
    if done.returncode:  # e.g. no libgomp for the sanitizer build: the single-threaded kernels
        done = build(tmp_path, openmp=False)
    if done.returncode:
        pytest.skip(f"the C compiler cannot build with {' '.join(SANITIZE[:1])}: {done.stderr.strip()[-300:]}")
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}  # fmt: skip
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([str(tmp_path / "driver")], capture_output=True, text=True, check=False, timeout=300,
                         env=env)  # fmt: skip
    report = (run.stdout + run.stderr)[-3000:]
    assert run.returncode == 0 and run.stdout.startswith("ok "), report
    assert "runtime error" not in run.stderr and "Sanitizer" not in run.stderr, report
