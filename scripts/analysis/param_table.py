#!/usr/bin/env python
"""Print every named architecture of the plugin as a Markdown table: layers, widths and the parameter
count of the built model for a given vocabulary, next to its matched Pre-LN baseline.

    python scripts/analysis/param_table.py --vocab-size 32000 > table.md
    python scripts/analysis/param_table.py --family residual --family transformer_preln --width iwslt

Models are built on PyTorch's meta device (shapes only, no memory, no initialisation cost), through
fairseq's own argument parser, exactly as ``fairseq-train --arch NAME`` would build them.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.models.presets import PRESETS, WIDTHS

SHARING = {
    "all": ["--share-all-embeddings"],
    "decoder": ["--share-decoder-input-output-embed"],
    "none": [],
}


class _Task:
    def __init__(self, vocab_size: int):
        d = Dictionary()
        for i in range(vocab_size - d.nspecial):
            d.add_symbol(f"w{i}")
        d.finalize(padding_factor=1)
        self.source_dictionary = self.target_dictionary = d


def count_parameters(arch: str, task, extra: list[str]) -> int:
    """Parameters of ``--arch arch`` as fairseq-train builds it, shared parameters counted once."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["unused-data-dir", "--arch", arch, "--task", "translation", "--cpu", *extra]
    )
    with torch.device("meta"):
        model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once


def matched_baseline(arch: str) -> str | None:
    """The transformer_preln_* preset with the same width and depth as ``arch``."""
    preset = PRESETS[arch]
    for other in PRESETS.values():
        if (
            other.family == "transformer_preln"
            and other.width == preset.width
            and (other.encoder_layers, other.decoder_layers) == (preset.encoder_layers, preset.decoder_layers)
        ):
            return other.arch
    return None


def long_table(rows: list[dict]) -> str:
    lines = ["| arch | family | enc | dec | d_model | d_ffn | heads | parameters | vs matched Pre-LN |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        delta = "" if r["vs_baseline"] is None else f"{r['vs_baseline']:+,}"
        lines.append(f"| `{r['arch']}` | {r['family']} | {r['encoder_layers']} | {r['decoder_layers']} | "
                     f"{r['embed_dim']} | {r['ffn_dim']} | {r['heads']} | {r['parameters']:,} | {delta} |")  # fmt: skip
    return "\n".join(lines)


def wide_table(rows: list[dict]) -> str:
    """One row per (width, depth), one column per family: the parameter count, and the difference to the
    matched Pre-LN model where there is one and it is not zero."""
    families = list(dict.fromkeys(r["family"] for r in rows))
    shapes: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        shape = (r["embed_dim"], r["ffn_dim"], r["heads"], r["encoder_layers"], r["decoder_layers"])
        shapes.setdefault(shape, {})[r["family"]] = r
    lines = ["| d_model/d_ffn/heads | E/D | " + " | ".join(families) + " |",
             "|---|---|" + "---:|" * len(families)]  # fmt: skip
    for (dim, ffn, heads, enc, dec), by_family in shapes.items():
        cells = []
        for family in families:
            r = by_family.get(family)
            if r is None:
                cells.append("")
                continue
            delta = r["vs_baseline"]
            delta = "" if not delta else f" ({delta / 1e6:+.2f}M)" if abs(delta) >= 1e5 else f" ({delta:+,})"
            cells.append(f"{r['parameters'] / 1e6:.2f}M{delta}")
        lines.append(f"| {dim}/{ffn}/{heads} | E{enc}D{dec} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=32000, help="joint vocabulary size (default 32000)")
    parser.add_argument("--share", choices=sorted(SHARING), default="all",
                        help="embedding sharing: all (joint dictionary, as in the recipes), decoder "
                        "(decoder input/output only) or none (default all)")  # fmt: skip
    parser.add_argument("--family", action="append", help="only these families (repeatable)")
    parser.add_argument("--width", action="append", choices=[w.rstrip("_") or "base" for w in WIDTHS],
                        help="only these widths (repeatable)")  # fmt: skip
    parser.add_argument("--layout", choices=["long", "wide"], default="long",
                        help="long: one row per architecture (default); wide: one row per width and depth, "
                        "one column per family (the README's table)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if args.vocab_size < 8:
        parser.error("--vocab-size must be at least 8")

    families = sorted({p.family for p in PRESETS.values()})
    unknown = set(args.family or []) - set(families)
    if unknown:
        parser.error(f"--family {', '.join(sorted(unknown))} is not registered; choose from {', '.join(families)}")

    task = _Task(args.vocab_size)
    extra = SHARING[args.share]
    counts: dict[str, int] = {}
    rows = []
    for arch, preset in PRESETS.items():
        width_name = next(k for k, w in WIDTHS.items() if w == preset.width).rstrip("_") or "base"
        if args.family and preset.family not in args.family or args.width and width_name not in args.width:
            continue
        for name in filter(None, [arch, matched_baseline(arch)]):
            if name not in counts:
                counts[name] = count_parameters(name, task, extra)
        baseline = matched_baseline(arch)
        rows.append({
            "arch": arch, "family": preset.family, "encoder_layers": preset.encoder_layers,
            "decoder_layers": preset.decoder_layers, "embed_dim": preset.width.embed_dim,
            "ffn_dim": preset.width.ffn_dim, "heads": preset.width.heads, "parameters": counts[arch],
            "baseline": baseline, "vs_baseline": counts[arch] - counts[baseline] if baseline else None,
        })  # fmt: skip

    print(f"Parameters for a joint vocabulary of {args.vocab_size} ({args.share} embeddings shared).\n")
    print(long_table(rows) if args.layout == "long" else wide_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
