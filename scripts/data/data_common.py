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

This module holds the checks of inputs, steps and work directories, and re-exports every name of the
folder's other helpers, so a script imports everything from here:

    data_download.py   downloads and archives (download, extract, file_digest)
    data_text.py       line processing (map_file, parallel_map, MosesTokenize, clean_corpus, read_segments, ...)
    data_subword.py    BPE, SentencePiece, fairseq-preprocess and dictionaries (learn_bpe, binarize, ...)
    data_interrupt.py  SIGTERM and the temporaries of killed runs (start, remove_stale_temporaries, ...)
"""

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from scripts.data.data_download import download, extract, file_digest  # noqa: F401  (re-exported)
from scripts.data.data_interrupt import (  # noqa: F401  (re-exported)
    interrupt_on_sigterm,
    remove_stale_temporaries,
    start,
)
from scripts.data.data_subword import (  # noqa: F401  (re-exported)
    ApplyBPE,
    SentencePieceEncode,
    binarize,
    build_dictionary,
    learn_bpe,
    preprocess,
    train_sentencepiece,
)
from scripts.data.data_text import (  # noqa: F401  (re-exported)
    MosesTokenize,
    NormalizeForTraining,
    Pipeline,
    Prefix,
    clean_corpus,
    clean_files,
    concatenate,
    map_file,
    parallel_map,
    read_segments,
    remove_non_printing,
    replace_curly_apostrophe,
)
from scripts.recipe_common import (  # noqa: F401  (re-exported: the data scripts import everything from here)
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
    began = time.monotonic()  # not `start`: that name is data_interrupt.start, re-exported
    with atomic_path(output) as tmp:
        tmp.mkdir(parents=True)
        build(tmp)
    log(tag, f"{name}: done in {time.monotonic() - began:.0f}s -> {output}")
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


def split_language_pair(pair: str, allowed: Sequence[str], variable: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), checked against the allowed pairs; the message names the variable."""
    if pair not in allowed:
        raise RecipeError(f"{variable}={pair!r}: not a supported language pair; allowed: {', '.join(allowed)}")
    src, tgt = pair.split("-")
    return src, tgt

