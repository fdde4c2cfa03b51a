"""The suite's time limit per test (conftest.py): a test that hangs fails by name, with every thread's stack,
and the tests after it still run."""

import subprocess
import sys

from .helpers import REPO

HANGS = """
import subprocess, sys, time
def test_sleeps():
    time.sleep(60)
def test_waits_for_a_child():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=600)
def test_after():
    pass
"""


def test_a_hanging_test_fails_by_name_and_the_rest_run(tmp_path):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "--rootdir", str(tmp_path),
         str(tmp_path / "test_hangs.py")], check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "TEST_TIME_LIMIT": "1", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 failed, 1 passed" in done.stdout and done.stdout.count("TimeoutError: the test ran past") == 2
    assert "Current thread" in done.stderr and "test_sleeps" in done.stderr  # the stacks, on the real stderr
