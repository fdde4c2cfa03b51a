"""Test utilities for the language models: a tiny LM corpus binarized with ``fairseq-preprocess --only-source``,
tiny LMs built through fairseq's own argument parser and task, and a checkpoint the hub interface can load."""

import copy
import random
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path

import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import (
    convert_namespace_to_omegaconf,
    omegaconf_no_object_check,
)

from .forkserver import run_forked
from .helpers import fairseq_cli

# tiny width and depth: 3 layers is the least every family runs with (k-DCA's k = 2, Crossformer's pairs)
TINY_LM = [
    "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
    "--decoder-layers", "3",
]  # fmt: skip
TASK_ARGS = ["--task", "language_modeling", "--tokens-per-sample", "32", "--sample-break-mode", "eos"]


def make_lm_corpus(directory: Path, sizes=(("train", 300), ("valid", 30), ("test", 21)), seed: int = 0) -> Path:
    """Sentences that count up from a random word (w3 w4 w5 ...): learnable, so a trained model's perplexity
    drops well below the vocabulary size."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        lines = []
        for _ in range(n):
            start, length = rng.randrange(30), rng.randint(3, 9)
            lines.append(" ".join(f"w{(start + i) % 30}" for i in range(length)))
        (directory / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def binarize_lm(raw: Path, dest: Path) -> Path:
    """fairseq-preprocess --only-source, forked from tests/forkserver.py's server (as conftest's corpus_bin): a process
    of its own without importing torch and fairseq again."""
    run_forked(fairseq_cli("preprocess") + [
        "--only-source", "--trainpref", raw / "train.txt", "--validpref", raw / "valid.txt",
        "--testpref", raw / "test.txt", "--destdir", dest, "--workers", "1",
    ])  # fmt: skip
    return dest


def parse_lm_args(data: Path, arch: str, extra: Sequence[str] = (), tiny: bool = True):
    parser = options.get_training_parser()
    argv = [str(data), "--arch", arch, *TASK_ARGS, "--cpu", *(TINY_LM if tiny else []), *extra]
    return options.parse_args_and_arch(parser, input_args=argv)


def build_lm(data: Path, arch: str, extra: Sequence[str] = (), seed: int = 0):
    """(model in eval mode, task, args) for ``arch`` at tiny size on the corpus ``data``."""
    args = parse_lm_args(data, arch, extra)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    model = task.build_model(args)  # as fairseq-train does (fairseq's dataclass models need this route)
    return model.eval(), task, args


_CFG_TEMPLATES: dict[tuple, object] = {}


def checkpoint_cfg(args):
    """``convert_namespace_to_omegaconf(args)``, as fairseq-train saves it. Hydra's compose takes ~0.7 s, so it
    runs once per task and data (a translation test's checkpoint and a language model's share a worker process);
    for another arch only the model part differs, which fairseq stores as a Namespace of the args."""
    key = (args.task, str(getattr(args, "data", "")))
    if key not in _CFG_TEMPLATES:
        _CFG_TEMPLATES[key] = convert_namespace_to_omegaconf(args)
    cfg = copy.deepcopy(_CFG_TEMPLATES[key])
    with omegaconf_no_object_check():
        cfg.model = Namespace(**vars(args))
        cfg.model._name = args.arch
    return cfg


def save_checkpoint(model, args, path: Path) -> Path:
    """A checkpoint as fairseq-train writes it (cfg and weights), for fairseq-eval-lm and from_pretrained."""
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "num_updates": 0,
                "lr_scheduler_state": {"best": None}}]  # fmt: skip
    state = {"cfg": checkpoint_cfg(args), "model": model.state_dict(), "extra_state": {},
             "optimizer_history": history, "last_optimizer_state": None}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, str(path))
    return path


def train_batch(task, split: str = "train", max_tokens: int = 200):
    """The first batch of ``split`` (loaded if needed), as fairseq-train would feed it."""
    if split not in task.datasets:
        task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_tokens=max_tokens, seed=1, num_workers=0)
    return next(iter(itr.next_epoch_itr(shuffle=False)))


def assert_incremental_equals_full(model, task, batch: int = 3, length: int = 8) -> None:
    """An LM's logits decoded one token at a time through fairseq's incremental state equal the full pass."""
    d = task.source_dictionary
    tokens = torch.randint(d.nspecial, len(d), (batch, length), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = d.eos()
    with torch.no_grad():
        full, _ = model(tokens)
        state: dict = {}
        steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
