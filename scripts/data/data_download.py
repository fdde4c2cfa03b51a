"""Downloads of the data preparation scripts (scripts/data/prepare_*.py): fetch a URL under a temporary name,
check its size and published md5, unpack tar archives. Every name here is also importable from data_common.
"""

import hashlib
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from scripts.recipe_common import RecipeError, atomic_path, log


def file_digest(path: Path, algorithm: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def download(tag: str, url: str, dest: Path, md5: str | None = None, local: str = "RAW_DIR") -> Path:
    """Download ``url`` to ``dest`` (via ``dest.part``), checking the announced size and the md5 if known.

    An existing ``dest`` is only reused after the same md5 check. ``local``: the variable that gives the
    recipe a local copy instead, named when the download fails.
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
                f"download of {url} failed ({err}); download it by hand and set {local} to its directory"
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
