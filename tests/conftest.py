import faulthandler
import os
import signal
import threading

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: thread start-up costs more than it saves

# A test that hangs (a child that never exits, a lock never released) would spend CI's whole budget and name
# nothing: past this many seconds (setup, call and teardown of one test; the slowest take 4 minutes on a loaded
# 2-core machine) every thread's stack goes to the real stderr and the test fails with TimeoutError, its children
# killed by subprocess.run. A SIGALRM in the worker's main thread, not an exit: pytest-xdist reschedules the test
# of a crashed worker on the next one. TEST_TIME_LIMIT=0 turns it off (e.g. under a debugger).
TEST_TIME_LIMIT = float(os.environ.get("TEST_TIME_LIMIT", "1200"))
_STDERR: list[int] = []


def pytest_configure(config):
    # fairseq scripts a few helpers at import time, which torch 2.13 reports as deprecated; not ours
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script` is deprecated:DeprecationWarning")
    # a captured test's fd 2 is a temporary file: keep the real stderr for the stacks of a test that hangs
    _STDERR.append(os.dup(2))


def _time_out(signum, frame):
    faulthandler.dump_traceback(file=_STDERR[0], all_threads=True)
    raise TimeoutError(f"the test ran past TEST_TIME_LIMIT={TEST_TIME_LIMIT:g} s (every thread's stack is on stderr)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if TEST_TIME_LIMIT <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _time_out)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIME_LIMIT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def corpus_bin(tmp_path_factory):
    """The tiny reversal corpus, binarized with fairseq-preprocess (joined dictionary)."""
    # imported here, not at the top: helpers imports fairseq, which must come after pytest_configure
    from .forkserver import run_forked
    from .helpers import binarize, make_reversal_corpus

    root = tmp_path_factory.mktemp("corpus")
    # forked: the tests that take the corpus run fairseq's tools through the same fork server
    return binarize(make_reversal_corpus(root / "raw"), root / "bin", runner=run_forked)
