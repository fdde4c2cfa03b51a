"""The recipes (recipes/*.sh over scripts/{data,training}/*.py) on small fixture corpora laid out like the real downloads.

Each preparation pipeline runs end to end and produces binarized data fairseq reads; the training and
evaluation recipes run for a few updates on tiny models (WMT: fp16 on CPU, the ResiDual downscale, checkpoint
averaging, the newstest2010-2016 average); bad inputs stop a recipe with a clear message before anything is
written. No network: every recipe gets its local directory. The main job's test is in test_study.py. ``RECIPE_TESTS=fast`` skips the slow tests (about 2 of the file's 3 minutes)."""

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts.data import data_common
from scripts.training import evaluate_recipe

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked  # noqa: F401  (a fixture)
from .helpers import REPO, TINY, run

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")

slow = pytest.mark.skipif(os.environ.get("RECIPE_TESTS") == "fast", reason="slow recipe test (RECIPE_TESTS=fast)")
# the fixtures' dev/test sets are smaller than fairseq's default batch multiple (8): keep every sentence
TRAIN_EXTRA = [*TINY, "--num-workers", "0", "--required-batch-size-multiple", "1"]


def recipe(name: str, *args, env: dict | None = None, check: bool = True):
    """Run ``bash recipes/NAME args`` with this interpreter (no scripts/setup_env.sh)."""
    return run(["bash", REPO / "recipes" / name, *args], env={"RECIPE_PYTHON": sys.executable, **(env or {})},
               check=check, timeout=600)  # fmt: skip


def assert_fails(proc, *messages: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-2000:]
    for message in messages:
        assert message in output, f"{message!r} not in:\n{output[-2000:]}"


def fairseq_reads(data: Path, src: str, tgt: str, splits=("train", "valid", "test")) -> dict[str, int]:
    """Sentences per split as fairseq's own loader reads the binarized files (both sides equal)."""
    from fairseq.data import Dictionary, data_utils

    sizes = {}
    for split in splits:
        n = {len(data_utils.load_indexed_dataset(str(data / f"{split}.{src}-{tgt}.{lang}"),
                                                 Dictionary.load(str(data / f"dict.{lang}.txt"))))
             for lang in (src, tgt)}  # fmt: skip
        assert len(n) == 1, f"{split}: source and target differ in length"
        sizes[split] = n.pop()
    return sizes


# ------------------------------------------------------------------------------------ pieces, in-process


def test_clean_corpus_follows_clean_corpus_n():
    src = ["a b c", "a", "a b c d e f g", "x | y", "", "w  w"]
    tgt = ["A B C", "A B C D", "A", "X Y", "Z", "W W"]
    kept = data_common.clean_corpus(src, tgt, 1, 6, 1.5)
    # ratio 4 and 7 > 1.5, an empty side and a 7-word side are dropped; '|' removed, spaces squeezed
    assert kept == (["a b c", "x y", "w w"], ["A B C", "X Y", "W W"])


def test_clean_corpus_keeps_the_bars_of_a_factored_corpus(tmp_path):
    # clean-corpus-n.perl deletes '|' (Moses' factor separator) only when the FIRST pair has none
    src, tgt = ["a|N b|V", "x | y"], ["A|N B|V", "X Y"]
    assert data_common.clean_corpus(src, tgt, 1, 6, 9.0) == (["a|N b|V", "x | y"], ["A|N B|V", "X Y"])
    plain = data_common.clean_corpus(["a b", *src], ["A B", *tgt], 1, 6, 9.0)
    assert plain == (["a b", "aN bV", "x y"], ["A B", "AN BV", "X Y"])
    # streamed in chunks, the first pair's decision holds for the whole file
    for name, lines in (("s", ["a|b"] + ["c | d"] * 3), ("t", ["A"] * 4)):
        fx.write_text(tmp_path / name, lines)
    assert data_common.clean_files(tmp_path / "s", tmp_path / "t", tmp_path / "s2", tmp_path / "t2", 1, 9, 9.0) == (4, 4)
    assert (tmp_path / "s2").read_text().splitlines() == ["a|b"] + ["c | d"] * 3


def test_compound_splitting_and_non_printing_characters():
    split = evaluate_recipe.compound_split
    assert split("Mehr-Wert-Steuer a - b") == "Mehr ##AT##-##AT## Wert ##AT##-##AT## Steuer a - b"
    assert split("a-b-c") == "a ##AT##-##AT## b-c"  # non-overlapping matches, as perl's s{}{}g
    assert data_common.remove_non_printing("a\u200bb\x07c") == "a b c"


def test_segments_are_read_by_sacrebleus_sgm_reader(tmp_path):
    path = tmp_path / "t.sgm"
    path.write_text('<doc>\n<seg id="1"> Hello  world </seg>\n<seg id="2">x</seg>\n</doc>\n', encoding="utf-8")
    assert data_common.read_segments(path) == ["Hello world", "x"]  # sacrebleu squeezes whitespace
    path.write_text("<doc>\n</doc>\n", encoding="utf-8")
    with pytest.raises(data_common.RecipeError, match="no <seg> lines"):
        data_common.read_segments(path)


def test_a_failed_step_leaves_nothing_that_looks_finished(tmp_path):
    def build(tmp):
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        data_common.step("t", "step", tmp_path / "out", build)
    assert list(tmp_path.iterdir()) == []


def test_downloaded_wmt_test_sets_are_sacrebleus_own_files(tmp_path, monkeypatch):
    from sacrebleu.dataset import DATASETS

    from scripts.data import prepare_wmt14

    dataset = DATASETS["wmt14/full"]
    monkeypatch.setattr(dataset, "_outdir", str(tmp_path))  # sacrebleu's cache, filled as its download leaves it
    for field in dataset.fieldnames("en-de"):
        fx.write_text(Path(dataset._get_txt_file_path("en-de", field)), [field])
    files = prepare_wmt14.sacrebleu_test_files(2014, "de")
    assert {lang: path.read_text() for lang, path in files.items()} == {"en": "src\n", "de": "ref\n"}
    assert prepare_wmt14.test_lines(files["en"]) == ["src"]


def test_an_output_directory_is_reused_for_its_own_direction_only(tmp_path):
    settings = {"corpus": "iwslt14", "bpe_merges": 10}
    fx.write_text(tmp_path / "recipe.json", [json.dumps({"source_lang": "en", "target_lang": "de",
                                                         "settings": settings})])  # fmt: skip
    # a directory written before directions were recorded: its manifest's languages tell
    data_common.check_output(tmp_path, {**settings, "direction": "en-de", "joined_dictionary": True})
    with pytest.raises(data_common.RecipeError, match="other settings.*DEST_DIR"):
        data_common.check_output(tmp_path, {**settings, "direction": "de-en", "joined_dictionary": True})
    with pytest.raises(data_common.RecipeError, match="other settings"):
        data_common.check_output(tmp_path, {**settings, "direction": "en-de", "joined_dictionary": False})


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_a_killed_run_are_removed_and_live_ones_kept(tmp_path):
    work, dest = tmp_path / "work", tmp_path / "bin" / "wmt14_en_de"
    dead, alive = dead_pid(), os.getpid()
    stale = [work / f"tok.tmp-{dead}" / "train.de", work / "bpe" / f"code.tmp-{dead}", tmp_path / "bin" / f"wmt14_en_de.tmp-{dead}" / "x"]
    kept = [work / f"bpe.tmp-{alive}" / "x", work / "keep.tmp-notapid", tmp_path / "bin" / f"other.tmp-{dead}"]
    for path in stale + kept:
        fx.write_text(path, ["x"])
    removed = data_common.remove_stale_temporaries("t", work, dest)
    assert sorted(p.name for p in removed) == sorted(["tok.tmp-" + str(dead), "code.tmp-" + str(dead), f"wmt14_en_de.tmp-{dead}"])
    assert all(p.exists() for p in kept) and not any(p.exists() for p in stale)


def test_sigterm_stops_a_step_and_removes_its_temporary_output(tmp_path):
    script = f"""
import sys, time
from pathlib import Path
from scripts.data import data_common
def build(tmp):
    (tmp / "half").write_text("half")
    print("building", flush=True)
    time.sleep(60)
data_common.start("t", Path({str(tmp_path / "work")!r}))
data_common.run_main("t", lambda: data_common.step("t", "slow", Path({str(tmp_path / "work" / "out")!r}), build))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().endswith("slow ...\n") and proc.stdout.readline() == "building\n"
    assert [p.name for p in (tmp_path / "work").iterdir()] == [f"out.tmp-{proc.pid}"]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "[t] interrupted" in err
    assert list((tmp_path / "work").iterdir()) == []


def test_forked_workers_die_of_sigterm_while_the_parent_keeps_its_handler():
    # a worker forked with the Python-level handler could lose Pool.terminate's SIGTERM and hang the pool
    script = """
import multiprocessing, os, signal, sys
from scripts.data import data_common
def disposition(_):
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
data_common.interrupt_on_sigterm()
handler = signal.getsignal(signal.SIGTERM)
with multiprocessing.get_context("fork").Pool(2) as pool:
    children = pool.map(disposition, range(4), chunksize=1)
for _ in range(20):  # terminate at once, workers possibly still starting: the race that hung a preparation
    multiprocessing.get_context("fork").Pool(2).terminate()
print(children, signal.getsignal(signal.SIGTERM) is handler, callable(handler))
"""
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[True,", "True,", "True,", "True]", "True", "True"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_averaged_checkpoint_keeps_the_models_dtype(tmp_path, dtype):
    from scripts.training import average_checkpoints

    paths = []
    for k in range(3):
        model = {"w": torch.full((2, 3), 0.1 * (k + 1), dtype=dtype), "steps": torch.tensor(k)}
        paths.append(tmp_path / f"c{k}.pt")
        torch.save({"model": model, "extra_state": {"k": k}}, paths[-1])
    state = average_checkpoints.average(paths)
    assert state["model"]["w"].dtype == dtype and state["extra_state"] == {"k": 0}
    expected = torch.stack([torch.load(p)["model"]["w"].double() for p in paths]).mean(0).to(dtype)
    assert torch.equal(state["model"]["w"], expected) and int(state["model"]["steps"]) == 0
    other = torch.float32 if dtype == torch.float16 else torch.float16
    torch.save({"model": {"w": torch.zeros(2, 3, dtype=other), "steps": torch.tensor(0)}}, tmp_path / "x.pt")
    with pytest.raises(SystemExit, match="w \\(2, 3\\)"):
        average_checkpoints.average([paths[0], tmp_path / "x.pt"])


def manifest(dataset: str, src="de", tgt="en") -> dict:
    return {"dataset": dataset, "source_lang": src, "target_lang": tgt}


# the training recipe's commands and set-ups: tests/test_setups.py, tests/test_golden_commands.py


# ----------------------------------------------------------------------------------------- bad inputs


def _truncate_gz(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _drop_last_line_gz(path: Path) -> None:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    fx.write_gz(path, lines[:-1])


def _drop_seg(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(line for line in lines if 'id="2"' not in line) + "\n", encoding="utf-8")


BAD = {  # id -> (recipe, fixture, environment, change to the fixture, expected message parts)
    "multi30k-missing-dir": ("prepare_multi30k.sh", None, {"MULTI30K_DIR": "{tmp}/nowhere"}, None,
                             ["MULTI30K_DIR (--raw-dir)=", "no such directory"]),
    "multi30k-wrong-language": ("prepare_multi30k.sh", "multi30k", {"TGT": "cs"}, None,
                                ["--tgt 'cs'", "Multi30k has de, en, fr"]),
    "multi30k-same-language": ("prepare_multi30k.sh", "multi30k", {"SRC": "en"}, None, ["both 'en'"]),
    "multi30k-truncated-gzip": ("prepare_multi30k.sh", "multi30k", {}, ("train.en.gz", _truncate_gz),
                                ["train.en.gz: unreadable or truncated"]),
    "multi30k-missing-lines": ("prepare_multi30k.sh", "multi30k", {}, ("val.de.gz", _drop_last_line_gz),
                               ["val.de.gz has 11 lines but", "val.en.gz has 12"]),
    "multi30k-published-counts": ("prepare_multi30k.sh", "multi30k", {"VERIFY_COUNTS": "1"}, None,
                                  ["the published corpus has 29000", "VERIFY_COUNTS=0"]),
    "multi30k-bad-flag": ("prepare_multi30k.sh", "multi30k", {"VERIFY_COUNTS": "maybe"}, None,
                          ["VERIFY_COUNTS=maybe: expected 1 or 0"]),
    "iwslt-wrong-pair": ("prepare_iwslt14.sh", "iwslt14", {"TGT": "fr"}, None,
                         ["'de-fr': not a supported language pair", "de-en, en-de"]),
    "iwslt-missing-file": ("prepare_iwslt14.sh", "iwslt14", {},
                           ("de-en/IWSLT14.TED.tst2012.de-en.en.xml", Path.unlink),
                           ["missing file IWSLT14.TED.tst2012.de-en.en.xml"]),
    "iwslt-truncated-xml": ("prepare_iwslt14.sh", "iwslt14", {}, ("de-en/IWSLT14.TED.tst2011.de-en.de.xml", _drop_seg),
                            ["IWSLT14.TED.tst2011: 4 German but 5 English segments"]),
    "wmt-wrong-pair": ("prepare_wmt14.sh", "wmt14", {"SRC": "de", "TGT": "fr"}, None,
                       ["'de-fr': not a supported language pair"]),
    "wmt-years-without-2014": ("prepare_wmt14.sh", "wmt14", {"YEARS": "2015-2016"}, None, ["must include 2014"]),
    "wmt-truncated-corpus": ("prepare_wmt14.sh", "wmt14", {},
                             ("commoncrawl.de-en.de", lambda p: p.write_text("just one line\n", encoding="utf-8")),
                             ["commoncrawl.de-en.de has 1"]),
    "wmt-missing-test-set": ("prepare_wmt14.sh", "wmt14", {}, ("test/newstest2012-src.de.sgm", Path.unlink),
                             ["missing newstest2012-src.de.sgm"]),
    "opus-unknown-language": ("prepare_opus100.sh", "opus100", {"LANGS": "de,xx"}, None,
                              ["--langs (LANGS): xx not in the corpus"]),
    "opus-missing-dir": ("prepare_opus100.sh", None, {"RAW_DIR": "{tmp}/nowhere"}, None, ["no such directory"]),
}  # fmt: skip
MAKERS = {"multi30k": fx.make_multi30k, "iwslt14": fx.make_iwslt14, "wmt14": fx.make_wmt14, "opus100": fx.make_opus100}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_stops_before_anything_is_written(case, tmp_path):
    name, fixture, env, change, messages = BAD[case]
    raw = tmp_path / "raw"
    if fixture:
        MAKERS[fixture](raw)
    if change:
        change[1](raw / change[0])
    env = {"VERIFY_COUNTS": "0", "MULTI30K_DIR" if name == "prepare_multi30k.sh" else "RAW_DIR": str(raw),
           "WORK_DIR": str(tmp_path / "work"), "DEST_DIR": str(tmp_path / "bin"),
           **{k: v.format(tmp=tmp_path) for k, v in env.items()}}  # fmt: skip
    proc = recipe(name, env=env, check=False)
    assert_fails(proc, "error:", *messages)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["raw"] if fixture else [])


def test_train_refuses_a_language_model_and_names_the_lm_recipe():
    from scripts.training import train_options
    from scripts.training.training_common import RecipeError

    for arch in ("dca_lm_d12", "transformer_lm"):
        with pytest.raises(RecipeError, match=rf"'{arch}' \(ARCH\) is a decoder-only language model.*recipes/train_lm\.sh {arch}"):
            train_options.check_architecture(arch)
    assert train_options.check_architecture("dca_e6d6") == "dca_transformer"


def test_train_rejects_an_unknown_architecture_before_writing(tmp_path):
    fx.write_text(tmp_path / "data" / "recipe.json", [json.dumps(manifest("multi30k"))])
    proc = recipe("train.sh", "residual_e7d7", str(tmp_path / "data"), env={"SAVE_DIR": str(tmp_path / "ck")},
                  check=False)  # fmt: skip
    assert_fails(proc, "unknown architecture 'residual_e7d7'", "residual_*", "e36d6", "similar: residual_")
    assert not (tmp_path / "ck").exists()
    proc = recipe("train.sh", "residual_e6d6", str(tmp_path / "none"), check=False)
    assert_fails(proc, "no data directory")
    proc = recipe("train.sh", "residual_e6d6", str(tmp_path), check=False)
    assert_fails(proc, "no recipe.json")
    assert_fails(recipe("train.sh", check=False), "usage: bash recipes/train.sh ARCH DATASET")
    # a process count that does not divide the update: test_a_variable_that_nearly_spells_a_recipes_own_is_named


def test_a_variable_that_nearly_spells_a_recipes_own_is_named():
    """The warnings come first and the recipe goes on: here to refuse NUM_GPUS=3 (the tokens of an update cannot be
    split over 3 processes), one start of the recipe's Python for both checks."""
    env = {"DRY_RUN": "1", "NUM_GPUS": "3", "SEEDS": "3", "HPARAM": "dca", "LANG": "C"}
    proc = recipe("train.sh", "residual_e6d6", "iwslt14_de_en", env=env, check=False)
    assert_fails(proc, "cannot be split exactly over 3 processes", "NUM_GPUS", "TOKENS_PER_UPDATE")
    warnings = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert warnings == ["[train] warning: HPARAM is set but is not a variable of this recipe, so it is ignored; did you mean HPARAMS?",
                        "[train] warning: SEEDS is set but is not a variable of this recipe, so it is ignored; did you mean SEED?"]  # fmt: skip


def test_evaluate_rejects_a_missing_checkpoint(tmp_path):
    fx.write_text(tmp_path / "data" / "recipe.json", ["{}"])
    proc = recipe("evaluate.sh", str(tmp_path / "data"), str(tmp_path / "ck"), check=False)
    assert_fails(proc, "CHECKPOINT=", "no such file or directory")


# --------------------------------------------------------------------------------- whole pipelines


@slow
def test_prepare_iwslt14_like_fairseq(tmp_path):
    fx.make_iwslt14(tmp_path / "raw")
    env = {"RAW_DIR": str(tmp_path / "raw"), "VERIFY_COUNTS": "0", "BPE_MERGES": "60", "WORKERS": "1", "SRC": "en",
           "TGT": "de", "WORK_DIR": str(tmp_path / "work"), "DEST_DIR": str(tmp_path / "bin")}  # fmt: skip
    recipe("prepare_iwslt14.sh", env=env)
    tok = tmp_path / "work" / "tok"
    train = (tok / "train.de").read_text(encoding="utf-8")
    assert "<url>" not in train and "<title>" not in train and train == train.lower() and " ." in train
    n_train, n_valid = (len((tok / f"{s}.en").read_text().splitlines()) for s in ("train", "valid"))
    assert n_valid == (n_train + n_valid) // 23  # every 23rd pair
    sizes = fairseq_reads(tmp_path / "bin", "en", "de")
    assert sizes == {"train": n_train, "valid": n_valid, "test": 25}
    info = json.loads((tmp_path / "bin" / "recipe.json").read_text())
    assert (info["beam"], info["lenpen"], info["tests"][0]["end"]) == (5, 1.0, 25)
    assert "\u2019" not in (tmp_path / "bin" / "refs" / "test.de").read_text(encoding="utf-8")
    assert info["joined_dictionary"] and (tmp_path / "bin" / "dict.en.txt").read_text() == (tmp_path / "bin" / "dict.de.txt").read_text()
    # the other direction reuses the tokenised and BPE files, but never the first direction's output
    proc = recipe("prepare_iwslt14.sh", env={**env, "SRC": "de", "TGT": "en"}, check=False)
    assert_fails(proc, "was built with other settings", "'direction': 'en-de'", "'direction': 'de-en'")
    # ... here with one dictionary per language (Crossformer's set-up)
    proc = recipe("prepare_iwslt14.sh", env={**env, "SRC": "de", "TGT": "en", "DEST_DIR": str(tmp_path / "bin2"),
                                             "JOINED_DICTIONARY": "0"})  # fmt: skip
    assert "tokenise and clean: done already" in proc.stdout and "joint BPE (60 merges): done already" in proc.stdout
    assert fairseq_reads(tmp_path / "bin2", "de", "en") == sizes
    def symbols(path: Path) -> set[str]:  # without fairseq's padding symbols (madeupwordNNNN)
        return {w for w in (line.split()[0] for line in path.read_text(encoding="utf-8").splitlines())
                if not w.startswith("madeupword")}  # fmt: skip

    joined = symbols(tmp_path / "bin" / "dict.de.txt")
    de, en = symbols(tmp_path / "bin2" / "dict.de.txt"), symbols(tmp_path / "bin2" / "dict.en.txt")
    assert de != en and de < joined and en < joined  # each side's own tokens only
    assert json.loads((tmp_path / "bin2" / "recipe.json").read_text())["joined_dictionary"] is False


@slow
def test_wmt14_prepare_train_average_evaluate(tmp_path):
    fx.make_wmt14(tmp_path / "raw")
    env = {"RAW_DIR": str(tmp_path / "raw"), "VERIFY_COUNTS": "0", "BPE_MERGES": "60", "WORKERS": "1",
           "WORK_DIR": str(tmp_path / "work"), "DEST_DIR": str(tmp_path / "bin")}  # fmt: skip
    recipe("prepare_wmt14.sh", env=env)
    data = tmp_path / "bin"
    assert fairseq_reads(data, "en", "de", ("train", "valid", "test", "test1"))["test1"] == 6 * 6
    tok = (tmp_path / "work" / "tok" / "train.de").read_text(encoding="utf-8")
    assert "E @-@ Mail" in tok  # tokenizer.perl -a
    info = json.loads((data / "recipe.json").read_text())
    assert info["averages"]["newstest2010-2016"] == [f"newstest{y}" for y in range(2010, 2017)]
    assert info["compound_split"] and (info["beam"], info["lenpen"]) == (4, 0.6)
    again = recipe("prepare_wmt14.sh", env=env)  # idempotent: every step is found done
    assert again.stdout.count("done already") == 3
    reverse = recipe("prepare_wmt14.sh", env={**env, "SRC": "de", "TGT": "en"}, check=False)  # same DEST_DIR
    assert_fails(reverse, "was built with other settings", "'direction': 'de-en'")

    save = tmp_path / "ck"
    # the fixture is en->de, ResiDual's paper trains DE->EN: DIRECTION=data trains it as a recorded deviation
    train_env = {"SAVE_DIR": str(save), "MAX_UPDATE": "4", "AVERAGE_LAST": "2", "MAX_TOKENS": "300", "FP16": "1",
                 "DIRECTION": "data"}
    recipe("train.sh", "residual_e6d6", str(data), "--", *TRAIN_EXTRA, "--update-freq", "1",
           "--save-interval-updates", "1", env=train_env)  # fmt: skip
    summary = json.loads((save / "train_summary.json").read_text())
    assert summary["num_updates"] == 4 and summary["fp16"] and "--dual-residual-scale" in summary["command"]
    # the average is the mean of the last two update checkpoints, loaded weights-only
    states = [torch.load(save / f"checkpoint_1_{u}.pt")["model"] for u in (3, 4)]
    averaged = torch.load(save / "checkpoint_avg2.pt")["model"]
    for key, tensor in averaged.items():
        if tensor.is_floating_point():
            expected = (states[0][key].double() + states[1][key].double()) / 2
            torch.testing.assert_close(tensor.double(), expected, atol=1e-3, rtol=1e-3)  # stored in fp16

    proc = recipe("evaluate.sh", str(data), str(save), env={"OUTPUT_DIR": str(tmp_path / "eval")})
    assert "checkpoint_avg2.pt" in proc.stdout and "nrefs:1|case:mixed|eff:no|tok:13a" in proc.stdout
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert {name: r["sentences"] for name, r in results["tests"].items()} == {f"newstest{y}": 6 for y in range(2010, 2017)}
    assert set(results["averages"]) == {"newstest2010-2016"} and set(results["fairseq_bleu"]) == {"test", "test1"}
    assert "compound splitting" in results["signatures"]["tokenized_bleu"]
    hyps = (tmp_path / "eval" / "hyps" / "newstest2014.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 6 and not any("@@" in h for h in hyps)


def test_exit_text_names_the_signal_and_the_likely_out_of_memory_kill():
    from scripts import recipe_common

    assert recipe_common.exit_text(0) == "exit 0" and recipe_common.exit_text(2) == "exit 2"
    assert recipe_common.exit_text(-signal.SIGTERM) == "killed by SIGTERM"
    killed = recipe_common.exit_text(-signal.SIGKILL)
    assert killed.startswith("killed by SIGKILL") and "out-of-memory" in killed and "dmesg" in killed
    assert recipe_common.exit_text(-200) == "killed by signal 200"
