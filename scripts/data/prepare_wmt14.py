#!/usr/bin/env python
"""Prepare WMT14 English-German (4.5M pairs) or English-French (36M pairs) for fairseq, as fairseq's
examples/translation/prepare-wmt14en2de.sh (--icml17) and prepare-wmt14en2fr.sh do, without Perl.

- training corpora: En-De: Europarl v7, Common Crawl, News Commentary v9 (the 4.5M pairs of Vaswani et al.);
  En-Fr: those three plus UN (undoc 2000) and Gigaword (Gehring et al.'s 36M after cleaning);
  normalize-punctuation, remove-non-printing-char and Moses tokenisation with -a (sacremoses), joint BPE
  (subword-nmt; 32k merges for En-De, 40k for En-Fr, Crossformer A.1), then clean-corpus-n -ratio 1.5
  (1 to 250 tokens) on the BPE text, as the fairseq scripts order it;
- valid: newstest2013 (Vaswani et al.; ResiDual follows Takase & Kiyono, who use it too);
- test: newstest2014 (the full 3,003-sentence release), and for En-De newstest2010-2016 for the
  multi-year average of ResiDual tables 6-7 (``--years``). The test sets are sacrebleu's own: its
  definitions (``sacrebleu.dataset.DATASETS``: archives, md5 sums, file names per language pair) and its
  reader of WMT's SGM format; downloaded, they are sacrebleu's processed text (``get_source_file`` /
  ``get_reference_files``, cached in ~/.sacrebleu or $SACREBLEU); from ``--raw-dir``, the SGM files sacrebleu
  names are found there and read with sacrebleu's SGM reader (data_common.read_segments).

    python -m scripts.data.prepare_wmt14 --src en --tgt de                      # downloads (about 1.5 GB)
    python -m scripts.data.prepare_wmt14 --src en --tgt fr --raw-dir DIR        # DIR holds the unpacked archives

Intermediate files are shared by both directions of a pair (``work_dirs/data/wmt14_en_de``); the binarized
direction goes to ``data-bin/wmt14_SRC_TGT`` with the raw references for sacrebleu and ``recipe.json``.
"""

import argparse
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from scripts.data.data_common import (
    REPO,
    ApplyBPE,
    MosesTokenize,
    NormalizeForTraining,
    Pipeline,
    RecipeError,
    binarize,
    check_output,
    check_parallel,
    check_settings,
    clean_files,
    concatenate,
    count_lines,
    download,
    extract,
    find_file,
    learn_bpe,
    log,
    map_file,
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

TAG = "wmt14"


@dataclass(frozen=True)
class Corpus:
    url: str
    stem: str  # files are STEM.LANG (or STEM.LANG.gz) somewhere in the unpacked archive
    lines: int  # published line count


CORPORA = {
    "de": [
        Corpus("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", "europarl-v7.de-en", 1920209),
        Corpus("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "commoncrawl.de-en", 2399123),
        Corpus("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", "news-commentary-v9.de-en", 201288),
    ],
    "fr": [
        Corpus("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", "europarl-v7.fr-en", 2007723),
        Corpus("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "commoncrawl.fr-en", 3244152),
        Corpus("https://www.statmt.org/wmt13/training-parallel-un.tgz", "undoc.2000.fr-en", 12886831),
        Corpus("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", "news-commentary-v9.fr-en", 183251),
        Corpus("https://www.statmt.org/wmt10/training-giga-fren.tar", "giga-fren.release2.fixed", 22520376),
    ],
}
# year -> (sacrebleu test set, published number of sentences)
TESTS = {2010: ("wmt10", 2489), 2011: ("wmt11", 3003), 2012: ("wmt12", 3003), 2013: ("wmt13", 3000),
         2014: ("wmt14/full", 3003), 2015: ("wmt15", 2169), 2016: ("wmt16", 2999)}  # fmt: skip
PAIRS = ("en-de", "de-en", "en-fr", "fr-en")
DEFAULT_YEARS = {"de": "2010-2016", "fr": "2014"}
DEFAULT_MERGES = {"de": 32000, "fr": 40000}
TEST_YEAR, VALID_YEAR = 2014, 2013


def parse_years(text: str, other: str) -> list[int]:
    years: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d{4})(?:\s*-\s*(\d{4}))?\s*", part)
        if not match:
            raise RecipeError(f"--years {text!r} (YEARS): expected e.g. 2010-2016 or 2012,2014")
        years.update(range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1))
    available = [y for y in TESTS if f"en-{other}" in test_metadata(y)]
    bad = sorted(years - set(available))
    if bad:
        raise RecipeError(f"--years (YEARS): no newstest{bad[0]} for en-{other}; available: {available}")
    if TEST_YEAR not in years:
        raise RecipeError(f"--years (YEARS) must include {TEST_YEAR}, the test set")
    return sorted(years)


def test_metadata(year: int) -> dict:
    from sacrebleu.dataset import DATASETS

    return DATASETS[TESTS[year][0]].langpairs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default="en", help="source language: en, de or fr (default en)")
    p.add_argument("--tgt", default="de", help="target language (default de); pairs: " + ", ".join(PAIRS))
    p.add_argument("--raw-dir", type=Path, help="local directory with the unpacked corpora and test SGM files")
    p.add_argument("--download-dir", type=Path, default=REPO / "work_dirs" / "data" / "wmt14_download",
                   help="where archives are downloaded and unpacked (default work_dirs/data/wmt14_download)")
    p.add_argument("--work-dir", type=Path, help="intermediate files (default work_dirs/data/wmt14_en_XX)")
    p.add_argument("--dest-dir", type=Path, help="binarized output (default data-bin/wmt14_SRC_TGT)")
    p.add_argument("--bpe-merges", type=int, help="joint BPE merges (default 32000 for En-De, 40000 for En-Fr)")
    p.add_argument("--years", help="newstest years to prepare as test sets (default 2010-2016 En-De, 2014 En-Fr)")
    p.add_argument("--no-verify-counts", dest="verify_counts", action="store_false",
                   help="accept corpora whose line counts differ from the published ones")
    p.add_argument("--workers", type=int, default=8, help="processes for tokenising/BPE/binarizing (default 8)")
    args = p.parse_args(argv)
    src, tgt = split_language_pair(f"{args.src}-{args.tgt}", PAIRS, "SRC-TGT (--src/--tgt)")
    args.other = tgt if src == "en" else src
    args.langs = ("en", args.other)
    args.years = parse_years(args.years or DEFAULT_YEARS[args.other], args.other)
    args.fetch_years = sorted({*args.years, VALID_YEAR})  # the test sets and the validation set
    args.bpe_merges = args.bpe_merges or DEFAULT_MERGES[args.other]
    args.work_dir = args.work_dir or REPO / "work_dirs" / "data" / f"wmt14_en_{args.other}"
    args.dest_dir = args.dest_dir or REPO / "data-bin" / f"wmt14_{args.src}_{args.tgt}"
    return args


def find_corpus_file(root: Path, stem: str, lang: str) -> Path:
    for name in (f"{stem}.{lang}", f"{stem}.{lang}.gz"):
        if list(root.rglob(name)):
            return find_file(root, name, "RAW_DIR")
    raise RecipeError(f"RAW_DIR={root}: missing {stem}.{lang} (or .gz)")


def find_test_file(root: Path, year: int, path_in_archive: str, lang: str) -> Path:
    """The SGM file sacrebleu's metadata names (at that path under ``root``, else anywhere under it), else a
    plain ``newstestYEAR.LANG``."""
    if (root / path_in_archive).is_file():
        return root / path_in_archive
    for name in (Path(path_in_archive).name, f"newstest{year}.{lang}"):
        if list(root.rglob(name)):
            return find_file(root, name, "RAW_DIR")
    raise RecipeError(f"RAW_DIR={root}: missing {Path(path_in_archive).name} (or newstest{year}.{lang})")


def sacrebleu_test_files(year: int, other: str) -> dict[str, Path]:
    """{en: source file, other: reference file} of newstestYEAR as sacrebleu downloads (md5-checked) and
    converts it to text itself, in its cache (~/.sacrebleu, or $SACREBLEU)."""
    from sacrebleu.dataset import DATASETS

    dataset = DATASETS[TESTS[year][0]]
    try:
        source = dataset.get_source_file(f"en-{other}")
        (reference,) = dataset.get_reference_files(f"en-{other}")
    except (OSError, ValueError, SystemExit) as err:  # network or archive problems; a wrong md5 exits (logged)
        raise RecipeError(f"sacrebleu could not fetch {dataset.name} ({err or 'see its log above'}); download {', '.join(dataset.data)} by "
                          "hand and pass its directory as RAW_DIR") from err  # fmt: skip
    return {"en": Path(source), other: Path(reference)}


def test_lines(path: Path) -> list[str]:
    """Segments of a test file: SGM through sacrebleu's reader, text (sacrebleu's own conversion or a plain
    ``newstestYEAR.LANG``) with sacrebleu's whitespace clean-up."""
    if path.suffix == ".sgm":
        return read_segments(path)
    return [" ".join(line.split()) for line in read_lines(path)]


def raw_files(args) -> tuple[dict[str, tuple[Path, Path]], dict[int, dict[str, Path]]]:
    corpora = CORPORA[args.other]
    if args.raw_dir is not None:
        root = require_dir(args.raw_dir, "RAW_DIR (--raw-dir)")
    else:
        root = args.download_dir
        for url in dict.fromkeys(c.url for c in corpora):
            name = url.rsplit("/", 1)[1]
            extract(TAG, download(TAG, url, root / "archives" / name), root / name.split(".")[0])
    train = {c.stem: tuple(find_corpus_file(root, c.stem, lang) for lang in args.langs) for c in corpora}
    tests = {}
    for year in args.fetch_years:
        if args.raw_dir is None:
            tests[year] = sacrebleu_test_files(year, args.other)
        else:
            files = test_metadata(year)[f"en-{args.other}"]
            tests[year] = {lang: find_test_file(root, year, files[i], lang) for i, lang in enumerate(args.langs)}
    log(TAG, "counting lines of the training corpora")
    expected = {c.stem: c.lines for c in corpora} if args.verify_counts else None
    counts = check_parallel(train, expected)  # type: ignore[arg-type]
    for year, files in tests.items():
        n = {lang: len(test_lines(path)) for lang, path in files.items()}
        if len(set(n.values())) != 1:
            raise RecipeError(f"newstest{year}: {n} segments: truncated or mismatched files")
        if args.verify_counts and n["en"] != TESTS[year][1]:
            raise RecipeError(f"newstest{year}: {n['en']} segments, the published set has {TESTS[year][1]} "
                              "(VERIFY_COUNTS=0 accepts other counts)")  # fmt: skip
    log(TAG, f"verified {sum(counts.values())} training pairs and newstest {', '.join(map(str, args.fetch_years))}")
    return train, tests  # type: ignore[return-value]


def main(argv=None):
    args = parse_args(argv)
    start(TAG, args.work_dir, args.dest_dir)
    train, tests = raw_files(args)
    settings = {"corpus": f"wmt14_en_{args.other}", "bpe_merges": args.bpe_merges, "years": args.years}
    # the work directory serves both directions, the output one: its settings name the direction
    output_settings = {**settings, "direction": f"{args.src}-{args.tgt}"}
    check_output(args.dest_dir, output_settings)
    check_settings(args.work_dir, settings, ["tok", "bpe"])
    langs = args.langs
    names = [f"newstest{y}" for y in args.fetch_years]

    def tokenize(tmp: Path) -> None:
        for lang in langs:
            parts = []
            for i, (stem, files) in enumerate(train.items()):
                log(TAG, f"normalising and tokenising {stem}.{lang}")
                pipeline = Pipeline(NormalizeForTraining(lang), MosesTokenize(lang, aggressive=True))
                parts.append(tmp / f"part{i}.{lang}")
                map_file(pipeline, files[langs.index(lang)], parts[-1], args.workers)
            concatenate(parts, tmp / f"train.{lang}")
            for part in parts:
                part.unlink()
        for year, files in tests.items():
            for lang in langs:
                raw = test_lines(files[lang])
                write_lines(tmp / f"ref.newstest{year}.{lang}", raw)
                fixed = [replace_curly_apostrophe(line) for line in raw]
                write_lines(tmp / f"newstest{year}.{lang}",
                            parallel_map(MosesTokenize(lang, aggressive=True), fixed, args.workers))  # fmt: skip

    tok_dir = step(TAG, "normalise and tokenise", args.work_dir / "tok", tokenize)

    def apply_bpe(tmp: Path) -> None:
        learn_bpe(TAG, [tok_dir / f"train.{lang}" for lang in langs], args.bpe_merges, tmp / "code", args.workers)
        for lang in langs:
            log(TAG, f"applying BPE to train.{lang}")
            map_file(ApplyBPE(tmp / "code"), tok_dir / f"train.{lang}", tmp / f"bpe.train.{lang}", args.workers)
            for name in names:
                write_lines(tmp / f"{name}.{lang}",
                            parallel_map(ApplyBPE(tmp / "code"), read_lines(tok_dir / f"{name}.{lang}"), args.workers))  # fmt: skip
        kept, read = clean_files(*(tmp / f"bpe.train.{lang}" for lang in langs),
                                 *(tmp / f"train.{lang}" for lang in langs), 1, 250, 1.5)  # fmt: skip
        log(TAG, f"train: {kept} of {read} pairs kept by cleaning")
        for lang in langs:
            (tmp / f"bpe.train.{lang}").unlink()

    bpe_dir = step(TAG, f"joint BPE ({args.bpe_merges} merges)", args.work_dir / "bpe", apply_bpe)

    def build(tmp: Path) -> None:
        others = [y for y in args.years if y != TEST_YEAR]
        prefixes: dict = {"train": bpe_dir / "train", "valid": bpe_dir / f"newstest{VALID_YEAR}",
                          "test": [bpe_dir / f"newstest{TEST_YEAR}"]}  # fmt: skip
        if others:  # one more split, test1, holds the other years one after the other
            for lang in langs:
                concatenate([bpe_dir / f"newstest{y}.{lang}" for y in others], tmp / "text" / f"years.{lang}")
            prefixes["test"].append(tmp / "text" / "years")
        binarize(TAG, args.src, args.tgt, prefixes, tmp, args.workers)
        shutil.rmtree(tmp / "text", ignore_errors=True)
        entries, start = [], 0
        (tmp / "refs").mkdir()
        for year in [TEST_YEAR, *others]:
            refs = read_lines(tok_dir / f"ref.newstest{year}.{args.tgt}")
            write_lines(tmp / "refs" / f"newstest{year}.{args.tgt}", refs)
            split, first = ("test", 0) if year == TEST_YEAR else ("test1", start)
            entries.append({"name": f"newstest{year}", "split": split, "start": first, "end": first + len(refs),
                            "reference": f"refs/newstest{year}.{args.tgt}"})  # fmt: skip
            start = start + len(refs) if year != TEST_YEAR else start
        (tmp / "code").write_bytes((bpe_dir / "code").read_bytes())
        span = f"newstest{args.years[0]}-{args.years[-1]}"
        write_manifest(tmp, {
            "dataset": f"wmt14_en_{args.other}", "source_lang": args.src, "target_lang": args.tgt,
            "segmentation": "bpe", "detokenizer": "moses", "lowercase": False,
            "beam": 4, "lenpen": 0.6, "compound_split": args.tgt == "de",
            "tests": sorted(entries, key=lambda e: e["name"]),
            "averages": {span: [f"newstest{y}" for y in args.years]} if others else {}, "settings": output_settings,
        })  # fmt: skip

    step(TAG, f"binarize {args.src}->{args.tgt}", args.dest_dir, build)
    log(TAG, f"ready: {args.dest_dir} ({count_lines(bpe_dir / f'train.{args.src}')} training pairs)")


if __name__ == "__main__":
    run_main(TAG, main)
