"""OPUS-100 as the ResiDual authors train it: fairseq's translation_multi_simple_epoch on data binarized per pair
with one shared dictionary (scripts/data/prepare_opus100.py), the task's options from recipe.json
(scripts/training/multilingual.py), per-language sacreBLEU tokenizers and the EX/XE/ALL averages of ResiDual
table 4 (scripts/training/evaluate_recipe.py). Offline, on a three-language fixture corpus; the end-to-end test
prepares, trains 3 updates and translates in about a minute (``RECIPE_TESTS=fast`` skips it)."""

import json
import sys

import pytest

from scripts.data import prepare_opus100
from scripts.training import evaluate_recipe, multilingual
from scripts.training.training_common import RecipeError

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked, run_forked  # noqa: F401  (a fixture)
from .helpers import REPO
from .test_recipes import TRAIN_EXTRA, assert_fails, recipe, slow

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")


def manifest(langs=("de", "fr")) -> dict:
    return {"dataset": "opus100", "task": multilingual.TASK, "multilingual": prepare_opus100.multilingual_block(list(langs))}


def value(cmd: list[str], option: str) -> str:
    return cmd[cmd.index(option) + 1]


def test_train_args_are_the_authors_task_options():
    args = multilingual.train_args(manifest())
    assert value(args, "--task") == "translation_multi_simple_epoch"
    assert value(args, "--langs") == "en,de,fr"  # the order fixes the language tokens' ids
    assert value(args, "--lang-pairs") == "en-de,de-en,en-fr,fr-en"
    assert value(args, "--encoder-langtok") == "tgt" and "--decoder-langtok" not in args
    assert (value(args, "--sampling-method"), value(args, "--sampling-temperature")) == ("temperature", "5.0")
    assert "--truncate-source" in args and value(args, "--max-source-positions") == "256"
    assert "--enable-reservsed-directions-shared-datasets" in args


def test_generate_args_translate_one_direction_with_the_same_language_tokens():
    args = multilingual.generate_args(manifest(), "fr", "en")
    assert (value(args, "--source-lang"), value(args, "--target-lang")) == ("fr", "en")
    train = multilingual.train_args(manifest())
    for option in ("--langs", "--lang-pairs", "--encoder-langtok", "--lang-tok-style", "--max-source-positions"):
        assert value(args, option) == value(train, option)
    with pytest.raises(RecipeError, match="direction de-fr: not among"):
        multilingual.generate_args(manifest(), "de", "fr")


def test_a_manifest_without_the_task_options_is_refused():
    with pytest.raises(RecipeError, match="not translation_multi_simple_epoch"):
        multilingual.train_args({"task": "translation"})
    with pytest.raises(RecipeError, match="lacks langs, lang_pairs"):
        multilingual.train_args({"task": multilingual.TASK, "multilingual": {}})
    broken = manifest()
    broken["multilingual"]["lang_pairs"].append("en-xx")
    with pytest.raises(RecipeError, match=r"\['en-xx'\] use languages outside"):
        multilingual.train_args(broken)


def test_all_means_every_pair_with_dev_and_test_sets(tmp_path):
    fx.make_opus100(tmp_path / "raw", train_only=("an",))
    base = ["--raw-dir", str(tmp_path / "raw"), "--work-dir", str(tmp_path / "w"), "--no-verify-counts"]
    assert sorted(prepare_opus100.raw_files(prepare_opus100.parse_args(base))) == ["de", "fr"]
    with pytest.raises(RecipeError, match="an without dev/test sets"):
        prepare_opus100.raw_files(prepare_opus100.parse_args([*base, "--langs", "de,an"]))
    with pytest.raises(RecipeError, match="3 pairs, 2 with dev and test sets; the published corpus has 99 and 94"):
        prepare_opus100.raw_files(prepare_opus100.parse_args(base[:-1]))


def test_sacrebleu_tokenizer_follows_the_target_language():
    assert evaluate_recipe.bleu_tokenizer("de") == ("13a", None)
    assert evaluate_recipe.bleu_tokenizer("zh") == ("zh", None)
    for lang, wanted in (("ja", "ja-mecab"), ("ko", "ko-mecab")):
        name, note = evaluate_recipe.bleu_tokenizer(lang)
        if note is None:  # sacrebleu[ja] / sacrebleu[ko] installed
            assert name == wanted
        else:
            assert name == "char" and f"pip install 'sacrebleu[{lang}]'" in note and wanted in note
    scorer = evaluate_recipe.Scorer("zh", compound=False)
    result = scorer.score(["我们喜欢猫。"], ["我们喜欢猫。"])
    assert result["bleu"] == 100.0 and result["sacrebleu_tokenizer"] == "zh"
    assert "tok:zh" in str(scorer.bleu.get_signature())


@slow
def test_opus100_prepares_trains_and_translates_through_fairseqs_multilingual_task(tmp_path):
    fx.make_opus100(tmp_path / "raw", train_only=("an",))
    data = tmp_path / "bin"
    env = {"RAW_DIR": str(tmp_path / "raw"), "VERIFY_COUNTS": "0", "VOCAB_SIZE": "120", "WORKERS": "1",
           "VALID_LINES": "4", "WORK_DIR": str(tmp_path / "work"), "DEST_DIR": str(data)}  # fmt: skip
    proc = recipe("prepare_opus100.sh", env=env)
    assert "not trained (as the authors' 188 directions): an" in proc.stdout
    # one binarized pair per language serves both directions; one dictionary for every language
    for split in ("train", "valid", "test"):
        for side in ("en", "de"):
            assert (data / f"{split}.en-de.{side}.bin").is_file()
    dicts = {(data / f"dict.{x}.txt").read_text() for x in ("en", "de", "fr")}
    assert dicts == {(data / "dict.txt").read_text()}
    assert "<2" not in (tmp_path / "work" / "text" / "de" / "train.en").read_text(encoding="utf-8")  # no hand tags
    info = json.loads((data / "recipe.json").read_text())
    assert info["task"] == "translation_multi_simple_epoch" and info["multilingual"]["langs"] == ["en", "de", "fr"]
    assert [t["name"] for t in info["tests"]] == ["en-de", "de-en", "en-fr", "fr-en"]
    assert info["averages"] == {"EX (en->xx)": ["en-de", "en-fr"], "XE (xx->en)": ["de-en", "fr-en"],
                                "ALL": ["en-de", "en-fr", "de-en", "fr-en"]}  # fmt: skip
    assert (data / "refs" / "de-en.en").read_text() == (tmp_path / "raw" / "opus-100-corpus" / "v1.0" / "supervised"
                                                        / "de-en" / "opus.de-en-test.en").read_text()  # fmt: skip

    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir", str(REPO / "fairseq_plugins"),
           "--arch", "residual_e6d6", *multilingual.train_args(info), *TRAIN_EXTRA, "--encoder-layers", "2",
           "--decoder-layers", "2", "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
           "--criterion", "label_smoothed_cross_entropy", "--max-tokens", "400", "--max-update", "3", "--cpu",
           "--save-dir", str(save), "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1"]  # fmt: skip
    out = run_forked(cmd, timeout=300)
    assert "num_updates=3" in out.stdout and "main:de-en src_langtok" in out.stderr + out.stdout
    assert "Upsample ratios" in out.stdout + out.stderr  # temperature sampling over the 4 directions

    proc = recipe("evaluate.sh", str(data), str(save / "checkpoint_last.pt"), "--", "--max-len-a", "0",
                  "--max-len-b", "3", env={"OUTPUT_DIR": str(tmp_path / "eval"), "SETS": "de-en", "BEAM": "2"})  # fmt: skip
    assert "fairseq-generate on test de->en (5 sentences)" in proc.stdout
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["tests"]["de-en"]["sentences"] == 5 and results["tests"]["de-en"]["sacrebleu_tokenizer"] == "13a"
    assert len((tmp_path / "eval" / "hyps" / "de-en.en").read_text().splitlines()) == 5


def test_a_language_without_test_sets_stops_the_recipe_before_writing(tmp_path):
    fx.make_opus100(tmp_path / "raw", train_only=("an",))
    proc = recipe("prepare_opus100.sh", env={"RAW_DIR": str(tmp_path / "raw"), "LANGS": "an", "VERIFY_COUNTS": "0",
                                             "WORK_DIR": str(tmp_path / "w"), "DEST_DIR": str(tmp_path / "b")},
                  check=False)  # fmt: skip
    assert_fails(proc, "--langs (LANGS): an without dev/test sets")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_ex_xe_all_are_the_means_of_their_directions():
    def score(bleu, tokenizer="13a"):
        return {"bleu": bleu, "chrf": 2 * bleu, "tokenized_bleu": bleu + 1, "sacrebleu_tokenizer": tokenizer}

    tests = {"en-de": score(20.0), "en-ja": score(30.0, "char"), "de-en": score(25.0), "ja-en": score(36.0)}
    groups = {"EX (en->xx)": ["en-de", "en-ja"], "XE (xx->en)": ["de-en", "ja-en"],
              "ALL": ["en-de", "en-ja", "de-en", "ja-en"], "partial": ["en-de", "en-fr"]}  # fmt: skip
    means, notes = evaluate_recipe.averages(tests, groups)
    assert {k: v["bleu"] for k, v in means.items()} == {"EX (en->xx)": 25.0, "XE (xx->en)": 30.5, "ALL": 27.75}
    assert means["ALL"] == {"sets": 4, "bleu": 27.75, "chrf": 55.5, "tokenized_bleu": 28.75}
    assert notes == ["EX (en->xx) includes en-ja scored with tokenize=char", "ALL includes en-ja scored with tokenize=char"]
