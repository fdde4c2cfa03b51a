"""The CPU kernels under AddressSanitizer and UndefinedBehaviorSanitizer (issue 30): each driver (GRN:
tests/grn_kernel_sanitizer_driver.c with grn_cpu.c; mHC: tests/mhc_kernel_sanitizer_driver.c with mhc_cpu.c and the
mhc_mix.c it includes) runs a sweep of well-formed shapes (one and two threads, exact-size buffers) and malformed
calls that must return error codes. Skipped, saying why, where the compiler has no sanitizers."""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from fairseq_plugins.kernels import loader

DRIVERS = {name: Path(__file__).with_name(f"{name}_kernel_sanitizer_driver.c") for name in ("grn", "mhc")}
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def build(tmp_path: Path, driver: Path, openmp: bool) -> subprocess.CompletedProcess:
    cc = shlex.split(os.environ.get("CC") or "cc")
    flags = ["-O1", "-g", "-w", *SANITIZE, *(["-fopenmp"] if openmp else [])]
    cmd = [*cc, *flags, "-I", str(loader.HERE), "-o", str(tmp_path / "driver"), str(driver), "-lm"]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)


@pytest.mark.parametrize("kernels", sorted(DRIVERS))
def test_the_kernels_are_clean_under_the_sanitizers(tmp_path, kernels):
    if shutil.which(shlex.split(os.environ.get("CC") or "cc")[0]) is None:
        pytest.skip("no C compiler: the kernels are not built here, the PyTorch code runs")
    done = build(tmp_path, DRIVERS[kernels], openmp=True)
    if done.returncode:  # e.g. no libgomp for the sanitizer build: the single-threaded kernels
        done = build(tmp_path, DRIVERS[kernels], openmp=False)
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
