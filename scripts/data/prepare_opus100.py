#!/usr/bin/env python
"""Prepare OPUS-100 (Zhang et al. 2020) as the ResiDual authors train it (paper section 4.4, appendix H.1;
released hydra_config/opus.yaml): one model for both directions of every English-centric pair, with
fairseq's own multilingual task ``translation_multi_simple_epoch`` (scripts/training/multilingual.py).

- languages: ``--langs all`` takes every pair that has dev and test sets: 94 of the corpus's 99 (an, dz,
  hy, mn and yo have training data only), so 188 directions (94 x 2), as the authors train;
- segmentation as in Zhang et al.'s scripts (github.com/bzhangGo/zero): one joint SentencePiece model
  (64k pieces, trained on a random sample of the training text), no other tokenisation;
- one shared dictionary of all the segmented training text (fairseq's own dictionary builder), then
  fairseq-preprocess per pair with that dictionary (``--srcdict``/``--tgtdict``): ``{split}.en-xx.{en,xx}``,
  the layout the task reads for both en->xx and xx->en. No language tags are written into the text: the
  task prepends the target language's token (``__xx__``) itself and adds those symbols to the dictionary;
- training pairs are kept as they are (no length filter: the task truncates over-long sources at 256
  positions and fairseq-train skips over-long targets); the validation set holds the first
  ``--valid-lines`` pairs of every dev set; every test set (2,000 sentences per pair) is kept whole, with
  its raw references per direction in ``refs/``;
- ``recipe.json`` names the task and its options (``multilingual``: languages, directions, language tokens,
  temperature sampling), one test entry per direction and the EX (en->xx), XE (xx->en) and ALL averages
  of ResiDual table 4 (the mean BLEU over the 94 from-English, the 94 to-English and all 188 directions).

    python -m scripts.data.prepare_opus100                                  # downloads the corpus (about 2.5 GB)
    python -m scripts.data.prepare_opus100 --raw-dir DIR --langs de,fr,zh   # DIR holds opus-100-corpus/
"""

import argparse
import shutil
from pathlib import Path

from scripts.data.data_common import (
    REPO,
    RecipeError,
    SentencePieceEncode,
    binarize,
    build_dictionary,
    check_output,
    check_parallel,
    check_settings,
    download,
    extract,
    log,
    map_file,
    read_lines,
    require_dir,
    run_main,
    start,
    step,
    train_sentencepiece,
    write_lines,
    write_manifest,
)

TAG = "opus100"
URL = "https://object.pouta.csc.fi/OPUS-100/v1.0/opus-100-corpus-v1.0.tar.gz"
# published: 99 English-centric pairs, 94 of them with dev and test sets of 2,000 pairs
N_PAIRS, N_EVAL_PAIRS, N_DEV_TEST = 99, 94, 2000
TASK = "translation_multi_simple_epoch"
# the authors' task options (hydra_config/opus.yaml, ../shared/REFERENCE_SETUPS.md), as recipe.json records them
MULTILINGUAL = {
    "encoder_langtok": "tgt", "decoder_langtok": False, "lang_tok_style": "multilingual",
    "sampling_method": "temperature", "sampling_temperature": 5.0, "truncate_source": True,
    "max_source_positions": 256, "max_target_positions": 256,
}  # fmt: skip
DEVIATIONS = [
    ("temperature T=5 from the first update: the authors raise T linearly from 1 to 5 over 5 warm-up epochs "
     "(--sampling-method linear of a fairseq fork; fairseq 0.12 has uniform, temperature, concat, RoundRobin)"),
    ("batches mix directions: the authors' one-language-per-batch option (--same-lang-per-batch) is not in "
     "fairseq 0.12"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw-dir", type=Path, help="local directory holding opus-100-corpus/: no download")
    p.add_argument("--url", default=URL, help=f"the corpus archive (default {URL})")
    p.add_argument("--langs", default="all",
                   help="comma-separated non-English languages, or all (default): every pair with dev and test sets")
    p.add_argument("--vocab-size", type=int, default=64000, help="joint SentencePiece pieces (default 64000)")
    p.add_argument("--sample", type=int, default=10_000_000,
                   help="lines sampled to train SentencePiece (default 10000000)")
    p.add_argument("--valid-lines", type=int, default=200,
                   help="dev pairs per pair in the validation set (default 200; 0 = all)")
    p.add_argument("--work-dir", type=Path, default=REPO / "work_dirs" / "data" / "opus100",
                   help="downloads and intermediate files (default work_dirs/data/opus100)")
    p.add_argument("--dest-dir", type=Path, default=REPO / "data-bin" / "opus100",
                   help="binarized output (default data-bin/opus100)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="accept a corpus with other than 99 pairs (94 with test sets) or dev/test sets of other "
                        "than 2000 lines")  # fmt: skip
    p.add_argument("--workers", type=int, default=8, help="processes for encoding and binarizing (default 8)")
    args = p.parse_args(argv)
    for name in ("vocab_size", "sample", "workers"):  # the recipe's variables; --sample has none
        if getattr(args, name) <= 0:
            variable = {"vocab_size": " (VOCAB_SIZE)", "workers": " (WORKERS)"}.get(name, "")
            raise RecipeError(f"--{name.replace('_', '-')} {getattr(args, name)}{variable}: must be > 0")
    if args.valid_lines < 0:
        raise RecipeError(f"--valid-lines {args.valid_lines} (VALID_LINES): must be >= 0")
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


def split_files(d: Path, lang: str) -> dict[str, tuple[Path, Path]]:
    """{split: (xx file, en file)} of one pair directory; a split with one side only is an error."""
    files = {}
    for split in ("train", "dev", "test"):
        pair = (d / f"opus.{d.name}-{split}.{lang}", d / f"opus.{d.name}-{split}.en")
        if all(p.is_file() for p in pair):
            files[split] = pair
        elif split == "train" or any(p.is_file() for p in pair):
            raise RecipeError(f"RAW_DIR: missing {next(p for p in pair if not p.is_file())}")
    return files


def raw_files(args) -> dict[str, dict[str, tuple[Path, Path]]]:
    """{language: {split: (xx file, en file)}} for the chosen languages, verified."""
    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "RAW_DIR (--raw-dir)")
    else:
        root = extract(TAG, download(TAG, args.url, args.work_dir / "download" / Path(args.url).name),
                       args.work_dir / "download" / "corpus")  # fmt: skip
    pairs = find_pairs(root)
    available = {lang: split_files(d, lang) for lang, d in pairs.items()}
    evaluable = sorted(lang for lang, f in available.items() if {"dev", "test"} <= set(f))
    if args.langs == "all":
        langs = evaluable
        if args.verify_counts and (len(pairs), len(langs)) != (N_PAIRS, N_EVAL_PAIRS):
            raise RecipeError(f"RAW_DIR={root}: {len(pairs)} pairs, {len(langs)} with dev and test sets; the "
                              f"published corpus has {N_PAIRS} and {N_EVAL_PAIRS} (VERIFY_COUNTS=0 accepts others)")  # fmt: skip
        skipped = sorted(set(pairs) - set(langs))
        if skipped:
            log(TAG, f"without dev/test sets, not trained (as the authors' 188 directions): {', '.join(skipped)}")
    else:
        langs = list(dict.fromkeys(x.strip() for x in args.langs.split(",") if x.strip()))
        unknown = [x for x in langs if x not in pairs]
        if unknown or not langs:
            raise RecipeError(f"--langs (LANGS): {', '.join(unknown) or 'empty'} not in the corpus; it has "
                              f"{', '.join(sorted(pairs))}")  # fmt: skip
        no_eval = [x for x in langs if x not in evaluable]
        if no_eval:
            raise RecipeError(f"--langs (LANGS): {', '.join(no_eval)} without dev/test sets in the corpus (the task "
                              f"validates every direction); with both: {', '.join(evaluable)}")  # fmt: skip
        langs = sorted(langs)
    expected = {s: N_DEV_TEST for s in ("dev", "test")} if args.verify_counts else None
    for lang in langs:
        check_parallel({f"{lang}-en {s}": f for s, f in available[lang].items()},
                       {f"{lang}-en {s}": n for s, n in expected.items()} if expected else None)  # fmt: skip
    log(TAG, f"verified {len(langs)} pairs: {2 * len(langs)} directions")
    return {lang: available[lang] for lang in langs}


def multilingual_block(langs: list[str]) -> dict:
    """recipe.json's ``multilingual`` block: ``langs`` fixes the language tokens' ids (en first, then the
    others sorted), ``lang_pairs`` every direction, en->xx and xx->en in turn."""
    return {"langs": ["en", *langs], "lang_pairs": [p for x in langs for p in (f"en-{x}", f"{x}-en")],
            **MULTILINGUAL}  # fmt: skip


def main(argv=None):
    args = parse_args(argv)
    start(TAG, args.work_dir, args.dest_dir)
    files = raw_files(args)
    langs = sorted(files)
    settings = {"corpus": "opus100", "task": TASK, "langs": langs, "vocab_size": args.vocab_size,
                "sample": args.sample, "valid_lines": args.valid_lines}  # fmt: skip
    check_output(args.dest_dir, settings)
    check_settings(args.work_dir, settings, ["spm", "text"])

    def segment(tmp: Path) -> None:
        inputs = [path for lang in langs for path in files[lang]["train"]]
        train_sentencepiece(TAG, inputs, tmp / "spm", args.vocab_size, character_coverage=0.9995,
                            input_sentence_size=args.sample)  # fmt: skip

    model = step(TAG, "SentencePiece", args.work_dir / "spm", segment) / "spm.model"

    def encode(lang: str):
        def build(tmp: Path) -> None:
            for split, (xx, en) in files[lang].items():
                name = {"train": "train", "dev": "valid", "test": "test"}[split]
                for side, path in ((lang, xx), ("en", en)):
                    out = tmp / f"{name}.{side}"
                    map_file(SentencePieceEncode(model), path, out, args.workers)
                    if split == "dev" and args.valid_lines:
                        write_lines(out, read_lines(out)[: args.valid_lines])
        return build

    text = args.work_dir / "text"
    for lang in langs:  # one step per pair: an interrupted run resumes at the next pair
        step(TAG, f"SentencePiece-encode en-{lang}", text / lang, encode(lang))

    def build(tmp: Path) -> None:
        size = build_dictionary(TAG, [text / x / f"train.{side}" for x in langs for side in (x, "en")],
                                tmp / "dict.txt", args.workers)  # fmt: skip
        log(TAG, f"dictionary: {size} types (the task adds {len(langs) + 1} language tokens)")
        for lang in langs:
            binarize(TAG, "en", lang, {s: text / lang / s for s in ("train", "valid", "test")}, tmp, args.workers,
                     dictionary=tmp / "dict.txt")  # fmt: skip
        tests, averages = [], {"EX (en->xx)": [], "XE (xx->en)": []}
        for lang in langs:
            xx, en = files[lang]["test"]
            for src, tgt, ref in (("en", lang, xx), (lang, "en", en)):
                lines = read_lines(ref)
                write_lines(tmp / "refs" / f"{src}-{tgt}.{tgt}", lines)
                tests.append({"name": f"{src}-{tgt}", "split": "test", "source_lang": src, "target_lang": tgt,
                              "start": 0, "end": len(lines), "reference": f"refs/{src}-{tgt}.{tgt}"})  # fmt: skip
                averages["EX (en->xx)" if src == "en" else "XE (xx->en)"].append(f"{src}-{tgt}")
        averages["ALL"] = averages["EX (en->xx)"] + averages["XE (xx->en)"]
        shutil.copy(model, tmp / "spm.model")
        write_manifest(tmp, {
            "dataset": "opus100", "task": TASK, "source_lang": "multi", "target_lang": "multi",
            "multilingual": multilingual_block(langs), "deviations": DEVIATIONS,
            "segmentation": "sentencepiece", "detokenizer": "none", "lowercase": False,
            "beam": 4, "lenpen": 0.6, "compound_split": False, "joined_dictionary": True,
            "tests": tests, "averages": averages, "settings": settings,
        })  # fmt: skip

    step(TAG, f"dictionary and fairseq-preprocess of {len(langs)} pairs", args.dest_dir, build)
    log(TAG, f"ready: {args.dest_dir} ({2 * len(langs)} directions)")


if __name__ == "__main__":
    run_main(TAG, main)
