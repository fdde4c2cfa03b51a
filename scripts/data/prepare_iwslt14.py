#!/usr/bin/env python
"""Prepare IWSLT-14 German-English as fairseq's examples/translation/prepare-iwslt14.sh does, without Perl.

The ResiDual paper trains EN->DE on it (appendix H.1), Crossformer DE->EN (section 4.1); both use this script:

- train: ``train.tags.de-en.{de,en}`` without the <url>/<talkid>/<keywords> lines and the <title>/<description>
  tags, Moses-tokenised (sacremoses), pairs cleaned as clean-corpus-n.perl -ratio 1.5 (1 to 175 words),
  lowercased; every 23rd pair goes to valid (160k train, 7k valid);
- test: the <seg> texts of IWSLT14.TED.dev2010, IWSLT14.TEDX.dev2012 and IWSLT14.TED.tst2010-2012
  (6,750 pairs), with ’ -> ', tokenised and lowercased the same way;
- joint BPE with 10,000 merges (subword-nmt) learnt on train de + en.

Both directions share every step but the last: ``--src``/``--tgt`` choose the binarized direction, written to
``data-bin/iwslt14_SRC_TGT`` with the raw references (lowercased, untokenised) for sacrebleu.

    python -m scripts.data.prepare_iwslt14 --src en --tgt de                 # downloads de-en.tgz
    python -m scripts.data.prepare_iwslt14 --src de --tgt en --raw-dir DIR   # DIR holds de-en/ (or its files)
"""

import argparse
import re
from pathlib import Path

from scripts.data.data_common import (
    REPO,
    ApplyBPE,
    MosesTokenize,
    RecipeError,
    binarize,
    check_output,
    check_parallel,
    check_settings,
    clean_corpus,
    download,
    extract,
    find_file,
    learn_bpe,
    log,
    parallel_map,
    read_lines,
    read_segments,
    replace_curly_apostrophe,
    require_dir,
    run_main,
    split_language_pair,
    start,
    step,
    write_lines,
    write_manifest,
)

TAG = "iwslt14"
URL = "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"  # the archive prepare-iwslt14.sh fetches
TEST_SETS = {  # file stem -> published number of segments (6,750 in all)
    "IWSLT14.TED.dev2010": 887,
    "IWSLT14.TEDX.dev2012": 1165,
    "IWSLT14.TED.tst2010": 1565,
    "IWSLT14.TED.tst2011": 1433,
    "IWSLT14.TED.tst2012": 1700,
}
PAIRS = ("de-en", "en-de")
_DROP = re.compile(r"<url>|<talkid>|<keywords>")
_TAGS = re.compile(r"</?(title|description)>")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default="de", help="source language: de or en (default de)")
    p.add_argument("--tgt", default="en", help="target language: en or de (default en)")
    p.add_argument("--raw-dir", type=Path, help="local directory with the de-en.tgz contents: no download")
    p.add_argument("--url", default=URL, help=f"the archive to download (default {URL})")
    p.add_argument("--work-dir", type=Path, default=REPO / "work_dirs" / "data" / "iwslt14",
                   help="intermediate files, shared by both directions (default work_dirs/data/iwslt14)")
    p.add_argument("--dest-dir", type=Path, help="binarized output (default data-bin/iwslt14_SRC_TGT)")
    p.add_argument("--bpe-merges", type=int, default=10000, help="joint BPE merges (default 10000)")
    p.add_argument("--no-joined-dictionary", dest="joined_dictionary", action="store_false",
                   help="one dictionary per language, as fairseq's IWSLT'14 example binarizes it (Crossformer's "
                        "Transformer-Base set-up with separate source and target embeddings); default: one joined "
                        "dictionary (--share-all-embeddings)")  # fmt: skip
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="accept test sets whose segment counts differ from the published ones")
    p.add_argument("--workers", type=int, default=4, help="processes for tokenising/BPE/binarizing (default 4)")
    args = p.parse_args(argv)
    split_language_pair(f"{args.src}-{args.tgt}", PAIRS, "SRC-TGT (--src/--tgt)")
    args.dest_dir = args.dest_dir or REPO / "data-bin" / f"iwslt14_{args.src}_{args.tgt}"
    return args


def raw_files(args) -> dict[str, tuple[Path, Path]]:
    """{'train': (de, en), test stem: (de xml, en xml)}, verified."""
    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "RAW_DIR (--raw-dir)")
    else:
        archive = download(TAG, args.url, args.work_dir / "download" / "de-en.tgz")
        root = extract(TAG, archive, args.work_dir / "download" / "de-en")
    files = {"train": (find_file(root, "train.tags.de-en.de", "RAW_DIR"), find_file(root, "train.tags.de-en.en", "RAW_DIR"))}
    for stem in TEST_SETS:
        files[stem] = (find_file(root, f"{stem}.de-en.de.xml", "RAW_DIR"), find_file(root, f"{stem}.de-en.en.xml", "RAW_DIR"))
    check_parallel({"train": files["train"]})
    for stem, (de, en) in files.items():
        if stem == "train":
            continue
        n_de, n_en = len(read_segments(de)), len(read_segments(en))
        if n_de != n_en:
            raise RecipeError(f"{stem}: {n_de} German but {n_en} English segments: truncated or mismatched files")
        if args.verify_counts and n_de != TEST_SETS[stem]:
            raise RecipeError(f"{stem}: {n_de} segments, the published set has {TEST_SETS[stem]} "
                              "(VERIFY_COUNTS=0 accepts other counts)")  # fmt: skip
    log(TAG, f"verified {len(files)} file pairs in {root}")
    return files


def train_text(path: Path) -> list[str]:
    # prepare-iwslt14.sh: grep -v '<url>' '<talkid>' '<keywords>', then sed away <title> and <description>
    return [_TAGS.sub("", line) for line in read_lines(path) if not _DROP.search(line)]


def main(argv=None):
    args = parse_args(argv)
    start(TAG, args.work_dir, args.dest_dir)
    files = raw_files(args)
    settings = {"corpus": "iwslt14", "bpe_merges": args.bpe_merges}
    # the work directory serves both directions, the output one direction and one dictionary layout
    output_settings = {**settings, "direction": f"{args.src}-{args.tgt}", "joined_dictionary": args.joined_dictionary}
    check_output(args.dest_dir, output_settings)
    check_settings(args.work_dir, settings, ["tok", "bpe"])
    langs = ("de", "en")

    def tokenize(tmp: Path) -> None:
        tok = {lang: parallel_map(MosesTokenize(lang), train_text(files["train"][i]), args.workers)
               for i, lang in enumerate(langs)}  # fmt: skip
        de, en = clean_corpus(tok["de"], tok["en"], 1, 175, 1.5)
        log(TAG, f"train: {len(de)} of {len(tok['de'])} pairs kept by cleaning")
        for lang, lines in zip(langs, (de, en), strict=True):
            lines = [line.lower() for line in lines]
            write_lines(tmp / f"valid.{lang}", lines[22::23])  # awk 'NR%23 == 0'
            write_lines(tmp / f"train.{lang}", [x for i, x in enumerate(lines) if (i + 1) % 23 != 0])
        for i, lang in enumerate(langs):
            raw = [replace_curly_apostrophe(s) for stem in TEST_SETS for s in read_segments(files[stem][i])]
            write_lines(tmp / f"ref.test.{lang}", [line.lower() for line in raw])
            write_lines(tmp / f"test.{lang}", parallel_map(MosesTokenize(lang, lowercase=True), raw, args.workers))

    tok_dir = step(TAG, "tokenise and clean", args.work_dir / "tok", tokenize)

    def apply_bpe(tmp: Path) -> None:
        learn_bpe(TAG, [tok_dir / "train.de", tok_dir / "train.en"], args.bpe_merges, tmp / "code")
        for split in ("train", "valid", "test"):
            for lang in langs:
                write_lines(tmp / f"{split}.{lang}",
                            parallel_map(ApplyBPE(tmp / "code"), read_lines(tok_dir / f"{split}.{lang}"), args.workers))  # fmt: skip

    bpe_dir = step(TAG, f"joint BPE ({args.bpe_merges} merges)", args.work_dir / "bpe", apply_bpe)

    def build(tmp: Path) -> None:
        binarize(TAG, args.src, args.tgt, {s: bpe_dir / s for s in ("train", "valid", "test")}, tmp, args.workers,
                 joined=args.joined_dictionary)  # fmt: skip
        (tmp / "refs").mkdir()
        refs = read_lines(tok_dir / f"ref.test.{args.tgt}")
        write_lines(tmp / "refs" / f"test.{args.tgt}", refs)
        (tmp / "code").write_bytes((bpe_dir / "code").read_bytes())
        write_manifest(tmp, {
            "dataset": "iwslt14", "source_lang": args.src, "target_lang": args.tgt,
            "segmentation": "bpe", "detokenizer": "moses", "lowercase": True,
            "beam": 5, "lenpen": 1.0, "compound_split": False, "joined_dictionary": args.joined_dictionary,
            "tests": [{"name": "iwslt14_test", "split": "test", "start": 0, "end": len(refs),
                       "reference": f"refs/test.{args.tgt}"}],
            "averages": {}, "settings": output_settings,
        })  # fmt: skip

    step(TAG, f"binarize {args.src}->{args.tgt}", args.dest_dir, build)
    log(TAG, f"ready: {args.dest_dir}")


if __name__ == "__main__":
    run_main(TAG, main)
