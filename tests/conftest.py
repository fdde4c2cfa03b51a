import faulthandler
import json
import os
import signal
import sys
import threading

import pytest

from . import compose_cache, gc_tuning

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


# CI runs two workers, one test file at a time each (--dist loadfile), and hands out the files in collection order
# (scripts/run_tests.sh passes --no-loadscope-reorder: xdist's own order, by number of tests, put the few-test
# end-to-end files last, so one worker ran alone for minutes at the end). The files that take longest, measured
# from CI's per-file times (junit), go first; every other file follows in its usual order. Only the order changes:
# a stale list costs time, never a test.
SLOWEST_FIRST = (
    "test_compile.py", "test_hub.py", "test_benchmark.py", "test_study_submitit.py", "test_study.py",
    "test_resume.py", "test_distributed.py", "test_fairseq_parity.py", "test_torchscript.py", "test_numerics.py",
    "test_documented_commands.py", "test_axes_grid.py", "test_end_to_end.py", "test_analysis.py", "test_recipes.py",
    "test_presets.py", "test_gpu_check.py", "test_cli.py", "test_fairseq_parity_2.py", "test_axes_compose.py",
    "test_golden_models.py", "test_axes_new_ideas.py", "test_graph_leaks.py", "test_study_lm.py",
)  # fmt: skip


def pytest_collection_finish(session):
    gc_tuning.tune()  # after the imports and the collection: why in tests/gc_tuning.py
    compose_cache.install()  # fairseq's config composition in the test processes: why in tests/compose_cache.py


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the others keep their order


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


@pytest.fixture(scope="session")
def in_one_forked_process():
    """tests/one_process.run_in_one_process as a fork of the fork server (tests/forkserver.py) instead of a new
    interpreter: the same batch of fairseq commands in one process, the same Runs (each command's exit status and
    its stdout and stderr together, in order), without the ~6 s of importing torch and fairseq. Each call is still
    a process of its own: a batch that resumes runs starts in a process that did not write their checkpoints."""
    # imported here, not at the top: they import fairseq, which must come after pytest_configure
    from .forkserver import run_forked
    from .one_process import RUNNER, split_runs

    # one_process's process has stderr on stdout and PYTHONUNBUFFERED (a variable only a new interpreter reads):
    # the same order through the one file and a line-buffered stdout
    code = "import os, sys\nos.dup2(1, 2)\nsys.stdout.reconfigure(line_buffering=True)\n" + RUNNER

    def run_all(commands, timeout: int = 1200) -> list:
        commands = [(tool, [str(a) for a in argv]) for tool, argv in commands]
        proc = run_forked([sys.executable, "-c", code, json.dumps(commands)], timeout=timeout, check=False)
        return split_runs(commands, proc.stdout, proc.returncode, proc.stderr)

    return run_all
