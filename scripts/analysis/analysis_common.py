"""Shared pieces of the analysis tools in scripts/analysis/ (grad_norms, low_rank_residual, grn_weights, depth_width,
compare, mhc_coefficients, attnres_weights): building a registered architecture exactly as ``fairseq-train --arch
NAME`` does, reading a trained checkpoint with sentences of its data, option checks for argparse, and writing
CSV / JSON / PNG outputs.

The tools run as modules from the repository root (``python -m scripts.analysis.TOOL``).
"""

import csv
import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from fairseq_plugins.validation import (
    argparse_type,
    check_choice,
    check_float,
    check_int,
)
from scripts.recipe_common import atomic_path, write_text

__all__ = ["REPO", "argparse_type", "check_choice", "check_float", "check_int"]


def int_option(name: str, low: int, high: int):
    """argparse ``type=`` for an integer option in [low, high]; the error names ``--name`` and the range."""
    return argparse_type(check_int, name, low, high)


def float_option(name: str, low: float, high: float, low_open: bool = False):
    """argparse ``type=`` for a float option in [low, high] (or (low, high]); the error names ``--name``."""
    return argparse_type(check_float, name, low, high, low_open)


class _Task:
    """The two dictionaries a translation model is built from, without any data on disk.

    ``vocab_size`` and ``target_vocab_size`` count every entry (specials included), as ``len(dict.txt)``
    plus fairseq's specials and padding would: a dictionary of exactly that length is built. Without
    ``target_vocab_size`` source and target share one dictionary (fairseq's ``--joined-dictionary``), which
    ``--share-all-embeddings`` requires.
    """

    def __init__(self, vocab_size: int, target_vocab_size: int | None = None):
        self.source_dictionary = _dictionary(vocab_size)
        self.target_dictionary = (
            self.source_dictionary if target_vocab_size is None else _dictionary(target_vocab_size)
        )


@functools.cache  # once per size: param_table builds ~40 models of a few 9k-44k entry vocabularies (the models only read it)
def _dictionary(size: int):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - d.nspecial):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def registered_archs() -> list[str]:
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_plugins  # noqa: F401  (registers the plugin's architectures)

    return sorted(ARCH_MODEL_REGISTRY)


def parse_arch_args(arch: str, extra: Sequence[str] = ()):
    """Parse ``--arch arch`` plus ``extra`` with fairseq-train's own parser (defaults, arch function)."""
    from fairseq import options

    import fairseq_plugins  # noqa: F401

    parser = options.get_training_parser()
    argv = ["unused-data-dir", "--arch", arch, "--task", "translation", "--cpu", *extra]
    return options.parse_args_and_arch(parser, input_args=argv)


def build_arch(
    arch: str,
    vocab_size: int,
    extra: Sequence[str] = (),
    meta: bool = False,
    target_vocab_size: int | None = None,
):
    """Build ``arch`` as fairseq-train would, for a vocabulary of ``vocab_size`` symbols (specials included).

    ``target_vocab_size`` gives the target side its own dictionary (default: one joined dictionary).
    ``meta=True`` builds on PyTorch's meta device: shapes only, for counting parameters.
    """
    import torch
    from fairseq.models import ARCH_MODEL_REGISTRY

    args = parse_arch_args(arch, extra)
    task = _Task(vocab_size, target_vocab_size)
    if meta:
        with torch.device("meta"):
            return ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


def check_arch(parser, names: Iterable[str], option: str = "--arch") -> None:
    """Stop with a clear message if any of ``names`` is not a registered architecture."""
    known = set(registered_archs())
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(
            f"{option} {', '.join(unknown)} is not a registered architecture; "
            "see `python -m scripts.analysis.param_table` for the plugin's names"
        )


def add_checkpoint_options(p, what: str, out: str) -> None:
    """The options of a tool that measures a trained checkpoint on real sentences: CKPT, --data, --subset,
    --sentences, --out (``what``: the checkpoint's kind, with its paper)."""
    p.add_argument("checkpoint", type=Path, help=f"a fairseq checkpoint of {what}")
    p.add_argument("--data", type=Path, required=True, help="the data-bin directory the model was trained on")
    p.add_argument("--subset", default="valid", help="the split to read (default valid)")
    p.add_argument("--sentences", type=int_option("--sentences", 1, 100000), default=200,
                   help="sentences to measure on, the split's first ones (default 200, 1-100000)")
    p.add_argument("--out", type=Path, default=Path(out), help="output prefix: PREFIX.csv/.json/.png")


def load_checkpoint(parser, args):
    """The model of ``args.checkpoint`` and ``args.sentences`` one-sentence batches (``net_input`` dicts, so no
    padding) of ``args.subset``; a missing checkpoint or a directory that is not a data-bin stops ``parser``."""
    if not args.checkpoint.is_file():
        parser.error(f"checkpoint {args.checkpoint} does not exist")
    if not (args.data / "dict.txt").is_file() and not list(args.data.glob("dict.*.txt")):
        parser.error(f"--data {args.data}: not a fairseq data-bin directory (no dict*.txt)")
    from fairseq import checkpoint_utils

    import fairseq_plugins  # noqa: F401  (registers the architectures the checkpoint names)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(args.checkpoint)], arg_overrides={"data": str(args.data)}
    )
    task.load_dataset(args.subset)
    itr = task.get_batch_iterator(task.dataset(args.subset), max_sentences=1).next_epoch_itr(shuffle=False)
    return models[0], [sample["net_input"] for sample, _ in zip(itr, range(args.sentences), strict=False)]


def measure_checkpoint(parser, argv, measure) -> tuple:
    """The shared start of the checkpoint tools' main: parse ``argv``, load the checkpoint and its sentences and
    run ``measure(model, batches)``, whose refusal of the model (ValueError) stops ``parser`` naming the
    checkpoint. Returns (args, rows, the result's header: checkpoint, subset, sentences)."""
    args = parser.parse_args(argv)
    model, batches = load_checkpoint(parser, args)
    try:
        rows = measure(model, batches)
    except ValueError as error:
        parser.error(f"{args.checkpoint.name}: {error}")
    return args, rows, {"checkpoint": args.checkpoint.name, "subset": args.subset, "sentences": len(batches)}


def observe(model, batches, collector, missing: str | None = None) -> list[dict]:
    """Teacher-forced passes of ``model`` (eval mode, no autograd) over ``batches`` (``net_input`` dicts) with
    ``collector``'s hooks on; returns ``collector.rows()``, its hooks removed whatever happens. With ``missing``,
    a collector that found no units (``collector.units`` empty) raises ValueError(missing) instead."""
    import torch

    if missing is not None and not collector.units:
        collector.close()
        raise ValueError(missing)
    model.eval()
    try:
        with torch.no_grad():
            for net_input in batches:
                model(**net_input)
    finally:
        collector.close()
    return collector.rows()


def with_suffix(prefix: Path, suffix: str) -> Path:
    """``prefix`` + ``suffix``: an output prefix may contain dots, which ``Path.with_suffix`` would cut."""
    return prefix.parent / (prefix.name + suffix)


def write_csv(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` (dicts with the same keys, in order) as CSV with a header."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=1) + "\n")


def pyplot():
    """matplotlib's pyplot on the Agg backend: the tools run headless and only write files."""
    import logging

    # fairseq configures the root logger at import; matplotlib would then log its font search at DEBUG
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
