"""The shared option checks (fairseq_plugins/validation.py): ranges, integers of any size, non-finite values,
and an uncaught option error ending the program with its message, not a traceback."""

import math
import sys

import pytest

from fairseq_plugins.validation import PluginOptionError, check_float, check_int

from .forkserver import run_forked


@pytest.mark.parametrize(("value", "message"), [
    ("inf", r"--w must be in \[0, inf\), got inf"),
    (math.inf, r"--w must be in \[0, inf\), got inf"),
    ("nan", r"--w must be in \[0, inf\), got nan"),
    (-1, r"--w must be in \[0, inf\), got -1"),
    ("x", r"--w must be a number, got 'x'"),
])  # fmt: skip
def test_check_float_refuses_non_finite_and_out_of_range_values(value, message):
    with pytest.raises(PluginOptionError, match=message):
        check_float("w", value, 0.0, math.inf)
    assert check_float("w", "1e6", 0.0, math.inf) == 1e6


@pytest.mark.parametrize(("value", "message"), [
    ("99999999999999999999", r"--n must be an integer in \[1, 64\], got 99999999999999999999"),
    (True, "--n must be an integer, got True"),
    (2.5, "--n must be an integer, got 2.5"),
    (math.inf, "--n must be an integer, got inf"),
    ("2.0", "--n must be an integer, got '2.0'"),
    (0, r"--n must be an integer in \[1, 64\], got 0"),
])  # fmt: skip
def test_check_int_names_the_option_for_every_bad_value(value, message):
    with pytest.raises(PluginOptionError, match=message):
        check_int("n", value, 1, 64)
    assert check_int("n", " 8 ", 1, 64) == 8 and check_int("n", 8.0, 1, 64) == 8


RAISE = "import fairseq_plugins; from fairseq_plugins.validation import PluginOptionError; raise PluginOptionError('--x bad')"


@pytest.mark.parametrize(("variable", "traceback"), [("", False), ("1", True)])
def test_an_uncaught_option_error_ends_with_its_message(variable, traceback):
    # a fork of the fork server: a process that imports the plugin as a new interpreter does, without torch's start-up
    done = run_forked([sys.executable, "-c", RAISE], env={"FAIRSEQ_PLUGINS_TRACEBACK": variable}, check=False)
    assert done.returncode == 1
    assert ("Traceback" in done.stderr) is traceback
    assert "python: error: --x bad" in done.stderr or traceback
