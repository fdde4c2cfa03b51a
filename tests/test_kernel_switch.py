"""The kernels' availability check stays a constant to torch.compile, and importing the plugin does not import
torch._dynamo (about 1.3 s of every fairseq process's start-up)."""

import subprocess
import sys

import torch._dynamo

from fairseq_plugins.kernels import switch

from .helpers import REPO


def test_the_constant_mark_is_torchs():
    def ours():
        return True

    def torchs():
        return True

    switch.assume_constant_result(ours)
    torch._dynamo.assume_constant_result(torchs)
    marks = {name: value for name, value in vars(torchs).items()}
    assert marks and vars(ours) == marks


def test_importing_the_plugin_does_not_import_dynamo():
    code = "import sys, fairseq_plugins; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"
