#!/usr/bin/env python
"""Prepare Multi30k task 1 (Elliott et al., 2016) for fairseq: the CPU-scale translation task.

29,000 training pairs, 1,014 validation pairs (``val``) and the 1,000-sentence ``test_2016_flickr`` test set,
in German, English and French. A joint SentencePiece unigram model (8k pieces by default, the setting
measured on this project's 2-core machine) segments raw text, with no other tokenisation, so that
``fairseq-generate --remove-bpe sentencepiece`` gives detokenised text for sacrebleu.

    python -m scripts.data.prepare_multi30k --src de --tgt en                       # downloads the corpus
    python -m scripts.data.prepare_multi30k --src de --tgt en --raw-dir DIR         # DIR/train.de.gz ...

Output: ``--dest-dir`` (default ``data-bin/multi30k_SRC_TGT``) with fairseq's binarized train/valid/test, the
SentencePiece model, the raw test references (``refs/``) and ``recipe.json`` for the evaluation recipe.
"""

import argparse
import shutil
from pathlib import Path

from scripts.data.data_common import (
    REPO,
    RecipeError,
    SentencePieceEncode,
    binarize,
    check_output,
    check_parallel,
    check_settings,
    download,
    log,
    parallel_map,
    read_lines,
    require_dir,
    run_main,
    start,
    step,
    train_sentencepiece,
    write_lines,
    write_manifest,
)

TAG = "multi30k"
LANGS = ("de", "en", "fr")
URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
# split name in the corpus -> (fairseq split, published line count)
SPLITS = {"train": ("train", 29000), "val": ("valid", 1014), "test_2016_flickr": ("test", 1000)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default="de", help=f"source language, one of {', '.join(LANGS)} (default de)")
    p.add_argument("--tgt", default="en", help=f"target language, one of {', '.join(LANGS)} (default en)")
    p.add_argument("--raw-dir", type=Path, help="local directory with SPLIT.LANG.gz (or plain) files: no download")
    p.add_argument("--url", default=URL, help=f"where to download SPLIT.LANG.gz from (default {URL})")
    p.add_argument("--work-dir", type=Path, help="intermediate files (default work_dirs/data/multi30k_L1_L2)")
    p.add_argument("--dest-dir", type=Path, help="binarized output (default data-bin/multi30k_SRC_TGT)")
    p.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece pieces, joint (default 8000)")
    p.add_argument("--train-lines", type=int, default=0,
                   help="use only the first N training pairs (quick runs and tests; default 0 = all)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="accept line counts other than the published 29000/1014/1000 (other releases, subsets)")
    p.add_argument("--workers", type=int, default=2, help="processes for encoding and binarizing (default 2)")
    args = p.parse_args(argv)
    for name in ("src", "tgt"):
        if getattr(args, name) not in LANGS:
            raise RecipeError(f"--{name} {getattr(args, name)!r} (SRC/TGT): Multi30k has {', '.join(LANGS)}")
    if args.src == args.tgt:
        raise RecipeError(f"--src and --tgt are both {args.src!r} (SRC/TGT): choose two different languages")
    if args.vocab_size < 100:
        raise RecipeError(f"--vocab-size {args.vocab_size} (VOCAB_SIZE): at least 100")
    if args.train_lines < 0:
        raise RecipeError(f"--train-lines {args.train_lines} (TRAIN_LINES): 0 (all) or a positive count")
    pair = "_".join(sorted((args.src, args.tgt)))
    args.work_dir = args.work_dir or REPO / "work_dirs" / "data" / f"multi30k_{pair}"
    args.dest_dir = args.dest_dir or REPO / "data-bin" / f"multi30k_{args.src}_{args.tgt}"
    return args


def raw_files(args) -> dict[str, tuple[Path, Path]]:
    """{split: (source file, target file)}, from --raw-dir or downloaded, verified."""
    files = {}
    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "MULTI30K_DIR (--raw-dir)")
        for split in SPLITS:
            pair = []
            for lang in (args.src, args.tgt):
                gz, plain = root / f"{split}.{lang}.gz", root / f"{split}.{lang}"
                if not gz.is_file() and not plain.is_file():
                    raise RecipeError(f"MULTI30K_DIR={root}: missing {gz.name} (or {plain.name})")
                pair.append(gz if gz.is_file() else plain)
            files[split] = (pair[0], pair[1])
    else:
        for split in SPLITS:
            pair = [download(TAG, f"{args.url}/{split}.{lang}.gz", args.work_dir / "download" / f"{split}.{lang}.gz",
                             local="MULTI30K_DIR")
                    for lang in (args.src, args.tgt)]  # fmt: skip
            files[split] = (pair[0], pair[1])
    expected = {split: n for split, (_, n) in SPLITS.items()} if args.verify_counts else None
    counts = check_parallel(files, expected)
    log(TAG, "verified " + ", ".join(f"{split} {n} pairs" for split, n in counts.items()))
    return files


def main(argv=None):
    args = parse_args(argv)
    start(TAG, args.work_dir, args.dest_dir)
    files = raw_files(args)  # verified before anything is written (downloads aside)
    if args.train_lines and args.train_lines > len(read_lines(files["train"][0])):
        raise RecipeError(f"--train-lines {args.train_lines} (TRAIN_LINES): the training set is smaller")
    settings = {"corpus": "multi30k", "languages": sorted((args.src, args.tgt)), "vocab_size": args.vocab_size,
                "train_lines": args.train_lines}  # fmt: skip
    # the work directory serves both directions, the output one: its settings name the direction
    output_settings = {**settings, "direction": f"{args.src}-{args.tgt}"}
    check_output(args.dest_dir, output_settings)
    check_settings(args.work_dir, settings, ["spm"])
    langs = sorted((args.src, args.tgt))

    def text(split: str, lang: str) -> list[str]:
        src_file, tgt_file = files[split]
        lines = read_lines(src_file if lang == args.src else tgt_file)
        return lines[: args.train_lines] if split == "train" and args.train_lines else lines

    def segment(tmp: Path) -> None:
        for lang in langs:
            write_lines(tmp / f"spm_input.{lang}", text("train", lang))
        model = train_sentencepiece(TAG, [tmp / f"spm_input.{lang}" for lang in langs], tmp / "spm", args.vocab_size)
        for lang in langs:
            (tmp / f"spm_input.{lang}").unlink()
        encode = SentencePieceEncode(model)
        for split, (fairseq_split, _) in SPLITS.items():
            for lang in langs:
                write_lines(tmp / f"{fairseq_split}.{lang}", parallel_map(encode, text(split, lang), args.workers))
                if fairseq_split == "test":
                    write_lines(tmp / f"ref.test.{lang}", text(split, lang))

    spm_dir = step(TAG, "SentencePiece", args.work_dir / "spm", segment)

    def build(tmp: Path) -> None:
        prefixes = {split: spm_dir / split for split in ("train", "valid", "test")}
        binarize(TAG, args.src, args.tgt, prefixes, tmp, args.workers)
        shutil.copy(spm_dir / "spm.model", tmp / "spm.model")
        (tmp / "refs").mkdir()
        shutil.copy(spm_dir / f"ref.test.{args.tgt}", tmp / "refs" / f"test_2016_flickr.{args.tgt}")
        n_test = len(read_lines(spm_dir / f"ref.test.{args.tgt}"))
        write_manifest(tmp, {
            "dataset": "multi30k", "source_lang": args.src, "target_lang": args.tgt,
            "segmentation": "sentencepiece", "detokenizer": "none", "lowercase": False,
            "beam": 5, "lenpen": 1.0, "compound_split": False,
            "tests": [{"name": "test_2016_flickr", "split": "test", "start": 0, "end": n_test,
                       "reference": f"refs/test_2016_flickr.{args.tgt}"}],
            "averages": {}, "settings": output_settings,
        })  # fmt: skip

    step(TAG, f"binarize {args.src}->{args.tgt}", args.dest_dir, build)
    log(TAG, f"ready: {args.dest_dir}")


if __name__ == "__main__":
    run_main(TAG, main)
