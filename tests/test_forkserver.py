"""tests/forkserver.py's shim: a command whose shim is stopped while it hands the command over does not run on.

The study tool stops a run it has just started when another run's end interrupts it (STUDY_INTERRUPT_AT); under
load the SIGTERM could reach the shim after the server had forked the command but before the shim took it over,
and the command then trained on, unseen, beside the run's restart (test_study_lm's resumed run made 5 updates of 4).
"""

import subprocess
import sys
import time

from .forkserver import forked_python_modules

PROBE = "import pathlib, sys, time\ntime.sleep(1.0)\npathlib.Path(sys.argv[1]).write_text('ran')\n"


def test_a_command_whose_shim_is_stopped_while_starting_never_runs_on(tmp_path):
    # a module the shim forwards (its name starts with "scripts."), found first in the working directory
    package = tmp_path / "scripts"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "forkserver_probe.py").write_text(PROBE)
    command = [sys.executable, "-m", "scripts.forkserver_probe"]
    with forked_python_modules():
        subprocess.run(
            [*command, str(tmp_path / "warm")], cwd=tmp_path, check=True, timeout=120
        )  # the server up
        assert (tmp_path / "warm").read_text() == "ran"
        for i in range(
            12
        ):  # SIGTERM at moments spread over the hand-over (~0.1 s on an idle machine)
            proc = subprocess.Popen(
                [*command, str(tmp_path / f"stopped{i}")], cwd=tmp_path
            )
            time.sleep(0.02 * i)
            proc.terminate()
            assert proc.wait(timeout=60) != 0
        time.sleep(
            2.0
        )  # longer than a command that went on would take to leave its mark
    assert sorted(p.name for p in tmp_path.glob("stopped*")) == []
