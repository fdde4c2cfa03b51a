import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: thread start-up costs more than it saves


def pytest_configure(config):
    # fairseq scripts a few helpers at import time, which torch 2.13 reports as deprecated; not ours
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture(scope="session")
def corpus_bin(tmp_path_factory):
    """The tiny reversal corpus, binarized with fairseq-preprocess (joined dictionary)."""
    # imported here, not at the top: helpers imports fairseq, which must come after pytest_configure
    from .helpers import binarize, make_reversal_corpus

    root = tmp_path_factory.mktemp("corpus")
    return binarize(make_reversal_corpus(root / "raw"), root / "bin")
