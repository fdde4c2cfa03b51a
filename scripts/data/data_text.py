"""Line processing of the data preparation scripts (scripts/data/prepare_*.py): chunked and parallel maps
over a corpus, Moses tokenisation and punctuation normalisation (sacremoses), clean-corpus-n.perl, and the
<seg> reader of XML/SGM test sets. Every name here is also importable from data_common.
"""

import multiprocessing
import os
import shutil
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from scripts.recipe_common import RecipeError, atomic_path, open_text, read_lines

WORKERS = max(1, min(8, os.cpu_count() or 1))


def parallel_map(function: Callable[[list[str]], list[str]], lines: Sequence[str], workers: int) -> list[str]:
    """``function`` over chunks of ``lines`` in ``workers`` processes, order kept."""
    if workers <= 1 or len(lines) < 20000:
        return function(list(lines))
    size = max(1000, len(lines) // (workers * 8))
    chunks = [list(lines[i : i + size]) for i in range(0, len(lines), size)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [line for part in pool.map(function, chunks) for line in part]


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk = []
    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def map_file(function: Callable[[list[str]], list[str]], source: Path, dest: Path, workers: int,
             chunk: int = 20000) -> int:  # fmt: skip
    """Write ``function`` of ``source``'s lines to ``dest``, streamed in chunks (corpora of tens of millions of
    lines do not fit in memory as lists), ``workers`` processes, order kept. Returns the line count."""
    count = 0
    with open_text(source) as fin, atomic_path(dest) as tmp, open(tmp, "w", encoding="utf-8") as fout:
        if workers <= 1:
            results: Iterable[list[str]] = map(function, _chunks(fin, chunk))
            pool = None
        else:
            pool = multiprocessing.get_context("fork").Pool(workers)
            results = pool.imap(function, _chunks(fin, chunk))
        try:
            for part in results:
                fout.writelines(line + "\n" for line in part)
                count += len(part)
        finally:
            if pool is not None:
                pool.terminate()
    return count


def concatenate(sources: Sequence[Path], dest: Path) -> None:
    with atomic_path(dest) as tmp, open(tmp, "wb") as out:
        for source in sources:
            with open(source, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)


class Pipeline:
    """Several line functions applied in turn, as one picklable function for map_file."""

    def __init__(self, *functions: Callable[[list[str]], list[str]]):
        self.functions = functions

    def __call__(self, lines: list[str]) -> list[str]:
        for function in self.functions:
            lines = function(lines)
        return lines


class Prefix:
    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, lines: list[str]) -> list[str]:
        return [self.prefix + line for line in lines]


class MosesTokenize:
    """sacremoses' port of tokenizer.perl; ``aggressive`` is the script's ``-a`` (hyphens become @-@)."""

    def __init__(self, lang: str, aggressive: bool = False, lowercase: bool = False):
        self.lang, self.aggressive, self.lowercase = lang, aggressive, lowercase

    def __call__(self, lines: list[str]) -> list[str]:
        from sacremoses import MosesTokenizer

        tok = MosesTokenizer(lang=self.lang)
        out = [tok.tokenize(line, aggressive_dash_splits=self.aggressive, return_str=True, escape=True) for line in lines]
        return [line.lower() for line in out] if self.lowercase else out


class NormalizeForTraining:
    """normalize-punctuation.perl then remove-non-printing-char.perl, as fairseq's WMT scripts run them."""

    def __init__(self, lang: str):
        self.lang = lang

    def __call__(self, lines: list[str]) -> list[str]:
        from sacremoses import MosesPunctNormalizer

        norm = MosesPunctNormalizer(lang=self.lang)
        return [remove_non_printing(norm.normalize(line)) for line in lines]


def remove_non_printing(line: str) -> str:
    # remove-non-printing-char.perl: every \p{C} character (control, format, unassigned...) becomes a space
    return "".join(" " if unicodedata.category(c).startswith("C") else c for c in line)


def clean_corpus(
    src: Sequence[str], tgt: Sequence[str], min_len: int, max_len: int, ratio: float, factored: bool | None = None
) -> tuple[list[str], list[str]]:
    """clean-corpus-n.perl: drop pairs with an empty side, a side outside [min_len, max_len] words or a length
    ratio above ``ratio``; squeeze whitespace in the kept lines.

    '|' is the factor separator of Moses' factored corpora: the script deletes every '|' unless the corpus is
    factored, which it decides from the FIRST pair (a '|' on either side of it). ``factored`` is that
    decision (None: decide from ``src[0]``/``tgt[0]``). Text tokenised by Moses has no '|' to delete (the
    tokenizer escapes it as ``&#124;``), so on the IWSLT/WMT pipelines this only matters for raw text."""
    if factored is None:
        factored = bool(src) and ("|" in src[0] or "|" in tgt[0])
    out_s, out_t = [], []
    for s, t in zip(src, tgt, strict=True):
        if not factored:
            s, t = s.replace("|", ""), t.replace("|", "")
        s, t = " ".join(s.split()), " ".join(t.split())
        if not s or not t:
            continue
        ns, nt = len(s.split(" ")), len(t.split(" "))
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
            continue
        if ns / nt > ratio or nt / ns > ratio:
            continue
        out_s.append(s)
        out_t.append(t)
    return out_s, out_t


def clean_files(src_in: Path, tgt_in: Path, src_out: Path, tgt_out: Path, min_len: int, max_len: int,
                ratio: float) -> tuple[int, int]:  # fmt: skip
    """clean_corpus over two files, streamed (the factored decision from the first pair holds for all chunks);
    returns (kept, read)."""
    kept = read = 0
    factored = None
    with open_text(src_in) as fs, open_text(tgt_in) as ft, atomic_path(src_out) as tmp_s, \
            atomic_path(tgt_out) as tmp_t, open(tmp_s, "w", encoding="utf-8") as os_, \
            open(tmp_t, "w", encoding="utf-8") as ot:  # fmt: skip
        for chunk_s, chunk_t in zip(_chunks(fs, 100000), _chunks(ft, 100000), strict=True):
            if factored is None:
                factored = "|" in chunk_s[0] or "|" in chunk_t[0]
            s, t = clean_corpus(chunk_s, chunk_t, min_len, max_len, ratio, factored)
            os_.writelines(line + "\n" for line in s)
            ot.writelines(line + "\n" for line in t)
            kept, read = kept + len(s), read + len(chunk_s)
    return kept, read



def replace_curly_apostrophe(line: str) -> str:
    # fairseq's prepare-*.sh run sed "s/’/'/g" on the XML/SGM test sets before tokenising
    return line.replace("\u2019", "'")


def read_segments(path: Path) -> list[str]:
    """The <seg> texts of an XML/SGM file (IWSLT .xml, WMT .sgm), read by sacrebleu's own reader of the
    WMT/IWSLT "fake SGML" format (``FakeSGMLDataset._convert_format``: every line that starts with ``<seg ``,
    whitespace squeezed), the reader sacrebleu scores its own test sets with."""
    import tempfile

    from sacrebleu.dataset.fake_sgml import FakeSGMLDataset

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "text"
        try:
            FakeSGMLDataset._convert_format(FakeSGMLDataset, str(path), str(out))  # a method without state
        except (OSError, UnicodeDecodeError) as err:
            raise RecipeError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
        segments = read_lines(out)
    if not segments:
        raise RecipeError(f"{path}: no <seg> lines")
    return segments

