"""The recipes (recipes/*.sh over scripts/{data,training}/*.py) on small fixture corpora laid out like the real downloads.

Each preparation pipeline runs end to end and produces binarized data fairseq reads; the training and
evaluation recipes run for a few updates on tiny models (WMT: fp16 on CPU, the ResiDual downscale, checkpoint
averaging, the newstest2010-2016 average); bad inputs
stop a recipe with a clear message before anything is written. No network: every recipe gets its local
directory. ``RECIPE_TESTS=fast`` skips the slow tests (about 2 of the file's 3 minutes)."""

import gzip
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from . import recipe_fixtures as fx
from .helpers import REPO, TINY, run

sys.path[:0] = [str(REPO / "scripts" / "data"), str(REPO / "scripts" / "training")]

import data_common
import evaluate_recipe
import train_recipe

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

    dictionary = Dictionary.load(str(data / f"dict.{src}.txt"))
    sizes = {}
    for split in splits:
        n = {len(data_utils.load_indexed_dataset(str(data / f"{split}.{src}-{tgt}.{lang}"), dictionary))
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


def test_compound_splitting_and_non_printing_characters():
    split = evaluate_recipe.compound_split
    assert split("Mehr-Wert-Steuer a - b") == "Mehr ##AT##-##AT## Wert ##AT##-##AT## Steuer a - b"
    assert split("a-b-c") == "a ##AT##-##AT## b-c"  # non-overlapping matches, as perl's s{}{}g
    assert data_common.remove_non_printing("a\u200bb\x07c") == "a b c"


def test_segments_are_read_as_fairseq_greps_them(tmp_path):
    path = tmp_path / "t.sgm"
    path.write_text('<doc>\n<seg id="1"> Hello  world </seg>\n<seg id="2">x</seg>\n</doc>\n', encoding="utf-8")
    assert data_common.read_segments(path) == ["Hello  world", "x"]


def test_a_failed_step_leaves_nothing_that_looks_finished(tmp_path):
    def build(tmp):
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        data_common.step("t", "step", tmp_path / "out", build)
    assert list(tmp_path.iterdir()) == []


def manifest(dataset: str, src="de", tgt="en") -> dict:
    return {"dataset": dataset, "source_lang": src, "target_lang": tgt}


def command(arch: str, dataset: str, *options: str) -> tuple[list[str], train_recipe.Hparams]:
    args = train_recipe.parse_args([arch, "unused", *options])
    args.save_dir = Path("ck")
    model = train_recipe.check_architecture(arch)
    cmd, hp, _ = train_recipe.build_command(args, model, Path("data"), manifest(dataset))
    return cmd, hp


def value(cmd: list[str], option: str) -> str:
    return cmd[len(cmd) - 1 - cmd[::-1].index(option) + 1]  # the last occurrence wins, as in argparse


def test_residual_tables_9_to_11():
    cmd, _ = command("residual_iwslt_e12d12", "iwslt14")
    assert (value(cmd, "--lr"), value(cmd, "--warmup-updates"), value(cmd, "--dropout")) == ("0.0005", "4000", "0.3")
    assert (value(cmd, "--max-update"), value(cmd, "--weight-decay"), value(cmd, "--clip-norm")) == ("300000", "0.0001", "0.0")
    assert value(cmd, "--adam-betas") == "(0.9, 0.98)" and value(cmd, "--label-smoothing") == "0.1"
    assert value(cmd, "--criterion") == "label_smoothed_cross_entropy" and "--cpu" in cmd and "--fp16" not in cmd
    cmd, _ = command("residual_e18d18", "wmt14_en_de")
    assert (value(cmd, "--lr"), value(cmd, "--max-update"), value(cmd, "--dropout")) == ("0.001", "500000", "0.3")
    cmd, _ = command("residual_e18d18", "opus100")
    assert (value(cmd, "--lr"), value(cmd, "--max-update"), value(cmd, "--dropout")) == ("0.001", "100000", "0.1")


def test_fp16_switches_on_the_dual_residual_downscale_for_residual_models_only():
    cmd, _ = command("residual_e36d6", "wmt14_en_de", "--fp16", "1")
    assert "--fp16" in cmd and value(cmd, "--dual-residual-scale") == "0.05"
    cmd, _ = command("transformer_preln_e36d6", "wmt14_en_de", "--fp16", "1")
    assert "--fp16" in cmd and "--dual-residual-scale" not in cmd
    cmd, _ = command("residual_e36d6", "wmt14_en_de", "--fp16", "1", "--", "--dual-residual-scale", "0.1")
    assert value(cmd, "--dual-residual-scale") == "0.1" and cmd.count("--dual-residual-scale") == 1


def test_gpus_train_in_fp16_with_fairseq_distributed_and_constant_tokens_per_update(monkeypatch):
    monkeypatch.setattr(train_recipe, "cuda_devices", lambda: 8)
    cmd, _ = command("residual_e18d18", "wmt14_en_de")
    assert value(cmd, "--distributed-world-size") == "8" and value(cmd, "--update-freq") == "1"
    assert "--fp16" in cmd and "--cpu" not in cmd and "--fp16-no-flatten-grads" not in cmd
    cmd, _ = command("residual_e18d18", "wmt14_en_de", "--gpus", "2")
    assert value(cmd, "--update-freq") == "4"  # 4096 tokens x 2 GPUs x 4 = 32k tokens per update


def registered(prefix: str) -> str:
    archs = [a for a in train_recipe.registered_architectures() if a.startswith(prefix)]
    if not archs:
        pytest.skip(f"no {prefix}* architecture registered yet")
    return min(archs)


def test_crossformer_settings_and_guidance_criterion():
    cmd, _ = command(registered("crossformer_sg_"), "iwslt14")
    assert value(cmd, "--criterion") == "label_smoothed_cross_entropy_with_guidance"
    assert value(cmd, "--guidance-weight") == "0.01" and value(cmd, "--max-update") == "50000"
    cmd, hp = command(registered("crossformer_hg_"), "wmt14_en_fr")
    assert value(cmd, "--criterion") == "label_smoothed_cross_entropy"
    assert (value(cmd, "--lr"), value(cmd, "--max-update"), value(cmd, "--dropout")) == ("0.0007", "60000", "0.1")
    assert hp.average_last == 5 and value(cmd, "--keep-interval-updates") == "5"


def test_dca_uses_section_5_weight_decay():
    cmd, _ = command(registered("dca_"), "wmt14_en_de")
    assert value(cmd, "--weight-decay") == "0.1" and value(cmd, "--optimizer") == "adam"


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
    # the other direction reuses the tokenised and BPE files
    proc = recipe("prepare_iwslt14.sh", env={**env, "SRC": "de", "TGT": "en", "DEST_DIR": str(tmp_path / "bin2")})
    assert "tokenise and clean: done already" in proc.stdout and "joint BPE (60 merges): done already" in proc.stdout
    assert fairseq_reads(tmp_path / "bin2", "de", "en") == sizes


@slow
def test_prepare_opus100_tags_both_directions(tmp_path):
    fx.make_opus100(tmp_path / "raw")
    env = {"RAW_DIR": str(tmp_path / "raw"), "VERIFY_COUNTS": "0", "VOCAB_SIZE": "120", "WORKERS": "1",
           "VALID_LINES": "4", "WORK_DIR": str(tmp_path / "work"), "DEST_DIR": str(tmp_path / "bin")}  # fmt: skip
    recipe("prepare_opus100.sh", env=env)
    text = tmp_path / "work" / "text"
    sources = (text / "train.src").read_text(encoding="utf-8").splitlines()
    assert {line.split()[0] for line in sources} == {"<2en>", "<2de>", "<2fr>"}
    assert len(sources) == 2 * 2 * 40
    assert fairseq_reads(tmp_path / "bin", "src", "tgt") == {"train": 160, "valid": 16, "test": 20}
    info = json.loads((tmp_path / "bin" / "recipe.json").read_text())
    assert [t["name"] for t in info["tests"]] == ["de-en", "en-de", "fr-en", "en-fr"]
    assert [t["start"] for t in info["tests"]] == [0, 5, 10, 15] and info["tests"][1]["target_lang"] == "de"
    assert info["averages"]["EX (en->xx)"] == ["en-de", "en-fr"] and (info["beam"], info["lenpen"]) == (4, 0.6)


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

    save = tmp_path / "ck"
    train_env = {"SAVE_DIR": str(save), "MAX_UPDATE": "4", "AVERAGE_LAST": "2", "MAX_TOKENS": "300", "FP16": "1"}
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
