"""Shared by the study tool's tests (test_study*.py): the tiny models and the recipe runner."""

import os
import sys

import pytest

from .helpers import REPO, TINY, run

slow = pytest.mark.skipif(os.environ.get("RECIPE_TESTS") == "fast", reason="slow recipe test (RECIPE_TESTS=fast)")
# the fixtures' dev/test sets are smaller than fairseq's default batch multiple (8): keep every sentence
MODEL_ARGS = " ".join([*TINY, "--required-batch-size-multiple", "1"])


def recipe(name: str, env: dict, check: bool = True):
    return run(["bash", REPO / "recipes" / name], env={"RECIPE_PYTHON": sys.executable, **env}, check=check, timeout=900)
