"""A kill at any point of a checkpoint save leaves a run that resumes exactly with the same command.

fairseq-train writes a save's first checkpoint atomically (``checkpoint_utils.torch_persistent_save``: a
``.tmp`` file renamed into place), then copies it to ``checkpoint_last.pt`` (and ``checkpoint_best.pt``) with a
plain ``PathManager.copy``: a SIGKILL during that copy left ``checkpoint_last.pt`` truncated, often 0 bytes, and
resuming failed on it. Importing the plugin changes two things, both for fairseq-train with ``--user-dir``:

- the copies are atomic (``atomic_copy``: a ``.tmp`` name beside the target, then ``os.replace``), so the old
  ``checkpoint_last.pt`` stays whole until the new one is complete;
- resuming with a truncated or corrupt ``checkpoint_last.pt`` (a run saved without the plugin, a full disk)
  continues from the newest intact checkpoint in the save directory, named in one logged line. With none,
  the loader's error (checkpoint_safety.py) says so and names the file to restore.
"""

import functools
import logging
import os
import re
import shutil
import zipfile

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

logger = logging.getLogger(__name__)

ZIP_MAGIC, PICKLE_MAGIC = b"PK\x03\x04", b"\x80"  # torch.save's zip format; the legacy format is a bare pickle


def atomic_copy(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` through ``dst + ".tmp"`` and ``os.replace``: ``dst`` is the old file or the whole
    new one, never a part (the temporary name is fixed, as fairseq's own, so a killed copy's leftover is
    overwritten by the next save instead of piling up)."""
    partial = f"{dst}.tmp"
    try:
        shutil.copyfile(src, partial)
        os.replace(partial, dst)
    except BaseException:
        if os.path.lexists(partial):
            os.remove(partial)
        raise


class AtomicCopyPathManager(PathManager):
    """fairseq's PathManager with an atomic ``copy`` for local files (iopath's remote paths are left to it)."""

    @staticmethod
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite=overwrite)
        if not overwrite and os.path.exists(dst_path):
            return False  # iopath's answer; fairseq always copies with overwrite=True
        atomic_copy(src_path, dst_path)
        return True


def intact(path: str) -> bool:
    """Whether ``path`` is a complete checkpoint file by its structure: a zip (torch.save's format) whose central
    directory is present and whose members all lie inside the file, or a legacy pickle. Reads only the zip's
    directory, not the tensors; the loader still checks what it unpickles."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head.startswith(PICKLE_MAGIC):
            return True
        if head != ZIP_MAGIC:
            return False  # empty, or bytes no checkpoint starts with
        size = os.path.getsize(path)
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
        return bool(members) and all(m.header_offset + m.compress_size <= size for m in members)
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def newest_intact_checkpoint(save_dir: str, suffix: str = "", exclude: str | None = None) -> str | None:
    """The most recently written intact ``checkpoint*{suffix}.pt`` in ``save_dir`` other than ``exclude`` (by
    modification time: every save writes its files after the previous save's), or None."""
    pattern = re.compile(r"checkpoint.*" + re.escape(suffix) + r"\.pt")
    try:
        names = os.listdir(save_dir)
    except OSError:
        return None
    candidates = []
    for name in names:
        path = os.path.join(save_dir, name)
        if pattern.fullmatch(name) and (exclude is None or os.path.abspath(path) != os.path.abspath(exclude)):
            try:
                candidates.append((os.stat(path).st_mtime_ns, name, path))
            except OSError:
                continue
    for _, _, path in sorted(candidates, reverse=True):
        if intact(path):
            return path
    return None


def resume_from_newest_intact(load_checkpoint):
    """Wrap fairseq's ``checkpoint_utils.load_checkpoint(cfg, trainer, ...)`` (fairseq-train's resume): when the
    checkpoint it would resume from, ``checkpoint_last.pt``, exists but is not intact, resume from the newest
    intact checkpoint in the save directory instead, logging one line that names both."""

    @functools.wraps(load_checkpoint)
    def wrapper(cfg, trainer, **passthrough_args):
        suffix = trainer.checkpoint_suffix or ""
        last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        # only fairseq's default resume: an explicit --restore-file or --finetune-from-model names its own file
        if cfg.restore_file != "checkpoint_last.pt" or cfg.finetune_from_model or not os.path.isfile(last) or intact(last):
            return load_checkpoint(cfg, trainer, **passthrough_args)
        newest = newest_intact_checkpoint(cfg.save_dir, suffix, exclude=last)
        if newest is None:
            return load_checkpoint(cfg, trainer, **passthrough_args)  # the loader's error names the file
        logger.warning(f"{last} is truncated or corrupt; resuming from {newest}, the newest intact checkpoint in "
                       f"{cfg.save_dir}")  # fmt: skip
        restore_file = cfg.restore_file
        # fairseq inserts the suffix itself (restore_file.replace(".pt", suffix + ".pt"))
        cfg.restore_file = newest[: -len(f"{suffix}.pt")] + ".pt"
        try:
            return load_checkpoint(cfg, trainer, **passthrough_args)
        finally:
            cfg.restore_file = restore_file

    wrapper.resumes_from_newest_intact = True
    return wrapper


# fairseq-train looks both up in checkpoint_utils at call time; PathManager.copy is what save_checkpoint calls to
# write checkpoint_last.pt and checkpoint_best.pt, and fairseq offers no hook around it
checkpoint_utils.PathManager = AtomicCopyPathManager
if not getattr(checkpoint_utils.load_checkpoint, "resumes_from_newest_intact", False):
    checkpoint_utils.load_checkpoint = resume_from_newest_intact(checkpoint_utils.load_checkpoint)
