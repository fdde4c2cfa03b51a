"""The benchmark's data: Multi30k (or synthetic) sentences, a word-level dictionary, and the fixed training and
decoding batches every model of a run sees (fairseq's own batching)."""

import gzip
import os
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from fairseq.data import LanguagePairDataset, data_utils
from fairseq.data.dictionary import Dictionary

from scripts.benchmark.bench_families import REPO, SRC, TGT, BenchmarkError

# how a report names the corpus: never the directory it was read from (reports are committed, paths are not)
MULTI30K_SOURCE = f"Multi30k {SRC}-{TGT} (train, test_2016_flickr)"


@dataclass
class Corpus:
    """Tokenised sentences: training pairs and decoding sources, as lists of words."""

    train: list[tuple[list[str], list[str]]]
    test_sources: list[list[str]]
    source: str


_WORD = re.compile(r"\w+|[^\w\s]")


def tokenize(line: str) -> list[str]:
    """Lower-cased words and single punctuation marks: a simple word-level tokenisation."""
    return _WORD.findall(line.lower())


def default_data_dir() -> Path:
    return Path(os.environ.get("MULTI30K_DIR") or REPO.parent / "shared" / "data" / "multi30k")


def _read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def load_multi30k(data_dir: Path) -> Corpus:
    names = [f"train.{SRC}.gz", f"train.{TGT}.gz", f"test_2016_flickr.{SRC}.gz"]
    missing = [n for n in names if not (data_dir / n).is_file()]
    if missing:
        raise BenchmarkError(
            f"--data-dir {data_dir}: missing {', '.join(missing)} (Multi30k raw files; set --data-dir or "
            "MULTI30K_DIR, or use --synthetic)"
        )
    src, tgt = (_read_gz(data_dir / n) for n in names[:2])
    if len(src) != len(tgt):
        raise BenchmarkError(f"--data-dir {data_dir}: train.{SRC} and train.{TGT} differ in length")
    test = _read_gz(data_dir / names[2])
    return Corpus([(tokenize(s), tokenize(t)) for s, t in zip(src, tgt, strict=True)],
                  [tokenize(s) for s in test], MULTI30K_SOURCE)  # fmt: skip


def synthetic_corpus(n_train: int = 4000, n_test: int = 200, vocab: int = 2000, seed: int = 0) -> Corpus:
    """Random sentences with Multi30k-like lengths (the regression guard: no data files needed)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]

    def sentence() -> list[str]:
        return rng.choices(words, k=max(3, min(40, int(rng.gauss(13, 4)))))

    return Corpus([(sentence(), sentence()) for _ in range(n_train)], [sentence() for _ in range(n_test)],
                  "synthetic")  # fmt: skip


def build_dictionary(corpus: Corpus, vocab_size: int) -> Dictionary:
    """A joint word-level dictionary of the training sentences: the vocab_size most frequent entries."""
    counts = Counter(w for s, t in corpus.train for w in (*s, *t))
    d = Dictionary()
    for word, n in counts.most_common():
        d.add_symbol(word, n=n)
    d.finalize(nwords=vocab_size, padding_factor=8)
    return d


def encode(d: Dictionary, words: list[str]) -> torch.Tensor:
    return d.encode_line(" ".join(words), add_if_not_exist=False, append_eos=True).long()


@dataclass
class Batches:
    train: list[dict]  # fairseq samples (collated LanguagePairDataset batches)
    decode: list[dict]
    train_target_tokens: int
    decode_sentences: int


def make_batches(corpus: Corpus, d: Dictionary, opts) -> Batches:
    """The fixed training and decoding batches every model of a run sees."""
    rng = random.Random(opts.seed)
    pairs = rng.sample(corpus.train, min(len(corpus.train), max(2000, 64 * opts.train_batches)))
    src = [encode(d, s) for s, _ in pairs]
    tgt = [encode(d, t) for _, t in pairs]
    dataset = LanguagePairDataset(src, [len(x) for x in src], d, tgt, [len(x) for x in tgt], d)
    # fairseq's own batching: sort by length, fill up to --max-tokens (padded source or target)
    batches = data_utils.batch_by_size(
        dataset.ordered_indices(), dataset.num_tokens, max_tokens=opts.max_tokens, required_batch_size_multiple=1
    )
    batches = [b for b in batches if len(b) > 1]
    rng.shuffle(batches)
    train = [dataset.collater([dataset[i] for i in b]) for b in batches[: opts.train_batches]]
    if len(train) < opts.train_batches:
        raise BenchmarkError(f"--train-batches {opts.train_batches}: the corpus gives only {len(train)} batches")

    sources = [encode(d, s) for s in corpus.test_sources[: opts.decode_sentences]]
    test = LanguagePairDataset(sources, [len(x) for x in sources], d)
    order = test.ordered_indices()  # by length, as fairseq-generate batches
    decode = [test.collater([test[int(i)] for i in order[k : k + opts.decode_batch_size]])
              for k in range(0, len(order), opts.decode_batch_size)]  # fmt: skip
    return Batches(train, decode, sum(s["ntokens"] for s in train), len(sources))
