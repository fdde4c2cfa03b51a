"""The language-model recipes: the golden table of every fairseq-train command recipes/train_lm.sh generates
(tests/golden/lm_commands.txt), exact tokens per update at any GPU and node count, the dry run, offline
preparation from a local text file and from a Multi30k copy, and a few real updates on the prepared corpus.

After a deliberate change (or a new family) regenerate the table with

    python -m scripts.lm.train_lm --write-golden tests/golden/lm_commands.txt

and review the diff: each changed line is a changed command."""

import difflib
import random
import re
import shlex
import sys

import pytest

from fairseq_plugins.lm import LM_FAMILIES
from scripts.lm import lm_setups, train_lm
from scripts.training.training_common import RecipeError

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked  # noqa: F401  (a fixture)
from .helpers import REPO, run

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")

GOLDEN = REPO / "tests" / "golden" / "lm_commands.txt"
REGENERATE = "python -m scripts.lm.train_lm --write-golden tests/golden/lm_commands.txt"


def checked_in() -> list[str]:
    return [line for line in GOLDEN.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]


def recipe(name: str, *args, env: dict | None = None, check: bool = True):
    return run(["bash", REPO / "recipes" / name, *args], env={"RECIPE_PYTHON": sys.executable, **(env or {})},
               check=check, timeout=600)  # fmt: skip


def test_generated_commands_match_the_golden_table():
    generated, golden = train_lm.golden_lines(), checked_in()
    if generated != golden:
        diff = "\n".join(list(difflib.unified_diff(golden, generated, "checked in", "generated", lineterm="", n=0))[:40])
        raise AssertionError(f"the LM recipe's commands changed; if on purpose, run `{REGENERATE}`:\n{diff}")
    assert train_lm.GOLDEN_HEADER[-1].endswith(REGENERATE)


def test_every_command_has_the_set_ups_exact_tokens_per_update():
    lines = checked_in()
    for setup in lm_setups.SETUPS_ORDER:
        rows = lm_setups.SETUPS[setup]
        for gpus, nodes in train_lm.GOLDEN_WORLDS[setup]:
            for family in LM_FAMILIES:
                cmd = train_lm.golden_command(lines, f"{setup} gpus={gpus} nodes={nodes}", family)
                value = {o: int(re.search(rf"{o} (\d+)", cmd).group(1))
                         for o in ("--batch-size", "--update-freq", "--tokens-per-sample", "--max-tokens")}  # fmt: skip
                world = max(gpus, 1) * nodes
                tokens = world * value["--batch-size"] * value["--tokens-per-sample"] * value["--update-freq"]
                assert tokens == rows["tokens_per_update"].value, cmd
                assert value["--max-tokens"] == value["--batch-size"] * value["--tokens-per-sample"]
                assert value["--max-tokens"] <= rows["max_tokens"].value
                assert f"--arch {family}_lm_d6" in cmd and "--required-batch-size-multiple 1" in cmd
                assert ("--distributed-world-size" in cmd) == (world > 1)
    dca = train_lm.golden_command(lines, "dca-paper gpus=8 nodes=4", "dca")
    for option in ("--lr 0.0016", "--warmup-updates 1000", "--lr-scheduler inverse_sqrt", "--weight-decay 0.1",
                   "--adam-betas '(0.9, 0.98)'", "--tokens-per-sample 128", "--max-update 500000", "--fp16"):  # fmt: skip
        assert option in dca


def test_dry_run_prints_the_golden_command():
    proc = recipe("train_lm.sh", "dca_lm_d6", "lm1b", env={"DRY_RUN": "1", "NUM_GPUS": "8", "NUM_NODES": "4"})
    printed = proc.stdout.strip().splitlines()[-1]  # the command, as render() prints it
    golden = train_lm.golden_command(checked_in(), "dca-paper gpus=8 nodes=4", "dca")
    assert printed.replace(shlex.quote(sys.executable), "python").replace(f"{REPO}/", "") == golden
    assert "tokens per update: 4 node(s) x 8 GPU(s) x --batch-size 32 x 128 tokens x --update-freq 2 = 262144" in proc.stdout


def test_impossible_splits_and_wrong_architectures_are_refused():
    def plan(arch, *options):
        args = train_lm.parse_args([arch, "lm_multi30k_en", "--dry-run", *options])
        train_lm.attach_save_dirs(args)
        return train_lm.plan(args, arch, args.hparams, env={}, visible=0, read_data=False)

    with pytest.raises(RecipeError, match=r"among 1, 2, 4, 8, 16"):
        plan("dca_lm_d6", "--hparams", "dca-cpu", "--gpus", "8", "--nodes", "4")
    with pytest.raises(RecipeError, match="multiples of"):
        plan("dca_lm_d6", "--tokens-per-update", "1000")
    with pytest.raises(RecipeError, match="not a language-model architecture"):
        plan("dca_e6d6")
    with pytest.raises(RecipeError, match="HPARAMS"):
        plan("dca_lm_d6", "--hparams", "residual-paper")
    lowered = plan("dca_lm_d6", "--hparams", "dca-cpu", "--gpus", "0", "--cpu-procs", "2", "--max-tokens", "512")
    assert (lowered.world, lowered.sequences, lowered.update_freq) == (2, 4, 2)


@pytest.fixture(scope="module")
def prepared_file(tmp_path_factory):
    """CORPUS=file: a local text file, valid and test held out from it, SentencePiece."""
    root = tmp_path_factory.mktemp("lm_recipe")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    fx.write_text(root / "my_text.txt", [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
                                         for _ in range(400)])  # fmt: skip
    env = {"CORPUS": "file", "TEXT_FILE": str(root / "my_text.txt"), "HOLDOUT": "20", "VOCAB_SIZE": "200",
           "WORK_DIR": str(root / "work"), "DEST_DIR": str(root / "data")}  # fmt: skip
    recipe("prepare_lm.sh", env=env)
    return root / "data"


def test_prepare_from_a_local_text_file(prepared_file):
    import json

    manifest = json.loads((prepared_file / "recipe.json").read_text())
    assert manifest["task"] == "language_modeling" and manifest["lines"] == {"train": 360, "valid": 20, "test": 20}
    assert (prepared_file / "spm.model").is_file() and (prepared_file / "dict.txt").is_file()


def test_prepare_from_a_multi30k_copy_offline(tmp_path):
    raw = fx.make_multi30k(tmp_path / "raw")
    env = {"MULTI30K_DIR": str(raw), "LANG_SIDE": "de", "SEGMENTATION": "none", "WORK_DIR": str(tmp_path / "work"),
           "DEST_DIR": str(tmp_path / "data")}  # fmt: skip
    proc = recipe("prepare_lm.sh", env=env, check=False)
    # the fixture is smaller than the published Multi30k: the counts are checked before anything is written
    assert proc.returncode != 0 and "Multi30k has 29000" in proc.stdout + proc.stderr
    assert not (tmp_path / "data").exists()
    recipe("prepare_lm.sh", env={**env, "VERIFY_COUNTS": "0"})
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(tmp_path / "data" / "dict.txt"))
    sizes = {split: len(data_utils.load_indexed_dataset(str(tmp_path / "data" / split), dictionary))
             for split in ("train", "valid", "test")}  # fmt: skip
    assert sizes == {"train": 80, "valid": 12, "test": 13}


def test_train_lm_runs_on_the_prepared_corpus(prepared_file, tmp_path):
    save = tmp_path / "save"
    tiny = ["--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
            "--decoder-layers", "2", "--num-workers", "0", "--valid-subset", "valid", "--max-epoch", "1"]  # fmt: skip
    env = {"HPARAMS": "dca-cpu", "NUM_GPUS": "0", "MAX_UPDATE": "3", "TOKENS_PER_UPDATE": "256", "MAX_TOKENS": "128",
           "DATA_BIN": str(prepared_file), "SAVE_DIR": str(save)}  # fmt: skip
    proc = recipe("train_lm.sh", "dca_k2_lm_d6", "ignored", "--", *tiny, env=env)
    assert "= 256" in proc.stdout and (save / "checkpoint_last.pt").is_file()
    assert (save / "train_setup.json").is_file()
