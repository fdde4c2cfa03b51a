"""Subwords and binarizing of the data preparation scripts (scripts/data/prepare_*.py): joint BPE
(subword-nmt), SentencePiece, fairseq-preprocess run in-process, and fairseq's dictionary. Every name here
is also importable from data_common.
"""

import re
from collections.abc import Sequence
from pathlib import Path

from scripts.data.data_text import WORKERS, concatenate
from scripts.recipe_common import RecipeError, atomic_path, log


def learn_bpe(tag: str, inputs: Sequence[Path], num_symbols: int, codes: Path, workers: int = 1) -> None:
    """Joint BPE with subword-nmt: learn_bpe.py -s num_symbols on the concatenation of ``inputs``."""
    from subword_nmt.learn_bpe import learn_bpe as subword_learn_bpe

    log(tag, f"learning {num_symbols} BPE merges on {', '.join(p.name for p in inputs)}")
    text = codes.with_name(codes.name + ".input")
    concatenate(inputs, text)
    try:
        with open(text, encoding="utf-8") as fin, open(codes, "w", encoding="utf-8") as fout:
            subword_learn_bpe(fin, fout, num_symbols, num_workers=workers)
    finally:
        text.unlink()


class ApplyBPE:
    def __init__(self, codes: Path):
        self.codes = codes

    def __call__(self, lines: list[str]) -> list[str]:
        from subword_nmt.apply_bpe import BPE

        with open(self.codes, encoding="utf-8") as f:
            bpe = BPE(f)
        return [bpe.process_line(line) for line in lines]


def train_sentencepiece(
    tag: str, inputs: Sequence[Path], model_prefix: Path, vocab_size: int, user_symbols: Sequence[str] = (),
    character_coverage: float = 1.0, input_sentence_size: int = 0,
) -> Path:
    """Train a SentencePiece unigram model on the lines of ``inputs``; returns the .model path.

    ``input_sentence_size`` > 0 trains on a random sample of that many lines (large corpora)."""
    import sentencepiece as spm

    log(tag, f"training a {vocab_size}-piece SentencePiece model on {', '.join(p.name for p in inputs[:4])}"
             f"{' ...' if len(inputs) > 4 else ''}")  # fmt: skip
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(str(p) for p in inputs), model_prefix=str(model_prefix), vocab_size=vocab_size,
            character_coverage=character_coverage, model_type="unigram",
            user_defined_symbols=list(user_symbols), input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True, minloglevel=2, num_threads=WORKERS,
            # fairseq's dictionary adds its own specials: keep SentencePiece's out of the vocabulary
            bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
        )  # fmt: skip
    except RuntimeError as err:
        too_high = re.search(r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= (\d+)", str(err))
        if too_high:  # the limit depends on the text: name the variable that sets the size, and what fits
            raise RecipeError(f"VOCAB_SIZE={vocab_size} (--vocab-size): too high for this training text, "
                              f"SentencePiece allows at most {too_high.group(2)}; set VOCAB_SIZE <= "
                              f"{too_high.group(2)} ({err})") from err  # fmt: skip
        raise RecipeError(f"SentencePiece training failed: {err}") from err
    return model_prefix.with_name(model_prefix.name + ".model")


class SentencePieceEncode:
    def __init__(self, model: Path):
        self.model = model

    def __call__(self, lines: list[str]) -> list[str]:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(self.model))
        return [" ".join(pieces) for pieces in sp.encode(lines, out_type=str)]


def binarize(
    tag: str, src: str, tgt: str, prefixes: dict[str, Path | list[Path]], dest: Path, workers: int = WORKERS,
    joined: bool = True, dictionary: Path | None = None,
) -> None:
    """fairseq-preprocess; ``prefixes`` maps train/valid/test to file prefixes (``PREFIX.src`` and
    ``PREFIX.tgt`` exist). A list for test gives splits test, test1, test2...

    ``joined``: one dictionary for both sides (--joined-dictionary), else one per side, each built from its
    side's training text. ``dictionary``: an existing dictionary file for both sides (--srcdict/--tgtdict)."""
    args = ["--source-lang", src, "--target-lang", tgt, "--destdir", dest, "--workers", str(workers)]
    if dictionary is not None:
        args += ["--srcdict", dictionary, "--tgtdict", dictionary]
    elif joined:
        args.append("--joined-dictionary")
    for split, prefix in prefixes.items():
        value = ",".join(str(p) for p in prefix) if isinstance(prefix, list) else str(prefix)
        args += [f"--{split}pref", value]
    log(tag, f"binarizing {src}-{tgt} with fairseq-preprocess -> {dest}")
    preprocess([str(a) for a in args])


def preprocess(argv: list[str]) -> None:
    """fairseq-preprocess ``argv`` in this process (fairseq's own parser and main): fairseq is imported once
    for every pair of a multilingual corpus, not once per pair. Its INFO log goes to DEST/preprocess.log only."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers = list(logger.handlers)
    logger.propagate = False  # fairseq_cli.preprocess configures the root logger to print INFO on stdout
    try:
        fairseq_preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    except (AssertionError, FileExistsError, FileNotFoundError, OSError, ValueError) as err:
        raise RecipeError(f"fairseq-preprocess {' '.join(argv)} failed: {type(err).__name__}: {err}") from err
    finally:
        for handler in logger.handlers[len(handlers):]:  # the log file handler its main adds on every call
            handler.close()
            logger.removeHandler(handler)
        logger.propagate = True


def build_dictionary(tag: str, files: Sequence[Path], dest: Path, workers: int = WORKERS) -> int:
    """One dictionary of every token in ``files``, counted and ordered by fairseq's own
    ``FairseqTask.build_dictionary`` (what fairseq-preprocess does for its training text), saved to ``dest``;
    returns its size."""
    from fairseq.tasks.fairseq_task import FairseqTask

    log(tag, f"building the shared dictionary from {len(files)} files")
    d = FairseqTask.build_dictionary([str(f) for f in files], workers=workers)
    with atomic_path(dest) as tmp:
        d.save(str(tmp))
    return len(d)

