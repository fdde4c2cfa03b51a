import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: thread start-up costs more than it saves

from .helpers import binarize, make_reversal_corpus


@pytest.fixture(scope="session")
def corpus_bin(tmp_path_factory):
    """The tiny reversal corpus, binarized with fairseq-preprocess (joined dictionary)."""
    root = tmp_path_factory.mktemp("corpus")
    return binarize(make_reversal_corpus(root / "raw"), root / "bin")
