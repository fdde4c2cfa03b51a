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
"""

import argparse
import collections
import typing

import torch
from fairseq.distributed.utils import _TensorPlaceholder
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode

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


allow_fairseq_checkpoints()
