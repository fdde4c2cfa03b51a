"""``param_table.py --paper crossformer``: every #Params row of Crossformer's tables 1-3 beside this project's count
of the same model for the same dictionaries (see param_table.py's docstring for how a row matches or says why
not)."""

import argparse
from dataclasses import dataclass

from fairseq_plugins.models.presets import PRESETS
from fairseq_plugins.validation import PluginOptionError
from scripts.analysis.analysis_common import check_int
from scripts.analysis.param_count import SHARING, count_parameters

MILLION = 1_000_000
ROUNDING = MILLION // 2  # the papers print whole millions: a count within 0.5M rounds to the printed number


@dataclass(frozen=True)
class Vocabulary:
    """One data set's dictionaries as fairseq builds them, and which embeddings the paper's count shares."""

    option: str  # the command-line option that overrides ``sizes``
    title: str
    sizes: tuple[int, ...]  # (joint,) or (source, target): entries of each dictionary, specials included
    share: str  # a SHARING key
    source: str


# Defaults: the dictionaries fairseq's own preparation gives, as the Crossformer paper says it used them
# ("fairseq ... provided scripts for data pre-processing"; En-Fr "replicate[s] the setup of Gehring et al.").
# The sharing is the one each paper row implies; `alternatives` below shows the others miss.
CROSSFORMER_VOCABULARIES = {
    "iwslt14_de_en": Vocabulary(
        "--iwslt14-vocab", "IWSLT'14 De-En", (8848, 6632), "decoder",
        "fairseq's examples/translation/prepare-iwslt14.sh (BPE 10k) binarized with fairseq-preprocess "
        "without --joined-dictionary: '[de] Dictionary: 8848 types', '[en] Dictionary: 6632 types' "
        "(padding to a multiple of 8 included); fairseq's transformer_iwslt_de_en recipe shares the decoder's "
        "input and output embeddings",
    ),
    "wmt14_en_de": Vocabulary(
        "--wmt14-en-de-vocab", "WMT'14 En-De", (32768,), "all",
        "fairseq's examples/scaling_nmt (Vaswani et al.'s joint 32k BPE, fairseq-preprocess "
        "--joined-dictionary --nwordssrc 32768 --nwordstgt 32768): '[en] Dictionary: 32768 types', as in "
        "fairseq's wmt16.en-de.joined-dict.transformer; trained with --share-all-embeddings",
    ),
    "wmt14_en_fr": Vocabulary(
        "--wmt14-en-fr-vocab", "WMT'14 En-Fr", (43771, 43807), "decoder",
        "fairseq's wmt14.en-fr.fconv-py (Gehring et al. 2017: joint 40k BPE, separate dictionaries): "
        "'[en] dictionary: 43771 types', '[fr] dictionary: 43807 types' (older fairseq docs print "
        "44206 / 44463); the paper's 89M needs separate source and target embeddings",
    ),
}

# Other dictionaries and sharing, checked against the paper's Transformer E6D6 rows: (dataset, sizes, share,
# what they are). Each misses the paper's count, which is how the defaults above were chosen.
CROSSFORMER_ALTERNATIVES = [
    ("iwslt14_de_en", None, "none", "no embedding shared"),
    ("wmt14_en_de", None, "decoder", "joint dictionary, decoder input/output shared only"),
    ("wmt14_en_fr", (44512,), "all", ("fairseq's wmt14.en-fr.joined-dict.transformer dictionary (Ott et al. "
     "2018, joint 40k BPE), all embeddings shared")),
    ("wmt14_en_fr", (44206, 44463), "decoder", ("the dictionary sizes of older fairseq docs for "
     "wmt14.en-fr.fconv-py")),
]  # fmt: skip


@dataclass(frozen=True)
class PaperRow:
    table: str
    column: str
    dataset: str  # a CROSSFORMER_VOCABULARIES key
    model: str
    layers: str
    paper_m: int  # #Params as printed, in millions
    arch: str
    blocks: str | None = None  # the Crossformer models' blocks: --tying (hard guidance) or --guidance (soft)


def _crossformer_rows() -> list[PaperRow]:
    """Every #Params row of Crossformer tables 1-3, in the paper's order."""
    rows = []
    hg = [("Crossformer-FFN", "ffn"), ("Crossformer-Value", "value"), ("Crossformer-Key-Query", "key-query")]
    iwslt_sg = ["IWSLT'14 De-En, soft guidance", [52, 52, 52, 52]]
    iwslt_hg = ["IWSLT'14 De-En, hard guidance", [52, 39, 48, 48]]
    for (column, counts), family in ((iwslt_sg, "crossformer_sg"), (iwslt_hg, "crossformer_hg")):
        rows.append(PaperRow("1", column, "iwslt14_de_en", "Transformer", "6", counts[0], "transformer_preln_e6d6"))
        for (model, guidance), count in zip(hg, counts[1:]):
            rows.append(PaperRow("1", column, "iwslt14_de_en", model, "6", count, f"{family}_e6d6", guidance))
    for table, depth, datasets in (
        ("2", "e6d6", {"wmt14_en_de": [61, 47, 57, 57, 60], "wmt14_en_fr": [89, 75, 85, 85, 88]}),
        ("3", "e36d6", {"wmt14_en_de": [155, 111, 142, 142], "wmt14_en_fr": [183, 139, 171, 171]}),
    ):
        layers = depth[1:].split("d")[0]
        for dataset, counts in datasets.items():
            column = CROSSFORMER_VOCABULARIES[dataset].title
            rows.append(PaperRow(table, column, dataset, "Transformer", layers, counts[0], f"transformer_preln_{depth}"))
            for (model, guidance), count in zip(hg, counts[1:4]):
                rows.append(PaperRow(table, column, dataset, model, layers, count, f"crossformer_hg_{depth}", guidance))
            if len(counts) == 5:
                rows.append(PaperRow(table, column, dataset, "Crossformer-All", "16", counts[4], "crossformer_all_e16d6"))
    return rows


# Section 2.2, "Model proprieties": what one hard-guided block saves, in d_m^2 (FFN: one of its d_m x 4 d_m
# matrices). The paper's counts of T-layer stacks are read against T such savings per stack.
PAPER_BLOCK_SAVING = {"key-query": 1, "ffn": 4, "value": 1}
EQUATION = {"key-query": "3", "ffn": "5", "value": "6"}


def _tie_sizes(block: str, d: int, d_ffn: int) -> int:
    """Parameters one more tied projection of ``block`` removes: a d x d projection with its bias, or a
    W2-shaped FFN matrix (d_ffn x d + d; a W1 removes d_ffn - d more)."""
    return d_ffn * d + d if block == "ffn" else d * d + d


def _ties_needed(excess: int, unit: int) -> tuple[int, int] | None:
    """The whole numbers n of further tied projections of ``unit`` parameters that bring a count ``excess``
    above the paper's printed number to within its rounding, as (lowest, highest); None if there is none."""
    low = (excess - ROUNDING) // unit + 1
    high = -((-(excess + ROUNDING)) // unit) - 1
    low = max(low, 0)
    return (low, high) if low <= high else None


def _vocabulary_settings(vocab: Vocabulary) -> tuple[list[str], int, int | None]:
    sizes = vocab.sizes
    return SHARING[vocab.share], sizes[0], (sizes[1] if len(sizes) == 2 else None)


def crossformer_param_rows(vocabularies: dict[str, Vocabulary]) -> list[dict]:
    """One dict per #Params row of Crossformer tables 1-3: the paper's number, this project's count of the
    same model built as fairseq-train builds it for the same dictionaries, and why they differ if they do."""
    from fairseq_plugins.modules.cross_layer_guidance import BLOCKS, guidance_pairs

    cache: dict[tuple, int] = {}

    def count(arch, extra, source, target):
        key = (arch, tuple(extra), source, target)
        if key not in cache:
            cache[key] = count_parameters(arch, list(extra), source, target)
        return cache[key]

    out = []
    for row in _crossformer_rows():
        vocab = vocabularies[row.dataset]
        share_args, source, target = _vocabulary_settings(vocab)
        preset = PRESETS[row.arch]
        hard = preset.model == "crossformer_hg"
        guidance = ["--tying" if hard else "--guidance", row.blocks] if row.blocks else []
        params = count(row.arch, [*guidance, *share_args], source, target)
        paper = row.paper_m * MILLION
        entry = {
            "table": row.table, "column": row.column, "model": row.model, "layers": row.layers,
            "paper_params": paper, "params": params, "difference": params - paper,
            "within_rounding": abs(params - paper) < ROUNDING, "within_truncation": params // MILLION == row.paper_m,
            "settings": {
                "arch": row.arch, "args": [*guidance, *share_args],
                "source_dictionary": source, "target_dictionary": target or source, "dataset": row.dataset,
            },
            "note": "",
        }  # fmt: skip
        if row.model == "Transformer":
            entry["note"] = _transformer_note(entry, vocab, preset)
            if row.arch == "transformer_preln_e6d6" and row.column != "IWSLT'14 De-En, hard guidance":
                entry["alternatives"] = _alternatives(row, count)
        elif hard:
            guided = row.blocks or preset.settings["tying"]  # crossformer_all_e16d6: "all"
            blocks = BLOCKS if guided == "all" else tuple(guided.split(","))
            # the Pre-LN transformer of the same width and depth (presets are defaults: the depth overrides)
            base = next(p.arch for p in PRESETS.values() if p.family == "transformer_preln" and p.width == preset.width)
            depth = ["--encoder-layers", str(preset.encoder_layers), "--decoder-layers", str(preset.decoder_layers)]
            transformer = count(base, [*depth, *share_args], source, target)
            d, d_ffn = preset.width.embed_dim, preset.width.ffn_dim
            pairs = len(guidance_pairs(preset.encoder_layers, blocks)) + len(guidance_pairs(preset.decoder_layers, blocks))
            layers = preset.encoder_layers + preset.decoder_layers
            formula = transformer - sum(PAPER_BLOCK_SAVING[b] for b in blocks) * d * d * layers
            entry["tied_pairs"] = pairs
            entry["paper_formula_params"] = formula
            entry["ties_needed"] = {b: _ties_needed(params - paper, _tie_sizes(b, d, d_ffn)) for b in blocks}
            entry["note"] = _hard_guidance_note(entry, blocks, pairs, layers, formula)
        elif not entry["within_rounding"]:
            entry["note"] = "soft guidance adds no parameters; the count is its Transformer's"
        out.append(entry)
    _mark_inconsistent(out)
    return out


def _transformer_note(entry: dict, vocab: Vocabulary, preset) -> str:
    if entry["within_rounding"]:
        return ""
    d = preset.width.embed_dim
    source, target = entry["settings"]["source_dictionary"], entry["settings"]["target_dictionary"]
    if len(vocab.sizes) == 1:  # one joint dictionary: each entry is a row of every unshared table
        entries, width, what = source, d * {"all": 1, "decoder": 2, "none": 3}[vocab.share], "joint entries"
    else:
        extra_target = vocab.share == "none"
        entries, width = source + (2 if extra_target else 1) * target, d
        what = "source + 2 x target entries" if extra_target else "source + target entries"
    diff = entry["difference"]
    low = entries + (-ROUNDING - diff) // width + 1
    high = entries - (-(ROUNDING - diff) // width) - 1
    truncated = "it does" if entry["within_truncation"] else "it does not either"
    return (f"{diff / MILLION:+.2f}M off: the paper's count needs {low:,}-{high:,} {what} (these dictionaries: "
            f"{entries:,}), or a count truncated rather than rounded ({truncated})")


def _alternatives(row: PaperRow, count) -> list[dict]:
    out = []
    for dataset, sizes, share, what in CROSSFORMER_ALTERNATIVES:
        if dataset != row.dataset:
            continue
        sizes = sizes or CROSSFORMER_VOCABULARIES[dataset].sizes
        vocab = Vocabulary("", "", sizes, share, what)
        share_args, source, target = _vocabulary_settings(vocab)
        params = count(row.arch, share_args, source, target)
        out.append({
            "settings": {"args": share_args, "source_dictionary": source, "target_dictionary": target or source},
            "what": what, "params": params, "within_rounding": abs(params - row.paper_m * MILLION) < ROUNDING,
        })  # fmt: skip
    return out


def _hard_guidance_note(entry: dict, blocks, pairs: int, layers: int, formula: int) -> str:
    if entry["within_rounding"]:
        return ""
    saving = "+".join(f"{PAPER_BLOCK_SAVING[b]}" for b in blocks)
    needs = []
    for block, span in entry["ties_needed"].items():
        if span:
            n = f"{span[0]}" if span[0] == span[1] else f"{span[0]}-{span[1]}"
            what = ("FFN matrix" if n == "1" else "FFN matrices") if block == "ffn" else f"{block} projection(s)"
            needs.append(f"{n} more tied {what}")
    need = " or ".join(needs) if needs else "no whole number of further ties of these blocks"
    formula_ok = "matches" if abs(formula - entry["paper_params"]) < ROUNDING else "misses too"
    equations = "/".join(EQUATION[b] for b in blocks)
    return (f"{entry['difference'] / MILLION:+.2f}M: eq. {equations} tie{'s' if len(blocks) == 1 else ''} {pairs} "
            f"pairs (T-1 per stack); the paper's count needs {need}. Its per-block count ({saving} d_m^2 saved in "
            f"each of the {layers} layers, section 2.2) gives {formula / MILLION:.2f}M and {formula_ok}")  # fmt: skip


def _mark_inconsistent(rows: list[dict]) -> None:
    """One architecture and guidance appears in several columns with the same shape, so the number of ties
    the paper implies must be the same in each; say where the paper's own counts rule that out."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "ties_needed" in r:
            groups.setdefault((r["settings"]["arch"], r["model"]), []).append(r)
    for group in groups.values():
        if len(group) < 2:
            continue
        consistent = False
        for block in group[0]["ties_needed"]:
            spans = [r["ties_needed"][block] for r in group]
            consistent |= all(spans) and max(s[0] for s in spans) <= min(s[1] for s in spans)
        if consistent:
            continue
        savings = ", ".join(f"{r['column']} {_paper_saving(r, rows)}M" for r in group)
        for r in group:
            if not r["within_rounding"]:
                r["note"] += (f". No one number of further ties fits every column of this model: the paper's own "
                              f"savings over its Transformer differ ({savings})")  # fmt: skip


def _paper_saving(row: dict, rows: list[dict]) -> int:
    """The paper's Transformer minus the paper's count of ``row``, in the same table and column (in M)."""
    base = next(r for r in rows if r["table"] == row["table"] and r["column"] == row["column"]
                and r["model"] == "Transformer")  # fmt: skip
    return (base["paper_params"] - row["paper_params"]) // MILLION


def _sizes_option(option: str):
    """argparse ``type=`` for ``N`` (one joint dictionary) or ``SRC,TGT`` (separate ones), entries >= 8."""
    name = option.lstrip("-").replace("-", "_")

    def parse(text: str) -> tuple[int, ...]:
        parts = text.split(",")
        if len(parts) > 2:
            raise argparse.ArgumentTypeError(f"{option} takes N or SRC,TGT, got {text!r}")
        try:
            return tuple(check_int(name, part, 8, 10_000_000) for part in parts)
        except PluginOptionError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = name
    return parse


def paper_table(rows: list[dict], vocabularies: dict[str, Vocabulary]) -> str:
    lines = [("Crossformer tables 1-3, #Params as printed beside this project's count of the same model, built as "
             "fairseq-train builds it (parameters shared by embeddings or hard guidance counted once)."), "",
             "Dictionaries (entries with fairseq's specials and padding) and embedding sharing:"]  # fmt: skip
    for v in vocabularies.values():
        sizes = " / ".join(f"{n:,}" for n in v.sizes)
        shared = " ".join(SHARING[v.share]) or "no embedding shared"
        lines.append(f"- {v.title}: {sizes} ({v.option}), {shared}: {v.source}")
    lines += ["", "| table | column | model | layers | arch and options | paper | ours | ours - paper | within 0.5M |",
              "|---|---|---|---:|---|---:|---:|---:|---|"]  # fmt: skip
    notes = []
    for r in rows:
        options = " ".join(a for a in r["settings"]["args"] if not a.startswith("--share"))
        mark = "yes" if r["within_rounding"] else "no"
        if r["note"]:
            notes.append(r["note"])
            mark += f" [{len(notes)}]"
        lines.append(f"| {r['table']} | {r['column']} | {r['model']} | {r['layers']} | "
                     f"`{r['settings']['arch']}{' ' + options if options else ''}` | {r['paper_params'] // MILLION}M | "
                     f"{r['params'] / MILLION:.2f}M | {r['difference'] / MILLION:+.2f}M | {mark} |")  # fmt: skip
    lines += ["", *(f"[{i}] {note}." for i, note in enumerate(notes, 1))]
    checks = [(r, a) for r in rows for a in r.get("alternatives", [])]
    if checks:
        lines += ["", "Other dictionaries and sharing, against the paper's Transformer E6D6 rows:"]
        for r, a in checks:
            verdict = "fits" if a["within_rounding"] else "misses"
            lines.append(f"- {CROSSFORMER_VOCABULARIES[r['settings']['dataset']].title}, {a['what']} ({a['settings']['source_dictionary']:,} / "
                         f"{a['settings']['target_dictionary']:,}): {a['params'] / MILLION:.2f}M, {verdict} "
                         f"{r['paper_params'] // MILLION}M")  # fmt: skip
    return "\n".join(lines)
