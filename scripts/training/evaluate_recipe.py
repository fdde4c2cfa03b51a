#!/usr/bin/env python
"""Translate a prepared test set with fairseq-generate and score it with sacrebleu (recipes/evaluate.sh).

    python -m scripts.training.evaluate_recipe wmt14_en_de checkpoints/wmt14_en_de/residual_e18d18
    python -m scripts.training.evaluate_recipe data-bin/iwslt14_en_de path/to/checkpoint_best.pt --beam 5

Decoding follows the papers: beam 4 and length penalty 0.6 on WMT (Vaswani et al., Crossformer A.1) and
OPUS-100 (Zhang et al. 2020), beam 5 and length penalty 1.0 on IWSLT-14 and Multi30k; the dataset's
``recipe.json`` (written by recipes/prepare_*.sh) holds them, ``--beam``/``--lenpen`` override.

Every test sentence is translated (``--required-batch-size-multiple 1``: this fairseq build drops a final
partial batch otherwise) and the run fails if the number of hypotheses differs from the references. BPE is
removed, Moses tokenisation undone (sacremoses), and the detokenised text scored against the raw references:

- sacreBLEU and chrF with their signatures (the comparable numbers); sacreBLEU tokenises by the target
  language as sacrebleu prescribes: ``zh`` for Chinese, ``ja-mecab`` for Japanese, ``ko-mecab`` for Korean
  (their MeCab dictionaries come with ``pip install 'sacrebleu[ja,ko]'``, about 50 MB; without them those
  sets are scored with ``char`` and the results say so), ``13a`` otherwise;
- tokenised BLEU as the papers report it: hypothesis and reference Moses-tokenised the same way, with
  compound splitting (``a-b`` -> ``a ##AT##-##AT## b``, fairseq's compound_split_bleu.sh) for WMT En-De;
- fairseq-generate's own BLEU on its tokens, per subset (the usual IWSLT-14 number);
- averages where the papers average: newstest2010-2016 (ResiDual tables 6-7), OPUS-100 EX/XE/ALL (ResiDual
  table 4: the mean sacreBLEU over the from-English, the to-English and all directions).

A multilingual dataset (recipe.json ``"task": "translation_multi_simple_epoch"``, OPUS-100) is translated
one direction at a time with fairseq's multilingual task (scripts/training/multilingual.py).

A checkpoint directory means its averaged checkpoint (checkpoint_avgN.pt) if there is one, else
checkpoint_best.pt, else checkpoint_last.pt. Results go to ``--output-dir`` (default: next to the checkpoint):
hypotheses per test set, results.json and results.md.
"""

import argparse
import re
import statistics
from pathlib import Path

from scripts.training import multilingual
from scripts.training.training_common import (
    PLUGIN_DIR,
    REPO,
    RecipeError,
    atomic_path,
    fairseq_module,
    log,
    read_lines,
    read_manifest,
    run_command,
    run_main,
    split_passthrough,
    write_json,
    write_lines,
)

TAG = "evaluate"


def parse_args(argv=None):
    own, extra = split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s [options] DATASET CHECKPOINT [-- fairseq-generate options]")  # fmt: skip
    p.add_argument("dataset", help="a prepared dataset: data-bin/NAME or a directory with recipe.json")
    p.add_argument("checkpoint", type=Path, help="a checkpoint file, or a save directory")
    p.add_argument("--beam", type=int, help="beam size (default: the dataset's, see above)")
    p.add_argument("--lenpen", type=float, help="length penalty (default: the dataset's)")
    p.add_argument("--sets", help="comma-separated test set names (default: all the dataset has)")
    p.add_argument("--max-tokens", type=int, default=8000, help="tokens per generation batch (default 8000)")
    p.add_argument("--gpu", default="auto", help="auto (use a GPU if visible), 1 or 0")
    p.add_argument("--output-dir", type=Path, help="where results go (default CHECKPOINT_DIR/eval_STEM_DATASET)")
    args = p.parse_args(own)
    args.extra = extra
    if args.gpu not in ("auto", "1", "0"):
        raise RecipeError(f"--gpu {args.gpu!r} (GPU): allowed auto, 1, 0")
    if args.beam is not None and args.beam < 1:
        raise RecipeError(f"--beam {args.beam} (BEAM): must be >= 1")
    return args


def resolve_checkpoint(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        averaged = sorted(path.glob("checkpoint_avg*.pt"), key=lambda p: p.stat().st_mtime)
        for candidate in [*averaged[-1:], path / "checkpoint_best.pt", path / "checkpoint_last.pt"]:
            if candidate.is_file():
                return candidate
        raise RecipeError(f"CHECKPOINT={path}: no checkpoint_avg*.pt, checkpoint_best.pt or checkpoint_last.pt")
    raise RecipeError(f"CHECKPOINT={path}: no such file or directory")


def compound_split(line: str) -> str:
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


# sacrebleu's tokenizers for languages written without spaces between words (sacrebleu's README)
SACREBLEU_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
FALLBACK_TOKENIZER = "char"


def bleu_tokenizer(lang: str) -> tuple[str, str | None]:
    """(sacreBLEU tokenizer for target language ``lang``, a note when the right one is not installed)."""
    from sacrebleu.metrics import BLEU

    wanted = SACREBLEU_TOKENIZERS.get(lang, "13a")
    try:
        BLEU(tokenize=wanted)
    except RuntimeError:  # sacrebleu raises this when MeCab or its dictionary is missing
        return FALLBACK_TOKENIZER, (
            f"{lang}: sacreBLEU's {wanted} tokenizer is not installed (pip install 'sacrebleu[{lang}]'); "
            f"scored with tokenize={FALLBACK_TOKENIZER}, not comparable with published {wanted} scores"
        )
    return wanted, None


class Scorer:
    def __init__(self, lang: str, compound: bool):
        from sacrebleu.metrics import BLEU, CHRF
        from sacremoses import MosesTokenizer

        self.tokenizer_name, self.note = bleu_tokenizer(lang)
        self.bleu, self.chrf = BLEU(tokenize=self.tokenizer_name), CHRF()
        self.tok_bleu = BLEU(tokenize="none", force=True)
        self.tokenizer = MosesTokenizer(lang=lang)
        self.compound = compound

    def tokenize(self, line: str) -> str:
        out = self.tokenizer.tokenize(line, return_str=True, escape=False)
        return compound_split(out) if self.compound else out

    def score(self, hyps: list[str], refs: list[str]) -> dict:
        bleu = self.bleu.corpus_score(hyps, [refs])
        chrf = self.chrf.corpus_score(hyps, [refs])
        tok = self.tok_bleu.corpus_score([self.tokenize(h) for h in hyps], [[self.tokenize(r) for r in refs]])
        return {"sentences": len(hyps), "bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2),
                "tokenized_bleu": round(tok.score, 2), "sacrebleu_tokenizer": self.tokenizer_name}  # fmt: skip

    def signatures(self) -> dict:
        return {"bleu": str(self.bleu.get_signature()), "chrf": str(self.chrf.get_signature()),
                "tokenized_bleu": "Moses tokenizer (sacremoses), " + ("compound splitting, " if self.compound else "")
                + str(self.tok_bleu.get_signature())}  # fmt: skip


def use_gpu(choice: str) -> bool:
    import torch

    available = torch.cuda.is_available()
    if choice == "1" and not available:
        raise RecipeError("--gpu 1 (GPU=1): no CUDA device visible")
    return available if choice == "auto" else choice == "1"


def generate(args, data: Path, manifest: dict, checkpoint: Path, split: str, src: str, tgt: str, size: int,
             gpu: bool) -> tuple[list[str], str]:  # fmt: skip
    """Hypotheses of subset ``split`` (direction ``src``->``tgt``) in sentence order, checked to be exactly
    ``size``; raw output."""
    remove = "sentencepiece" if manifest["segmentation"] == "sentencepiece" else "subword_nmt"
    if manifest.get("task") == multilingual.TASK:
        task = multilingual.generate_args(manifest, src, tgt)
    else:
        task = ["--task", "translation", "--source-lang", src, "--target-lang", tgt]
    cmd = fairseq_module("generate") + [
        data, "--user-dir", PLUGIN_DIR, "--path", checkpoint, *task,
        "--gen-subset", split, "--beam", str(args.beam), "--lenpen", repr(args.lenpen),
        "--max-tokens", str(args.max_tokens), "--required-batch-size-multiple", "1",
        "--post-process", remove, "--num-workers", "0",
    ]  # fmt: skip
    cmd += ["--fp16"] if gpu else ["--cpu"]
    cmd += args.extra
    log(TAG, f"fairseq-generate on {split} {src}->{tgt} ({size} sentences), beam {args.beam}, lenpen {args.lenpen}")
    output = run_command(TAG, cmd, quiet=True)
    hyps = {}
    for line in output.splitlines():
        if line.startswith("H-"):
            key, _score, *text = line.split("\t")
            hyps[int(key[2:])] = text[0] if text else ""
    if sorted(hyps) != list(range(size)):
        raise RecipeError(
            f"fairseq-generate translated {len(hyps)} of the {size} sentences of {split} ({src}->{tgt}): refusing "
            "to score a partial test set"
        )
    return [hyps[i] for i in range(size)], output


def detokenize(lines: list[str], manifest: dict) -> list[str]:
    if manifest["detokenizer"] != "moses":
        return lines
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=manifest["target_lang"])
    return [detok.detokenize(line.split(), unescape=True) for line in lines]


def markdown(results: dict) -> str:
    rows = ["| test set | sentences | sacreBLEU | chrF | tokenised BLEU |", "|---|---:|---:|---:|---:|"]
    for name, r in results["tests"].items():
        tok = "" if r["sacrebleu_tokenizer"] == "13a" else f" ({r['sacrebleu_tokenizer']})"
        rows.append(f"| {name} | {r['sentences']} | {r['bleu']:.2f}{tok} | {r['chrf']:.2f} | {r['tokenized_bleu']:.2f} |")
    for name, r in results["averages"].items():
        rows.append(f"| **{name}** (mean of {r['sets']}) | | {r['bleu']:.2f} | {r['chrf']:.2f} | "
                    f"{r['tokenized_bleu']:.2f} |")  # fmt: skip
    sig = results["signatures"]
    lines = [f"Checkpoint `{results['checkpoint']}`, beam {results['beam']}, lenpen {results['lenpen']}.", "",
             *rows, "", *(f"- sacreBLEU (tok:{tok}): `{s}`" for tok, s in results["bleu_signatures"].items()),
             f"- chrF: `{sig['chrf']}`", f"- tokenised BLEU: `{sig['tokenized_bleu']}`"]  # fmt: skip
    lines += [f"- fairseq-generate BLEU on {split}: {score}" for split, score in results["fairseq_bleu"].items()]
    lines += [f"- note: {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def averages(tests: dict, groups: dict[str, list[str]]) -> tuple[dict, list[str]]:
    """The mean of each score over each group's test sets (only groups whose every set was scored), and notes
    naming the sets scored with the fallback tokenizer in each. OPUS-100's EX, XE and ALL (ResiDual table 4,
    Zhang et al. 2020) are the plain means over the en->xx, xx->en and all directions."""
    out, notes = {}, []
    for name, members in groups.items():
        if not all(m in tests for m in members):
            continue
        out[name] = {"sets": len(members), **{k: round(statistics.mean(tests[m][k] for m in members), 2)
                                              for k in ("bleu", "chrf", "tokenized_bleu")}}  # fmt: skip
        fallback = [m for m in members if tests[m]["sacrebleu_tokenizer"] == FALLBACK_TOKENIZER]
        if fallback:
            notes.append(f"{name} includes {', '.join(fallback)} scored with tokenize={FALLBACK_TOKENIZER}")
    return out, notes


def direction(test: dict, manifest: dict) -> tuple[str, str]:
    """(source, target language) of a test entry: its own in a multilingual dataset, else the dataset's."""
    return test.get("source_lang", manifest["source_lang"]), test.get("target_lang", manifest["target_lang"])


def main(argv=None):
    args = parse_args(argv)
    data = Path(args.dataset) if Path(args.dataset).is_dir() else REPO / "data-bin" / args.dataset
    if not data.is_dir():
        raise RecipeError(f"DATASET={args.dataset!r}: no data directory {data}")
    manifest = read_manifest(data)
    checkpoint = resolve_checkpoint(args.checkpoint)
    args.beam = args.beam or manifest["beam"]
    args.lenpen = manifest["lenpen"] if args.lenpen is None else args.lenpen
    tests = manifest["tests"]
    if args.sets:
        wanted = args.sets.split(",")
        unknown = sorted(set(wanted) - {t["name"] for t in tests})
        if unknown:
            raise RecipeError(f"--sets (SETS): unknown {', '.join(unknown)}; the dataset has "
                              f"{', '.join(t['name'] for t in tests)}")  # fmt: skip
        tests = [t for t in tests if t["name"] in wanted]
    references = {}
    for t in tests:
        refs = read_lines(data / t["reference"])
        if len(refs) != t["end"] - t["start"]:
            raise RecipeError(f"{data / t['reference']}: {len(refs)} lines, expected {t['end'] - t['start']}")
        references[t["name"]] = refs
    out_dir = args.output_dir or checkpoint.parent / f"eval_{checkpoint.stem}_{data.name}"
    gpu = use_gpu(args.gpu)

    scorers: dict[tuple[str, bool], Scorer] = {}

    def scorer_for(test: dict) -> Scorer:
        # a multilingual set (OPUS-100) names each test set's target language: sacreBLEU's and Moses' tokenizer
        key = (direction(test, manifest)[1], test.get("compound_split", manifest["compound_split"]))
        if key not in scorers:
            scorers[key] = Scorer(*key)
        return scorers[key]

    def job(test: dict) -> tuple[str, str, str]:
        return (test["split"], *direction(test, manifest))

    hyps_by_job, fairseq_bleu = {}, {}
    for key in sorted({job(t) for t in tests}):
        split, src, tgt = key
        size = max(t["end"] for t in manifest["tests"] if job(t) == key)
        raw, output = generate(args, data, manifest, checkpoint, split, src, tgt, size, gpu)
        hyps_by_job[key] = detokenize(raw, manifest)
        match = re.findall(r"BLEU4? = ([\d.]+)", output)
        if match and manifest["segmentation"] != "sentencepiece":
            fairseq_bleu[split] = float(match[-1])
    results = {"checkpoint": str(checkpoint), "data": str(data), "beam": args.beam, "lenpen": args.lenpen,
               "tests": {}, "averages": {}, "fairseq_bleu": fairseq_bleu, "notes": []}  # fmt: skip
    with atomic_path(out_dir) as tmp:
        (tmp / "hyps").mkdir(parents=True)
        for t in tests:
            hyps = hyps_by_job[job(t)][t["start"] : t["end"]]
            write_lines(tmp / "hyps" / f"{t['name']}.{direction(t, manifest)[1]}", hyps)
            scorer = scorer_for(t)
            results["tests"][t["name"]] = scorer.score(hyps, references[t["name"]])
            if scorer.note and scorer.note not in results["notes"]:
                results["notes"].append(scorer.note)
        results["averages"], notes = averages(results["tests"], manifest["averages"])
        results["notes"] += notes
        # chrF and tokenised BLEU share one signature; sacreBLEU's differs by tokenizer (zh, ja-mecab, ...)
        results["signatures"] = next(iter(scorers.values())).signatures()
        results["bleu_signatures"] = {s.tokenizer_name: str(s.bleu.get_signature()) for s in scorers.values()}
        write_json(tmp / "results.json", results)
        (tmp / "results.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results), flush=True)
    log(TAG, f"results in {out_dir}")


if __name__ == "__main__":
    run_main(TAG, main)
