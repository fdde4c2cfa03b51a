"""Recipe errors name the variable the user can set: a SentencePiece vocabulary too large for the text names
VOCAB_SIZE and what fits, a failed Multi30k download names MULTI30K_DIR (not RAW_DIR), and the LM recipe's
default vocabulary fits Multi30k's English side (checked where a local copy is)."""

import os
import sys
from pathlib import Path

import pytest

from scripts.data import data_common, prepare_multi30k
from scripts.lm import prepare_lm

from . import recipe_fixtures as fx
from .helpers import REPO, run


def recipe(name: str, env: dict):
    return run(["bash", REPO / "recipes" / name], env={"RECIPE_PYTHON": sys.executable, **env}, check=False)


def test_a_vocabulary_too_large_names_vocab_size(tmp_path):
    env = {"MULTI30K_DIR": str(fx.make_multi30k(tmp_path / "raw")), "VERIFY_COUNTS": "0", "VOCAB_SIZE": "8000",
           "WORK_DIR": str(tmp_path / "work"), "DEST_DIR": str(tmp_path / "data")}  # fmt: skip
    proc = recipe("prepare_lm.sh", env)
    error = [line for line in (proc.stdout + proc.stderr).splitlines() if "] error: " in line]
    assert proc.returncode != 0 and len(error) == 1, proc.stdout + proc.stderr
    assert "VOCAB_SIZE=8000" in error[0] and "set VOCAB_SIZE <= " in error[0]
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("script", [prepare_lm, prepare_multi30k])
def test_a_failed_multi30k_download_names_multi30k_dir(tmp_path, monkeypatch, script):
    unreachable = (tmp_path / "nowhere").as_uri()
    if script is prepare_lm:
        monkeypatch.setattr(prepare_lm, "MULTI30K_URL", unreachable)
        argv = ["--work-dir", str(tmp_path / "work"), "--dest-dir", str(tmp_path / "data")]
    else:
        argv = ["--url", unreachable, "--work-dir", str(tmp_path / "work"), "--dest-dir", str(tmp_path / "data")]
    with pytest.raises(data_common.RecipeError) as err:
        script.main(argv)
    assert "set MULTI30K_DIR" in str(err.value) and "RAW_DIR" not in str(err.value)


def _multi30k() -> Path | None:
    for candidate in (os.environ.get("MULTI30K_DIR"), REPO.parent / "shared" / "data" / "multi30k"):
        if candidate and (Path(candidate) / "train.en.gz").is_file():
            return Path(candidate)
    return None


@pytest.mark.skipif(_multi30k() is None, reason="needs a local Multi30k copy (MULTI30K_DIR)")
def test_the_lm_default_vocabulary_fits_multi30k_english(tmp_path):
    text = tmp_path / "train.en"
    data_common.map_file(prepare_lm.unchanged, _multi30k() / "train.en.gz", text, 1)
    default = prepare_lm.parse_args([]).vocab_size
    model = data_common.train_sentencepiece("test", [text], tmp_path / "spm", default)
    assert model.is_file()
