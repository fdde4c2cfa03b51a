"""Let fairseq load its own checkpoints under torch >= 2.6 with ``weights_only`` loading still on.

torch 2.6 made ``torch.load(..., weights_only=True)`` the default. fairseq's loaders
(``checkpoint_utils.load_checkpoint_to_cpu``, used by fairseq-generate, fairseq-interactive,
``from_pretrained`` and resuming) call ``torch.load`` without the argument, so a checkpoint written by
fairseq-train is refused: it pickles an ``argparse.Namespace`` (models trained through the argparse
route), and resuming in distributed training broadcasts the loaded state with its cfg as an omegaconf
``DictConfig`` and its tensors sent apart as fairseq placeholders.

Importing the plugin (which ``--user-dir`` does before any checkpoint is read) adds exactly those types to
torch's allow-list. Nothing else is allowed: a checkpoint that references any other global (``os.system``,
``builtins.eval``, a class with a malicious ``__setstate__``) is still refused by torch's unpickler.
Safety is never switched off (no ``weights_only=False``, no ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``).

fairseq's loader is also wrapped so that a refused or damaged checkpoint gives one clear message naming
the file (and, for a damaged one, the newest intact checkpoint beside it to copy over it), instead of torch's
advice to switch safety off or a zip-reader error.
"""

import argparse
import collections
import functools
import os
import pickle
import re
import struct
import typing

import torch
from fairseq import checkpoint_utils
from fairseq.distributed.utils import _TensorPlaceholder
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode

from .checkpoint_saving import newest_intact_checkpoint
from .validation import STORED_ARGS

# The globals that fairseq checkpoints reference (found by loading checkpoints of every kind the tests
# write: single-process, resumed, and the cfg that distributed resume broadcasts).
FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,  # args of models trained through the argparse route
    DictConfig,  # cfg as broadcast on distributed resume
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    typing.Any,  # the ref_type recorded in omegaconf metadata
    collections.defaultdict,  # omegaconf's resolver cache
    _TensorPlaceholder,  # distributed resume sends tensors apart from the pickled state
    dict,  # omegaconf metadata records the container and key classes themselves
    list,
    int,
]


def allow_fairseq_checkpoints() -> None:
    """Add the globals fairseq checkpoints need to torch's weights-only allow-list (idempotent)."""
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


class CheckpointRefusedError(pickle.UnpicklingError):
    """A checkpoint references a global that fairseq checkpoints never contain."""


class CheckpointCorruptError(RuntimeError):
    """A checkpoint file is truncated or otherwise unreadable."""


# what torch's weights-only unpickler says when the pickle asks for something not allowed (a global, a class, a
# callable); anything else it says (an unknown opcode, a string running past the end, an append to a non-list)
# means bytes that are not a well-formed checkpoint: a truncated or corrupt file
_REFUSAL = re.compile(r"GLOBAL|[Uu]nsupported global|unrecognized function|Can only (create new object|build)"
                      r"|allowlisted|must be imported")  # fmt: skip
_DAMAGE = re.compile(r"zip|archive|EOF|unexpected end|truncated|corrupt|Invalid argument|invalid load key")


def _refused_global(message: str) -> str:
    found = re.search(r"GLOBAL ([\w.]+)", message) or re.search(r"(unrecognized function \S+|got <class \S+>)", message)
    return found.group(1) if found else "an unsupported global"


def _unpickler_detail(message: str) -> str:
    """The unpickler's own words inside torch's long weights-only message."""
    detail = message.split("WeightsUnpickler error:")[-1].split("Check the documentation")[0]
    return " ".join(detail.split())[:200] or "unreadable data"


def _corrupt(path, reason: str) -> CheckpointCorruptError:
    """The error for a damaged checkpoint, naming the file to copy over it: removing it, the advice before issue
    56, made fairseq-train start again from the first update without a word."""
    where = os.path.dirname(os.path.abspath(path)) if isinstance(path, str | os.PathLike) else None
    newest = newest_intact_checkpoint(where, exclude=os.fspath(path)) if where else None
    if newest:
        advice = (f"the newest intact checkpoint beside it is {newest}: copy it over {path} (cp {newest} {path}) to "
                  "continue from it, or restore the file from a copy")  # fmt: skip
    else:
        advice = (f"no other intact checkpoint is in {where or 'its directory'}: restore it from a copy (removing it "
                  "would start training again from the first update)")  # fmt: skip
    return CheckpointCorruptError(f"checkpoint {path} is truncated or corrupt and cannot be read ({reason}); {advice}")


def mark_stored_args(state, arg_overrides) -> None:
    """Record on the loaded model args which options the caller overrides (validation.STORED_ARGS): the plugin's
    build_model then clears options a checkpoint stored but its model never read, and still refuses an override
    that the model would not read (axes.drop_if_stored)."""
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_args = cfg.get("model") if isinstance(cfg, dict | DictConfig) else None
    if isinstance(model_args, argparse.Namespace):  # the plugin's models are built from argparse args
        setattr(model_args, STORED_ARGS, sorted(arg_overrides or ()))


def explain_load_errors(load):
    """Wrap a checkpoint loader ``load(path, ...)`` so its failures name the file and the reason: a refused
    global (CheckpointRefusedError) and a damaged file (CheckpointCorruptError) each have their own message."""

    @functools.wraps(load)
    def wrapper(path, *args, **kwargs):
        try:
            state = load(path, *args, **kwargs)
        except pickle.UnpicklingError as err:
            if not _REFUSAL.search(str(err)):
                raise _corrupt(path, _unpickler_detail(str(err))) from None
            raise CheckpointRefusedError(
                f"refusing to load checkpoint {path}: it references {_refused_global(str(err))}, which is "
                "not one of the types fairseq checkpoints contain, and loading it could run arbitrary code. "
                "Weights-only loading stays on (fairseq_plugins/checkpoint_safety.py lists what is allowed)."
            ) from None
        except (RuntimeError, EOFError, OSError, UnicodeDecodeError, struct.error) as err:
            # struct.error: torch's weights-only unpickler reading a length or number past the end of a cut stream
            missing = isinstance(err, FileNotFoundError | PermissionError | IsADirectoryError)
            if missing or not (isinstance(err, EOFError | UnicodeDecodeError | struct.error) or _DAMAGE.search(str(err))):
                raise
            raise _corrupt(path, str(err) or type(err).__name__) from err
        mark_stored_args(state, kwargs.get("arg_overrides", args[0] if args else None))
        return state

    wrapper.explains_load_errors = True
    return wrapper


allow_fairseq_checkpoints()
if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "explains_load_errors", False):
    # fairseq-generate, -interactive, from_pretrained and resuming all look the loader up in this module
    checkpoint_utils.load_checkpoint_to_cpu = explain_load_errors(checkpoint_utils.load_checkpoint_to_cpu)
