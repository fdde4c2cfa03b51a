#!/usr/bin/env python
"""Prepare OPUS-100 (Zhang et al. 2020) as the ResiDual paper trains it (section 4.4, appendix H.1): one model
for both directions of every English-centric pair (about 110M training pairs with all 99 pairs).

As in Zhang et al.'s scripts (github.com/bzhangGo/zero), text is segmented by one joint SentencePiece model
(64k pieces, trained on a random sample of the training text) with no other tokenisation, and the target
language is given by a token ``<2xx>`` before the source sentence (xx -> en gets ``<2en>``, en -> xx gets
``<2xx>``). Training pairs longer than ``--max-len`` pieces are dropped (fairseq refuses over-long
examples); the validation set holds the first ``--valid-lines`` pairs of every dev set and direction; every
test set (2,000 sentences per pair and direction) is kept whole, in one binarized split with its ranges in
``recipe.json``, so the evaluation recipe reports each direction and the EX (en->xx), XE (xx->en) and ALL
averages of ResiDual table 4.

    python scripts/data/prepare_opus100.py                                  # downloads the corpus (about 2.5 GB)
    python scripts/data/prepare_opus100.py --raw-dir DIR --langs de,fr,zh   # DIR holds opus-100-corpus/
"""

import argparse
import json
import shutil
from pathlib import Path

from data_common import (
    REPO,
    Pipeline,
    Prefix,
    RecipeError,
    SentencePieceEncode,
    binarize,
    check_output,
    check_parallel,
    check_settings,
    clean_files,
    concatenate,
    download,
    extract,
    log,
    map_file,
    read_lines,
    require_dir,
    run_main,
    step,
    train_sentencepiece,
    write_lines,
    write_manifest,
)

TAG = "opus100"
URL = "https://object.pouta.csc.fi/OPUS-100/v1.0/opus-100-corpus-v1.0.tar.gz"
N_PAIRS, N_DEV_TEST = 99, 2000  # published: 99 supervised pairs, dev and test sets of 2,000 pairs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw-dir", type=Path, help="local directory holding opus-100-corpus/: no download")
    p.add_argument("--url", default=URL, help=f"the corpus archive (default {URL})")
    p.add_argument("--langs", default="all", help="comma-separated non-English languages, or all (default)")
    p.add_argument("--vocab-size", type=int, default=64000, help="joint SentencePiece pieces (default 64000)")
    p.add_argument("--sample", type=int, default=10_000_000,
                   help="lines sampled to train SentencePiece (default 10000000)")
    p.add_argument("--max-len", type=int, default=256, help="drop training pairs longer than this (default 256)")
    p.add_argument("--valid-lines", type=int, default=200,
                   help="dev pairs per pair and direction in the validation set (default 200; 0 = all)")
    p.add_argument("--work-dir", type=Path, default=REPO / "work_dirs" / "data" / "opus100",
                   help="downloads and intermediate files (default work_dirs/data/opus100)")
    p.add_argument("--dest-dir", type=Path, default=REPO / "data-bin" / "opus100",
                   help="binarized output (default data-bin/opus100)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="accept a corpus with other than 99 pairs or dev/test sets of other than 2000 lines")
    p.add_argument("--workers", type=int, default=8, help="processes for encoding and binarizing (default 8)")
    args = p.parse_args(argv)
    for name in ("vocab_size", "sample", "max_len"):
        if getattr(args, name) <= 0:
            raise RecipeError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    return args


def find_pairs(root: Path) -> dict[str, Path]:
    """{language: pair directory} of the English-centric pairs under .../supervised/."""
    supervised = [p for p in root.rglob("supervised") if p.is_dir()]
    if len(supervised) != 1:
        raise RecipeError(f"RAW_DIR={root}: expected one opus-100-corpus/v1.0/supervised directory, "
                          f"found {len(supervised)}")  # fmt: skip
    pairs = {}
    for d in sorted(supervised[0].iterdir()):
        langs = d.name.split("-")
        if d.is_dir() and len(langs) == 2 and "en" in langs:
            pairs[langs[0] if langs[1] == "en" else langs[1]] = d
    if not pairs:
        raise RecipeError(f"RAW_DIR={root}: no en-xx pair directories in {supervised[0]}")
    return pairs


def raw_files(args) -> dict[str, dict[str, tuple[Path, Path]]]:
    """{language: {split: (xx file, en file)}} for the chosen languages, verified."""
    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "RAW_DIR (--raw-dir)")
    else:
        root = extract(TAG, download(TAG, args.url, args.work_dir / "download" / Path(args.url).name),
                       args.work_dir / "download" / "corpus")  # fmt: skip
    pairs = find_pairs(root)
    if args.langs == "all":
        langs = sorted(pairs)
        if args.verify_counts and len(langs) != N_PAIRS:
            raise RecipeError(f"RAW_DIR={root}: {len(langs)} pairs, the published corpus has {N_PAIRS} "
                              "(VERIFY_COUNTS=0 accepts others)")  # fmt: skip
    else:
        langs = [x.strip() for x in args.langs.split(",") if x.strip()]
        unknown = [x for x in langs if x not in pairs]
        if unknown or not langs:
            raise RecipeError(f"--langs (LANGS): {', '.join(unknown) or 'empty'} not in the corpus; it has "
                              f"{', '.join(sorted(pairs))}")  # fmt: skip
    files: dict[str, dict[str, tuple[Path, Path]]] = {}
    for lang in langs:
        d = pairs[lang]
        files[lang] = {}
        for split in ("train", "dev", "test"):
            pair = (d / f"opus.{d.name}-{split}.{lang}", d / f"opus.{d.name}-{split}.en")
            if all(p.is_file() for p in pair):
                files[lang][split] = pair
            elif split == "train" or any(p.is_file() for p in pair):
                raise RecipeError(f"RAW_DIR: missing {next(p for p in pair if not p.is_file())}")
        expected = {s: N_DEV_TEST for s in ("dev", "test")} if args.verify_counts else None
        check_parallel(files[lang], expected)
    with_test = sum("test" in f for f in files.values())
    log(TAG, f"verified {len(langs)} pairs ({with_test} with test sets)")
    return files


def main(argv=None):
    args = parse_args(argv)
    files = raw_files(args)
    langs = sorted(files)
    settings = {"corpus": "opus100", "langs": langs, "vocab_size": args.vocab_size, "sample": args.sample,
                "max_len": args.max_len, "valid_lines": args.valid_lines}  # fmt: skip
    check_output(args.dest_dir, settings)
    check_settings(args.work_dir, settings, ["spm", "text"])
    tags = [f"<2{x}>" for x in ["en", *langs]]

    def segment(tmp: Path) -> None:
        inputs = [path for lang in langs for path in files[lang]["train"]]
        train_sentencepiece(TAG, inputs, tmp / "spm", args.vocab_size, tags, character_coverage=0.9995,
                            input_sentence_size=args.sample)  # fmt: skip

    spm_dir = step(TAG, "SentencePiece", args.work_dir / "spm", segment)
    model = spm_dir / "spm.model"

    def assemble(tmp: Path) -> None:
        parts: dict[str, list[Path]] = {"train.src": [], "train.tgt": [], "valid.src": [], "valid.tgt": [],
                                        "test.src": [], "test.tgt": []}  # fmt: skip
        tests = []
        for lang in langs:
            log(TAG, f"encoding en-{lang}")
            for split, (xx, en) in files[lang].items():
                for src_lang, tgt_lang, src, tgt in ((lang, "en", xx, en), ("en", lang, en, xx)):
                    stem = tmp / "parts" / f"{split}.{src_lang}-{tgt_lang}"
                    map_file(Pipeline(SentencePieceEncode(model), Prefix(f"<2{tgt_lang}> ")), src, Path(f"{stem}.src"), args.workers)
                    map_file(SentencePieceEncode(model), tgt, Path(f"{stem}.tgt"), args.workers)
                    if split == "train":
                        clean_files(Path(f"{stem}.src"), Path(f"{stem}.tgt"), Path(f"{stem}.clean.src"),
                                    Path(f"{stem}.clean.tgt"), 1, args.max_len, float("inf"))  # fmt: skip
                        stem = Path(f"{stem}.clean")
                    if split == "dev" and args.valid_lines:
                        for side in ("src", "tgt"):
                            write_lines(Path(f"{stem}.{side}"), read_lines(Path(f"{stem}.{side}"))[: args.valid_lines])
                    name = {"train": "train", "dev": "valid", "test": "test"}[split]
                    parts[f"{name}.src"].append(Path(f"{stem}.src"))
                    parts[f"{name}.tgt"].append(Path(f"{stem}.tgt"))
                    if split == "test":
                        tests.append((f"{src_lang}-{tgt_lang}", tgt_lang, tgt))
        for name, paths in parts.items():
            concatenate(paths, tmp / name)
        refs, start, entries = tmp / "refs", 0, []
        for name, tgt_lang, tgt in tests:
            lines = read_lines(tgt)
            write_lines(refs / f"{name}.{tgt_lang}", lines)
            entries.append({"name": name, "split": "test", "start": start, "end": start + len(lines),
                            "reference": f"refs/{name}.{tgt_lang}", "target_lang": tgt_lang})  # fmt: skip
            start += len(lines)
        (tmp / "tests.json").write_text(json.dumps(entries), encoding="utf-8")
        for path in (tmp / "parts").iterdir():
            path.unlink()
        (tmp / "parts").rmdir()

    text_dir = step(TAG, "encode, tag and assemble", args.work_dir / "text", assemble)

    def build(tmp: Path) -> None:
        binarize(TAG, "src", "tgt", {s: text_dir / s for s in ("train", "valid", "test")}, tmp, args.workers)
        shutil.copytree(text_dir / "refs", tmp / "refs")
        shutil.copy(model, tmp / "spm.model")
        entries = json.loads((text_dir / "tests.json").read_text(encoding="utf-8"))
        ex = [e["name"] for e in entries if e["name"].startswith("en-")]
        xe = [e["name"] for e in entries if e["name"].endswith("-en")]
        write_manifest(tmp, {
            "dataset": "opus100", "source_lang": "src", "target_lang": "tgt",
            "segmentation": "sentencepiece", "detokenizer": "none", "lowercase": False,
            "beam": 4, "lenpen": 0.6, "compound_split": False, "tests": entries,
            "averages": {"EX (en->xx)": ex, "XE (xx->en)": xe, "ALL": ex + xe}, "settings": settings,
        })  # fmt: skip

    step(TAG, "binarize", args.dest_dir, build)
    log(TAG, f"ready: {args.dest_dir}")


if __name__ == "__main__":
    run_main(TAG, main)

