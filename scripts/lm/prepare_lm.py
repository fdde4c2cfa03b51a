#!/usr/bin/env python
"""Prepare a language-modeling corpus for fairseq's ``language_modeling`` task (recipes/prepare_lm.sh).

Corpora (``--corpus``):
- ``multi30k`` (offline, CPU scale): one side (``--lang``, default en) of Multi30k task 1, from a local copy
  (``--raw-dir``, as recipes/prepare_multi30k.sh) or downloaded: 29,000 / 1,014 / 1,000 sentences.
- ``file``: any text files, one sentence or paragraph a line (``--train``; ``--valid``/``--test``, or the last
  ``--holdout`` lines of the training file held out for each, in file order).
- ``lm1b``: the One Billion Word benchmark (Chelba et al. 2013), the DCA paper's LM1B: the 99 training shards;
  valid = heldout shard 00001, test = heldout shard 00000 (the benchmark's test set).
- ``wikitext103``: WikiText-103 (Merity et al. 2016) as fairseq's LM example prepares it (raw tokens, no
  subwords: ``--segmentation none``).

Segmentation (``--segmentation``): ``sentencepiece`` (a unigram model trained on the training text, as
prepare_multi30k.py; the default but for WikiText-103) or ``none`` (the corpus's own tokens). Output:
``--dest-dir`` (default data-bin/lm_multi30k_LANG, data-bin/lm1b, data-bin/wikitext103, data-bin/lm_STEM) with
dict.txt, train/valid/test binarized by ``fairseq-preprocess --only-source``, the SentencePiece model and
recipe.json.
"""

import argparse
import shutil
from pathlib import Path

from scripts.data.data_common import (
    REPO,
    RecipeError,
    SentencePieceEncode,
    check_output,
    check_settings,
    concatenate,
    count_lines,
    download,
    extract,
    log,
    map_file,
    preprocess,
    read_lines,
    require_dir,
    run_main,
    start,
    step,
    train_sentencepiece,
    write_lines,
    write_manifest,
)
from scripts.data.prepare_multi30k import LANGS as MULTI30K_LANGS
from scripts.data.prepare_multi30k import SPLITS as MULTI30K_SPLITS
from scripts.data.prepare_multi30k import URL as MULTI30K_URL

TAG = "prepare_lm"
CORPORA = ("multi30k", "file", "lm1b", "wikitext103")
LM1B_URL = "https://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz"
LM1B_ROOT = "1-billion-word-language-modeling-benchmark-r13output"
WIKITEXT_URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip"
DEFAULT_VOCAB = {"multi30k": 4000, "file": 8000, "lm1b": 32000, "wikitext103": 32000}
SPM_SAMPLE = 2_000_000  # lines SentencePiece trains on for large corpora (a random sample)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="multi30k", help=f"one of {', '.join(CORPORA)} (default multi30k)")
    p.add_argument("--lang", default="en", help=f"multi30k: the side, one of {', '.join(MULTI30K_LANGS)} (default en)")
    p.add_argument("--raw-dir", type=Path, help="multi30k, lm1b, wikitext103: a local copy (no download)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="multi30k: accept line counts other than the published 29000/1014/1000 (subsets)")
    p.add_argument("--train", type=Path, help="file: the training text")
    p.add_argument("--valid", type=Path, help="file: the validation text (default: held out from --train)")
    p.add_argument("--test", type=Path, help="file: the test text (default: held out from --train)")
    p.add_argument("--holdout", type=int, default=0,
                   help="file without --valid/--test: lines held out for each (default 5%%, at most 1000)")
    p.add_argument("--segmentation", choices=("sentencepiece", "none"),
                   help="sentencepiece (default) or none (wikitext103's default: fairseq's example keeps its tokens)")
    p.add_argument("--vocab-size", type=int, help="SentencePiece pieces (default 4000 for multi30k, whose English side allows at most 7928; 8000 for file; 32000 for lm1b)")
    p.add_argument("--work-dir", type=Path, help="intermediate files (default work_dirs/data/lm_NAME)")
    p.add_argument("--dest-dir", type=Path, help="binarized output (default data-bin/NAME)")
    p.add_argument("--workers", type=int, default=2, help="processes for encoding and binarizing (default 2)")
    args = p.parse_args(argv)
    if args.corpus not in CORPORA:
        raise RecipeError(f"--corpus {args.corpus!r} (CORPUS): one of {', '.join(CORPORA)}")
    if args.corpus == "multi30k" and args.lang not in MULTI30K_LANGS:
        raise RecipeError(f"--lang {args.lang!r} (LANG_SIDE): Multi30k has {', '.join(MULTI30K_LANGS)}")
    if args.corpus == "file":
        if args.train is None or not args.train.is_file():
            raise RecipeError(f"--train {args.train} (TEXT_FILE): CORPUS=file needs an existing training text file")
        for name in ("valid", "test"):
            path = getattr(args, name)
            if path is not None and not path.is_file():
                raise RecipeError(f"--{name} {path} ({name.upper()}_FILE): no such file")
    if args.holdout < 0:
        raise RecipeError(f"--holdout {args.holdout} (HOLDOUT): 0 (default share) or a positive line count")
    args.segmentation = args.segmentation or ("none" if args.corpus == "wikitext103" else "sentencepiece")
    args.vocab_size = args.vocab_size or DEFAULT_VOCAB[args.corpus]
    if args.vocab_size < 100:
        raise RecipeError(f"--vocab-size {args.vocab_size} (VOCAB_SIZE): at least 100")
    args.name = {"multi30k": f"lm_multi30k_{args.lang}", "lm1b": "lm1b", "wikitext103": "wikitext103"}.get(
        args.corpus, f"lm_{args.train.stem if args.train else ''}"
    )
    args.work_dir = args.work_dir or REPO / "work_dirs" / "data" / args.name
    args.dest_dir = args.dest_dir or REPO / "data-bin" / args.name
    return args


def multi30k_files(args) -> dict[str, Path]:
    """{train, valid, test: the chosen side's file}, checked against the published line counts."""
    files = {}
    for split, (fairseq_split, expected) in MULTI30K_SPLITS.items():
        if args.raw_dir is not None:
            root = require_dir(args.raw_dir, "MULTI30K_DIR (--raw-dir)")
            gz, plain = root / f"{split}.{args.lang}.gz", root / f"{split}.{args.lang}"
            if not gz.is_file() and not plain.is_file():
                raise RecipeError(f"MULTI30K_DIR={root}: missing {gz.name} (or {plain.name})")
            path = gz if gz.is_file() else plain
        else:
            url = f"{MULTI30K_URL}/{split}.{args.lang}.gz"
            path = download(TAG, url, args.work_dir / "download" / f"{split}.{args.lang}.gz", local="MULTI30K_DIR")
        if args.verify_counts and count_lines(path) != expected:
            raise RecipeError(f"{path}: {count_lines(path)} lines, Multi30k has {expected} (VERIFY_COUNTS=0 for a subset)")
        files[fairseq_split] = path
    return files


def write_file_splits(args, tmp: Path) -> None:
    """tmp/{train,valid,test}.txt: the user's files; without --valid/--test, the training file's last lines held
    out for each (in file order, no shuffling)."""
    lines = read_lines(args.train)
    if args.valid and args.test:
        splits = {"train": lines}
    else:
        hold = args.holdout or max(1, min(1000, len(lines) // 20))
        if len(lines) < 3 * hold:
            raise RecipeError(f"--train {args.train} (TEXT_FILE): {len(lines)} lines, too few to hold out {hold} "
                              "for valid and test; set HOLDOUT smaller, or VALID_FILE and TEST_FILE")
        splits = {"train": lines[: -2 * hold], "valid": lines[-2 * hold : -hold], "test": lines[-hold:]}
    for name in ("valid", "test"):
        if getattr(args, name) is not None:
            splits[name] = read_lines(getattr(args, name))
    for name, split_lines in splits.items():
        if not split_lines:
            raise RecipeError(f"the {name} split of CORPUS=file is empty")
        write_lines(tmp / f"{name}.txt", split_lines)


def lm1b_files(args) -> dict[str, Path]:
    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "RAW_DIR (--raw-dir)")
    else:
        archive = download(TAG, LM1B_URL, args.work_dir / "download" / f"{LM1B_ROOT}.tar.gz")
        root = extract(TAG, archive, args.work_dir / "extracted")
    base = root / LM1B_ROOT if (root / LM1B_ROOT).is_dir() else root
    shards = sorted((base / "training-monolingual.tokenized.shuffled").glob("news.en-*-of-00100"))
    if len(shards) != 99:
        raise RecipeError(f"RAW_DIR={root}: {len(shards)} LM1B training shards found, the benchmark has 99")
    heldout = base / "heldout-monolingual.tokenized.shuffled"
    train = args.work_dir / "train.txt"
    if not train.exists():
        concatenate(shards, train)
    return {"train": train, "valid": heldout / "news.en.heldout-00001-of-00050",
            "test": heldout / "news.en.heldout-00000-of-00050"}  # fmt: skip


def wikitext_files(args) -> dict[str, Path]:
    import zipfile

    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "RAW_DIR (--raw-dir)")
    else:
        archive = download(TAG, WIKITEXT_URL, args.work_dir / "download" / "wikitext-103-v1.zip")
        root = args.work_dir / "extracted"
        if not root.exists():
            with zipfile.ZipFile(archive) as z:
                z.extractall(root)
    base = root / "wikitext-103" if (root / "wikitext-103").is_dir() else root
    return {split: base / f"wiki.{name}.tokens" for split, name in (("train", "train"), ("valid", "valid"), ("test", "test"))}


def unchanged(lines: list[str]) -> list[str]:
    return lines


def main(argv=None):
    args = parse_args(argv)
    start(TAG, args.work_dir, args.dest_dir)
    settings = {"corpus": args.corpus, "lang": args.lang if args.corpus == "multi30k" else None,
                "verify_counts": args.verify_counts,
                "segmentation": args.segmentation, "vocab_size": args.vocab_size,
                "sources": None if args.corpus != "file" else [str(p) for p in (args.train, args.valid, args.test)],
                "holdout": args.holdout}  # fmt: skip
    check_output(args.dest_dir, settings)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    check_settings(args.work_dir, settings, ["splits", "text"])
    if args.corpus == "file":
        splits = step(TAG, "splits", args.work_dir / "splits", lambda tmp: write_file_splits(args, tmp))
        files = {name: splits / f"{name}.txt" for name in ("train", "valid", "test")}
    else:
        files = {"multi30k": multi30k_files, "lm1b": lm1b_files, "wikitext103": wikitext_files}[args.corpus](args)
    for split, path in files.items():
        if not path.is_file():
            raise RecipeError(f"{path}: missing ({split} split of {args.corpus})")

    def segment(tmp: Path) -> None:
        if args.segmentation == "none":
            for split, path in files.items():
                map_file(unchanged, path, tmp / f"{split}.txt", 1)
            return
        spm_input = files["train"]
        if spm_input.suffix == ".gz":  # SentencePiece reads plain text only
            spm_input = tmp / "spm_input.txt"
            map_file(unchanged, files["train"], spm_input, 1)
        size = SPM_SAMPLE if count_lines(spm_input) > SPM_SAMPLE else 0
        model = train_sentencepiece(TAG, [spm_input], tmp / "spm", args.vocab_size, input_sentence_size=size)
        if spm_input.parent == tmp:
            spm_input.unlink()
        for split, path in files.items():
            map_file(SentencePieceEncode(model), path, tmp / f"{split}.txt", args.workers)

    text = step(TAG, f"segment ({args.segmentation})", args.work_dir / "text", segment)

    def build(tmp: Path) -> None:
        log(TAG, f"binarizing with fairseq-preprocess --only-source -> {args.dest_dir}")
        preprocess(["--only-source", "--trainpref", str(text / "train.txt"), "--validpref", str(text / "valid.txt"),
                    "--testpref", str(text / "test.txt"), "--destdir", str(tmp), "--workers", str(args.workers)])  # fmt: skip
        if (text / "spm.model").is_file():
            shutil.copy(text / "spm.model", tmp / "spm.model")
        write_manifest(tmp, {"dataset": args.name, "task": "language_modeling", "segmentation": args.segmentation,
                             "lines": {s: count_lines(text / f"{s}.txt") for s in files}, "settings": settings})  # fmt: skip

    step(TAG, "binarize", args.dest_dir, build)
    log(TAG, f"ready: {args.dest_dir}")


if __name__ == "__main__":
    run_main(TAG, main)
