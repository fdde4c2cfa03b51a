"""Shared pieces of the data preparation scripts (scripts/data/prepare_*.py, run by recipes/prepare_*.sh).

What every preparation step relies on:

- inputs (downloaded or given as a local directory) are verified before anything is written: expected
  files, gzip/tar integrity, equal line counts of parallel files, the published line counts, checksums
  where they are published;
- each step builds its output under a temporary name (recipe_common.atomic_path) and is skipped when the
  recipe runs again and its output exists;
- a work directory remembers the settings it was built with and refuses to be reused with others.

Moses tokenisation and punctuation normalisation come from sacremoses, BPE from subword-nmt, SentencePiece
from sentencepiece: no Perl and no cloned repositories.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for recipe_common

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import tarfile
import threading
import time
import unicodedata
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence

from recipe_common import (  # noqa: F401  (re-exported: the data scripts import everything from here)
    MANIFEST,
    REPO,
    RecipeError,
    atomic_path,
    count_lines,
    fairseq_module,
    log,
    open_text,
    read_lines,
    read_manifest,
    run_command,
    run_main,
    write_json,
    write_lines,
    write_manifest,
)


def step(tag: str, name: str, output: Path, build: Callable[[Path], None]) -> Path:
    """Build ``output`` (a directory) with ``build(tmp_dir)`` unless it already exists."""
    if output.exists():
        log(tag, f"{name}: done already ({output})")
        return output
    log(tag, f"{name} ...")
    start = time.monotonic()
    with atomic_path(output) as tmp:
        tmp.mkdir(parents=True)
        build(tmp)
    log(tag, f"{name}: done in {time.monotonic() - start:.0f}s -> {output}")
    return output


def check_settings(work_dir: Path, settings: dict, steps: Sequence[str]) -> None:
    """Refuse to reuse a work directory whose finished ``steps`` were built with other settings (they would
    be skipped as done); with no step finished yet, the new settings replace the old ones."""
    path = work_dir / "settings.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        done = [name for name in steps if (work_dir / name).exists()]
        if old != settings and done:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise RecipeError(
                f"{work_dir} was prepared with other settings ({', '.join(diff)}: "
                f"{[old.get(k) for k in diff]} there, {[settings.get(k) for k in diff]} now); "
                "remove it or choose another WORK_DIR"
            )
    write_json(path, settings)


def check_output(dest: Path, settings: dict) -> None:
    """An existing output directory is only reused if its recipe.json records the same settings (including
    the direction: a directory binarized en->de is never taken for de->en)."""
    if (dest / MANIFEST).is_file():
        manifest = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))
        old = manifest.get("settings")
        if isinstance(old, dict) and "direction" in settings and "direction" not in old:
            # written before the settings named the direction and the dictionary layout: its languages say
            # the direction, and its dictionary was joined
            old = {**old, "direction": f"{manifest.get('source_lang')}-{manifest.get('target_lang')}"}
            if "joined_dictionary" in settings:
                old["joined_dictionary"] = manifest.get("joined_dictionary", True)
        if old != settings:
            raise RecipeError(f"{dest} was built with other settings ({old} there, {settings} now); "
                              "remove it or choose another DEST_DIR")  # fmt: skip


def require_dir(path: Path | None, variable: str) -> Path:
    if path is None or not path.is_dir():
        raise RecipeError(f"{variable}={path}: no such directory")
    return path


def find_file(root: Path, name: str, variable: str) -> Path:
    """The one file called ``name`` anywhere under ``root`` (downloads nest differently per mirror)."""
    direct = root / name
    if direct.is_file():
        return direct
    matches = sorted(p for p in root.rglob(Path(name).name) if p.is_file() and str(p).endswith(name))
    if not matches:
        raise RecipeError(f"{variable}={root}: missing file {name}")
    if len(matches) > 1:
        raise RecipeError(f"{variable}={root}: {name} found more than once: {', '.join(map(str, matches))}")
    return matches[0]


def check_parallel(pairs: dict[str, tuple[Path, Path]], expected: dict[str, int] | None = None) -> dict[str, int]:
    """Line counts of parallel files: both sides equal, non-empty and (if given) the published count."""
    counts = {}
    for name, (a, b) in pairs.items():
        na, nb = count_lines(a), count_lines(b)
        if na != nb:
            raise RecipeError(f"{name}: {a} has {na} lines but {b} has {nb}: truncated or mismatched files")
        if na == 0:
            raise RecipeError(f"{name}: {a} is empty")
        want = (expected or {}).get(name)
        if want is not None and na != want:
            raise RecipeError(
                f"{name}: {a} has {na} lines, the published corpus has {want}: truncated or another release "
                "(VERIFY_COUNTS=0 accepts other line counts)"
            )
        counts[name] = na
    return counts


# ------------------------------------------------------------------------------------------- downloads


def file_digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(tag: str, url: str, dest: Path, md5: str | None = None) -> Path:
    """Download ``url`` to ``dest`` (via ``dest.part``), checking the announced size and the md5 if known.

    An existing ``dest`` is only reused after the same md5 check.
    """
    if dest.exists():
        if md5 and file_digest(dest, "md5") != md5:
            raise RecipeError(f"{dest}: md5 differs from the published {md5}; delete it to download again")
        return dest
    log(tag, f"downloading {url}")
    with atomic_path(dest) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0)
                done, last = 0, time.monotonic()
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
                    done += len(block)
                    if time.monotonic() - last > 30:
                        last = time.monotonic()
                        share = f" ({100 * done / total:.0f}%)" if total else ""
                        log(tag, f"  {dest.name}: {done / 2**20:.0f} MiB{share}")
        except (urllib.error.URLError, OSError) as err:
            raise RecipeError(
                f"download of {url} failed ({err}); download it by hand and pass the directory (RAW_DIR)"
            ) from err
        if total and done != total:
            raise RecipeError(f"download of {url} is incomplete: {done} of {total} bytes")
        if md5 and file_digest(tmp, "md5") != md5:
            raise RecipeError(f"download of {url}: md5 differs from the published {md5}")
    return dest


def extract(tag: str, archive: Path, dest: Path) -> Path:
    """Unpack a tar archive into ``dest``; a truncated or corrupt archive is a RecipeError."""
    if dest.exists():
        return dest
    log(tag, f"extracting {archive.name}")
    with atomic_path(dest) as tmp:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
            raise RecipeError(f"{archive}: truncated or corrupt archive ({err}); delete it and retry") from err
    return dest


# --------------------------------------------------------------------------------------- text processing

_WORKERS = max(1, min(8, os.cpu_count() or 1))


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


def learn_bpe(tag: str, inputs: Sequence[Path], num_symbols: int, codes: Path, workers: int = 1) -> None:
    """Joint BPE with subword-nmt: learn_bpe.py -s num_symbols on the concatenation of ``inputs``."""
    from subword_nmt.learn_bpe import learn_bpe as subword_learn_bpe

    log(tag, f"learning {num_symbols} BPE merges on {', '.join(p.name for p in inputs)}")
    text = codes.with_name(codes.name + ".input")
    concatenate(inputs, text)
    try:
        with open(text, encoding="utf-8") as fin, open(codes, "w", encoding="utf-8") as fout:
            subword_learn_bpe(fin, fout, num_symbols, num_workers=workers)
    finally:
        text.unlink()


class ApplyBPE:
    def __init__(self, codes: Path):
        self.codes = codes

    def __call__(self, lines: list[str]) -> list[str]:
        from subword_nmt.apply_bpe import BPE

        with open(self.codes, encoding="utf-8") as f:
            bpe = BPE(f)
        return [bpe.process_line(line) for line in lines]


def train_sentencepiece(
    tag: str, inputs: Sequence[Path], model_prefix: Path, vocab_size: int, user_symbols: Sequence[str] = (),
    character_coverage: float = 1.0, input_sentence_size: int = 0,
) -> Path:
    """Train a SentencePiece unigram model on the lines of ``inputs``; returns the .model path.

    ``input_sentence_size`` > 0 trains on a random sample of that many lines (large corpora)."""
    import sentencepiece as spm

    log(tag, f"training a {vocab_size}-piece SentencePiece model on {', '.join(p.name for p in inputs[:4])}"
             f"{' ...' if len(inputs) > 4 else ''}")  # fmt: skip
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(str(p) for p in inputs), model_prefix=str(model_prefix), vocab_size=vocab_size,
            character_coverage=character_coverage, model_type="unigram",
            user_defined_symbols=list(user_symbols), input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True, minloglevel=2, num_threads=_WORKERS,
            # fairseq's dictionary adds its own specials: keep SentencePiece's out of the vocabulary
            bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
        )  # fmt: skip
    except RuntimeError as err:
        raise RecipeError(f"SentencePiece training failed: {err}") from err
    return model_prefix.with_name(model_prefix.name + ".model")


class SentencePieceEncode:
    def __init__(self, model: Path):
        self.model = model

    def __call__(self, lines: list[str]) -> list[str]:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(self.model))
        return [" ".join(pieces) for pieces in sp.encode(lines, out_type=str)]


def binarize(
    tag: str, src: str, tgt: str, prefixes: dict[str, Path | list[Path]], dest: Path, workers: int = _WORKERS,
    joined: bool = True, dictionary: Path | None = None,
) -> None:
    """fairseq-preprocess; ``prefixes`` maps train/valid/test to file prefixes (``PREFIX.src`` and
    ``PREFIX.tgt`` exist). A list for test gives splits test, test1, test2...

    ``joined``: one dictionary for both sides (--joined-dictionary), else one per side, each built from its
    side's training text. ``dictionary``: an existing dictionary file for both sides (--srcdict/--tgtdict)."""
    args = ["--source-lang", src, "--target-lang", tgt, "--destdir", dest, "--workers", str(workers)]
    if dictionary is not None:
        args += ["--srcdict", dictionary, "--tgtdict", dictionary]
    elif joined:
        args.append("--joined-dictionary")
    for split, prefix in prefixes.items():
        value = ",".join(str(p) for p in prefix) if isinstance(prefix, list) else str(prefix)
        args += [f"--{split}pref", value]
    log(tag, f"binarizing {src}-{tgt} with fairseq-preprocess -> {dest}")
    preprocess([str(a) for a in args])


def preprocess(argv: list[str]) -> None:
    """fairseq-preprocess ``argv`` in this process (fairseq's own parser and main): fairseq is imported once
    for every pair of a multilingual corpus, not once per pair. Its INFO log goes to DEST/preprocess.log only."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers = list(logger.handlers)
    logger.propagate = False  # fairseq_cli.preprocess configures the root logger to print INFO on stdout
    try:
        fairseq_preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    except (AssertionError, FileExistsError, FileNotFoundError, OSError, ValueError) as err:
        raise RecipeError(f"fairseq-preprocess {' '.join(argv)} failed: {type(err).__name__}: {err}") from err
    finally:
        for handler in logger.handlers[len(handlers):]:  # the log file handler its main adds on every call
            handler.close()
            logger.removeHandler(handler)
        logger.propagate = True


def build_dictionary(tag: str, files: Sequence[Path], dest: Path, workers: int = _WORKERS) -> int:
    """One dictionary of every token in ``files``, counted and ordered by fairseq's own
    ``FairseqTask.build_dictionary`` (what fairseq-preprocess does for its training text), saved to ``dest``;
    returns its size."""
    from fairseq.tasks.fairseq_task import FairseqTask

    log(tag, f"building the shared dictionary from {len(files)} files")
    d = FairseqTask.build_dictionary([str(f) for f in files], workers=workers)
    with atomic_path(dest) as tmp:
        d.save(str(tmp))
    return len(d)


def split_language_pair(pair: str, allowed: Sequence[str], variable: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), checked against the allowed pairs; the message names the variable."""
    if pair not in allowed:
        raise RecipeError(f"{variable}={pair!r}: not a supported language pair; allowed: {', '.join(allowed)}")
    src, tgt = pair.split("-")
    return src, tgt


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


# ------------------------------------------------------------------- interrupted runs and their temporaries

_TMP_NAME = re.compile(r"\.tmp-(\d+)$")  # recipe_common.atomic_path names NAME.tmp-PID


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(tag: str, work_dir: Path, *outputs: Path) -> list[Path]:
    """Delete the ``NAME.tmp-PID`` files and directories a killed earlier run left behind: everywhere under
    ``work_dir`` and beside each of ``outputs``. Those of a process that still runs (a concurrent run) stay."""
    stale: list[Path] = []

    def check(path: Path) -> bool:
        match = _TMP_NAME.search(path.name)
        if match and not _running(int(match.group(1))):
            stale.append(path)
            return True
        return False

    if work_dir.is_dir():
        for dirpath, dirnames, filenames in os.walk(work_dir):
            for name in filenames:
                check(Path(dirpath) / name)
            dirnames[:] = [d for d in dirnames if not check(Path(dirpath) / d)]
    for output in outputs:
        if output.parent.is_dir():
            for path in output.parent.glob(f"{output.name}.tmp-*"):
                check(path)
    for path in stale:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if stale:
        log(tag, f"removed {len(stale)} temporary file(s) of an interrupted earlier run: "
                 f"{', '.join(p.name for p in stale[:5])}{' ...' if len(stale) > 5 else ''}")  # fmt: skip
    return stale


def interrupt_on_sigterm() -> None:
    """SIGTERM (a scheduler's or ``kill``'s stop) raises KeyboardInterrupt in this process, as Ctrl-C (SIGINT)
    does: the ``finally`` of every atomic step then removes its temporary output and run_main exits with
    status 130.

    Forked pool workers must die of SIGTERM at once (``Pool.terminate`` sends it, then joins them). A worker
    that inherited this Python-level handler can lose the signal: CPython clears signals that arrive between
    ``fork`` and its after-fork reset, and the worker then blocks forever on the pool's queue lock (a
    preparation hung that way once, the pool's ``terminate`` waiting on it). So every fork from the main
    thread happens with the kernel's default action in place, which the child keeps."""
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:  # a child forked from another thread inherited the handler: die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    if not _FORK_HOOKS:
        _FORK_HOOKS.append(owner)
        os.register_at_fork(before=_sigterm_default_for_fork, after_in_parent=_sigterm_restore_after_fork)


_FORK_HOOKS: list[int] = []  # registered once per process
_SAVED_SIGTERM: list = []  # the handler set aside while the main thread forks


def _sigterm_default_for_fork() -> None:
    if threading.current_thread() is threading.main_thread():  # signal.signal works only there
        _SAVED_SIGTERM.append(signal.signal(signal.SIGTERM, signal.SIG_DFL))


def _sigterm_restore_after_fork() -> None:
    if threading.current_thread() is threading.main_thread() and _SAVED_SIGTERM:
        signal.signal(signal.SIGTERM, _SAVED_SIGTERM.pop())


def start(tag: str, work_dir: Path, *outputs: Path) -> None:
    """What every preparation script does first: stop cleanly on SIGTERM and remove what a killed run left."""
    interrupt_on_sigterm()
    remove_stale_temporaries(tag, work_dir, *outputs)
