#!/usr/bin/env python
"""Print every named architecture of the plugin as a Markdown table: layers, widths and the parameter
count of the built model for a given vocabulary, next to its matched Pre-LN baseline; or, with --paper,
every #Params row of a paper's tables beside this project's count of the same model.

    python -m scripts.analysis.param_table --vocab-size 32000 > table.md
    python -m scripts.analysis.param_table --family residual --family transformer_preln --width iwslt
    python -m scripts.analysis.param_table --paper crossformer [--format json] [--wmt14-en-fr-vocab 44512 ...]

Models are built on PyTorch's meta device (shapes only, no memory, no initialisation cost), through
fairseq's own argument parser, exactly as ``fairseq-train --arch NAME`` would build them, on dictionaries of
the given sizes (no data needed).

--paper crossformer (Crossformer, tables 1-3): the paper prints whole millions, so a row matches when this
project's count is within 0.5M of it. A row that does not match says why: for a Transformer, the dictionary
sizes the count would need; for hard guidance, how many more tied projections than eq. 3/5/6 define (T-1
pairs per T-layer stack) the count needs, what the paper's own per-block count (section 2.2: 1, 4 and 1 d_m^2
saved per layer for key-query, FFN and value) gives, and where the paper's counts of one architecture in
different columns need different numbers of ties, so no tying reaches them all.
"""

import argparse
import json
from pathlib import Path

from fairseq_plugins.models.presets import PRESETS, WIDTHS
from scripts.analysis.analysis_common import write_json
from scripts.analysis.param_count import SHARING, count_parameters
from scripts.analysis.param_table_crossformer import (  # noqa: F401  (_tie_sizes: tests/test_paper_params.py reads it from here)
    CROSSFORMER_VOCABULARIES,
    Vocabulary,
    _sizes_option,
    _tie_sizes,
    crossformer_param_rows,
    paper_table,
)


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
                        "one column per family (docs/architectures.md's table)")
    parser.add_argument("--format", choices=["markdown", "json"], default="markdown",
                        help="markdown tables (default) or the rows as one JSON list on stdout")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    paper = parser.add_argument_group(
        "a paper's #Params rows (--paper); dictionaries are given as N (one joint dictionary) or SRC,TGT "
        "(separate source and target dictionaries), counted with fairseq's specials and padding"
    )
    paper.add_argument("--paper", choices=["crossformer"],
                       help="print every #Params row of the paper's tables beside this project's count of the same "
                       "model for the same dictionaries, each within the paper's rounding or with the reason "
                       "(Crossformer: tables 1-3); --vocab-size, --share, --family, --width and --layout do not "
                       "apply")  # fmt: skip
    for key, vocab in CROSSFORMER_VOCABULARIES.items():
        default = ",".join(map(str, vocab.sizes))
        paper.add_argument(vocab.option, type=_sizes_option(vocab.option), default=vocab.sizes, metavar="N|SRC,TGT",
                           help=f"{vocab.title} dictionary entries (default {default}: {vocab.source})")  # fmt: skip
        paper.add_argument(vocab.option.replace("-vocab", "-share"), choices=sorted(SHARING), default=vocab.share,
                           help=f"{vocab.title} embedding sharing: all (needs one joint dictionary), decoder "
                           f"(decoder input/output) or none (default {vocab.share}, what the paper's count "
                           "implies)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.vocab_size < 8:
        parser.error("--vocab-size must be at least 8")

    if args.paper:
        vocabularies = {}
        for key, vocab in CROSSFORMER_VOCABULARIES.items():
            dest = vocab.option.lstrip("-").replace("-", "_")
            sizes, share = getattr(args, dest), getattr(args, dest.replace("_vocab", "_share"))
            if share == "all" and len(sizes) == 2 and sizes[0] != sizes[1]:
                parser.error(f"{vocab.option.replace('-vocab', '-share')} all needs one joint dictionary "
                             f"(fairseq's --joined-dictionary): give {vocab.option} N, not {sizes[0]},{sizes[1]}")
            vocabularies[key] = Vocabulary(vocab.option, vocab.title, sizes, share, vocab.source
                                           if (sizes, share) == (vocab.sizes, vocab.share) else "given")
        rows = crossformer_param_rows(vocabularies)
        print(json.dumps(rows, indent=1) if args.format == "json" else paper_table(rows, vocabularies))
        if args.json:
            write_json(args.json, rows)
        return rows

    families = sorted({p.family for p in PRESETS.values()})
    unknown = set(args.family or []) - set(families)
    if unknown:
        parser.error(f"--family {', '.join(sorted(unknown))} is not registered; choose from {', '.join(families)}")

    extra = SHARING[args.share]
    counts: dict[str, int] = {}
    rows = []
    for arch, preset in PRESETS.items():
        width_name = next(k for k, w in WIDTHS.items() if w == preset.width).rstrip("_") or "base"
        if args.family and preset.family not in args.family or args.width and width_name not in args.width:
            continue
        for name in filter(None, [arch, matched_baseline(arch)]):
            if name not in counts:
                counts[name] = count_parameters(name, extra, args.vocab_size)
        baseline = matched_baseline(arch)
        rows.append({
            "arch": arch, "family": preset.family, "encoder_layers": preset.encoder_layers,
            "decoder_layers": preset.decoder_layers, "embed_dim": preset.width.embed_dim,
            "ffn_dim": preset.width.ffn_dim, "heads": preset.width.heads, "parameters": counts[arch],
            "baseline": baseline, "vs_baseline": counts[arch] - counts[baseline] if baseline else None,
        })  # fmt: skip

    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print(f"Parameters for a joint vocabulary of {args.vocab_size} ({args.share} embeddings shared).\n")
        print(long_table(rows) if args.layout == "long" else wide_table(rows))
    if args.json:
        write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
