"""The light, top-level part of the package: what runs without importing fairseq (docs/cli.md).

``main``: the ``fairseq-residual`` command. ``fairseq-residual user-dir`` prints the plugin's directory from
the import system alone, so ``--user-dir "$(fairseq-residual user-dir)"`` costs no fairseq import; every other
subcommand is fairseq_plugins/cli.py's.

``install``: say which ``--user-dir`` to add when a fairseq tool reads a plugin checkpoint without it. A
checkpoint trained with ``--user-dir`` pickles its options as an ``argparse.Namespace``. Under torch >= 2.6,
fairseq-generate (-interactive, -validate, ...) run without ``--user-dir`` never imports the plugin, whose
allow-list (fairseq_plugins/checkpoint_safety.py) admits that type, so torch's weights-only unpickler refuses
the file with ``Unsupported global: GLOBAL argparse.Namespace``, and nothing names ``--user-dir``. fairseq has
no plugin discovery of its own (no entry points; ``--user-dir`` is its only way in), so the installed package
registers ``install`` in torch's ``torch.backends`` entry-point group, which torch loads whenever it is itself
imported (setup.py). ``install`` only chains ``sys.excepthook``: nothing else runs until a program ends with an
uncaught error, and then only that refusal, raised in fairseq's loader while the plugin is not loaded, is
replaced by one line naming the checkpoint, the ``--user-dir`` and ``--arch`` it was trained with, and what to
add. The checkpoint is read again for that with torch's weights-only loader, ``argparse.Namespace`` allowed for
that one call. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch's switch for the group) turns it off. This module is
apart from ``fairseq_plugins``, whose import imports torch and fairseq: that cannot happen while torch itself is
being imported, nor cheaply for ``user-dir``.
"""

import argparse
import functools
import importlib.util
import os
import pickle
import sys

USER_DIR = '"$(fairseq-residual user-dir)"'


def _checkpoint_of(traceback):
    """The ``path`` fairseq's ``load_checkpoint_to_cpu`` was reading when the error was raised, or None."""
    path = None
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name == "load_checkpoint_to_cpu" and isinstance(frame.f_locals.get("path"), str):
            path = frame.f_locals["path"]
        traceback = traceback.tb_next
    return path


def _field(config, name):
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def trained_with(path: str) -> tuple[str | None, str | None]:
    """(user_dir, arch) recorded in a fairseq checkpoint, read weights-only with ``argparse.Namespace`` allowed;
    (None, None) if it cannot be read so."""
    import torch  # not at the top: install() runs while torch itself is being imported

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001  (another refused type or a damaged file: the original error stands)
        return None, None
    if not isinstance(state, dict):
        return None, None
    cfg = state.get("cfg") or {}
    args = state.get("args")  # checkpoints of fairseq before hydra
    common, model = _field(cfg, "common"), _field(cfg, "model")
    user_dir = _field(common, "user_dir") or _field(args, "user_dir")
    arch = _field(model, "arch") or _field(model, "_name") or _field(args, "arch")
    return user_dir, arch


def message(path: str, user_dir: str, arch: str | None) -> str:
    """The one line that replaces torch's refusal."""
    plugin = os.path.basename(os.path.normpath(user_dir)) == "fairseq_plugins"
    add = f"--user-dir {USER_DIR}" if plugin else f"--user-dir {user_dir}"
    trained = f"--user-dir {user_dir}" + (f" (--arch {arch})" if arch else "")
    return f"checkpoint {path} was trained with {trained}, which this command did not load: add {add}"


def report_missing_user_dir(kind, error, traceback, fallback) -> None:
    """sys.excepthook: torch's refusal of ``argparse.Namespace`` in fairseq's loader, with the plugin not
    loaded, becomes one line naming the ``--user-dir`` to add; every other error goes to ``fallback``."""
    if (
        issubclass(kind, pickle.UnpicklingError)
        and "argparse.Namespace" in str(error)
        and "fairseq_plugins" not in sys.modules
        and (path := _checkpoint_of(traceback))
    ):
        user_dir, arch = trained_with(path)
        if user_dir:
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"
            print(f"{prog}: error: {message(path, user_dir, arch)}", file=sys.stderr)
            return
    fallback(kind, error, traceback)


def install() -> None:
    """Chain report_missing_user_dir in front of sys.excepthook, once."""
    if getattr(sys.excepthook, "func", None) is report_missing_user_dir:
        return
    sys.excepthook = functools.partial(report_missing_user_dir, fallback=sys.excepthook)


def user_dir() -> str:
    """The installed plugin's directory (what ``--user-dir`` takes), found without importing it."""
    spec = importlib.util.find_spec("fairseq_plugins")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("fairseq-residual: error: the package fairseq_plugins is not installed in this Python")
    return os.path.abspath(next(iter(spec.submodule_search_locations)))


def main(argv: list[str] | None = None) -> None:
    """``fairseq-residual``: ``user-dir`` here; every other subcommand (and --help) in fairseq_plugins.cli."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["user-dir"]:
        print(user_dir())
        return
    # not at the top: it imports fairseq (seconds), which only the other subcommands need
    from fairseq_plugins import cli

    cli.main(argv)
