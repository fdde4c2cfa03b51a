"""The study's variables checked against each other before anything is prepared or trained (study.py).

Each check names the two variables that conflict and what would work instead, rather than letting the
combination fail later (SentencePiece's ``INTERNAL ... vocab_size`` error) or, worse, run and mean nothing
(early stopping that can never fire, a time budget on shared cores, a learning rate chosen and reported on
the same single run).
"""

import json
import re
import tempfile
from pathlib import Path

from scripts.study.study_common import WARMUP_VARIANTS, RecipeError, read_lines

_TOO_HIGH = re.compile(r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= (\d+)")
# SentencePiece's limit does not depend on the requested size once that is too high: ask for more than any
# corpus here allows and read the limit from the error
_PROBE_SIZE = 10**7


def parse_pairs(text: str, archs: list[str]) -> list[tuple[str, str]]:
    """PAIRS: space-separated SYSTEM:BASELINE entries of two different architectures of ARCHS, each pair once
    (in either order: b:a is a:b with the sign flipped, the same comparison)."""
    allowed = ("allowed: space-separated SYSTEM:BASELINE pairs of two different architectures of ARCHS, "
               "each once")  # fmt: skip
    pairs: list[tuple[str, str]] = []
    for entry in text.split():
        system, colon, baseline = entry.partition(":")
        bad = None
        if not colon or not system or not baseline or ":" in baseline:
            bad = "is not SYSTEM:BASELINE"
        elif unknown := [name for name in (system, baseline) if name not in archs]:
            bad = f"names {', '.join(unknown)}, not in ARCHS ({' '.join(archs)})"
        elif system == baseline:
            bad = f"pairs {system} with itself"
        elif (system, baseline) in pairs:
            bad = "appears twice"
        elif (baseline, system) in pairs:
            bad = f"is {baseline}:{system} reversed (the same comparison)"
        if bad:
            raise RecipeError(f"PAIRS (--pairs): {entry!r} {bad}; {allowed}")
        pairs.append((system, baseline))
    return pairs


def parse_arch_lrs(text: str, archs: list[str]) -> dict[str, tuple[list[float], list[int] | None]]:
    """ARCH_LRS: space-separated ARCH=LR[,LR...][@WARMUP[,WARMUP...]] entries, each architecture of ARCHS at most
    once -> {arch: (its lrs, its warm-ups or None for WARMUPS)}: an architecture's own setting (one value) or own
    grid (several: a grid widened for one model, chosen on valid loss like LRS/WARMUPS)."""
    allowed = ("allowed: space-separated ARCH=LR[,LR...][@WARMUP[,WARMUP...]] entries, ARCH in ARCHS, each LR in "
               "(0, 1), each WARMUP an integer >= 1, each architecture once (e.g. 'transformer_preln_iwslt_e12d12=4e-3@400')")  # fmt: skip
    settings: dict[str, tuple[list[float], list[int] | None]] = {}
    for entry in text.split():
        arch, equals, value = entry.partition("=")
        lr_text, at, warmup_text = value.partition("@")
        bad = None
        try:
            lrs = [float(v) for v in lr_text.split(",")]
            warmups = [int(v) for v in warmup_text.split(",")] if at else None
        except ValueError:
            lrs = warmups = None
        if lrs is None or not equals or not arch:
            bad = "is not ARCH=LR[,LR...][@WARMUP[,WARMUP...]]"
        elif arch not in archs:
            bad = f"names {arch}, not in ARCHS ({' '.join(archs)})"
        elif arch in settings:
            bad = f"gives {arch} a second time"
        elif len(set(lrs)) != len(lrs) or (warmups and len(set(warmups)) != len(warmups)):
            bad = "gives a value twice"
        elif any(not 0 < lr < 1 for lr in lrs):
            bad = f"has lr {next(lr for lr in lrs if not 0 < lr < 1):g}, not in (0, 1)"
        elif warmups is not None and min(warmups) < 1:
            bad = f"has warm-up {min(warmups)}, not >= 1 (the no-warm-up schedules are VARIANTS=nowarmup)"
        if bad:
            raise RecipeError(f"ARCH_LRS (--arch-lrs): {entry!r} {bad}; {allowed}")
        settings[arch] = (lrs, warmups)
    return settings


def candidates(args, arch: str, variant: str) -> list[tuple[float, int]]:
    """The (lr, warm-up) settings an architecture tries in a variant: its ARCH_LRS settings, else LRS/WARMUPS."""
    lrs, warmups = args.arch_settings.get(arch, (None, None))
    lrs = lrs or args.lr_list
    if variant not in WARMUP_VARIANTS:
        return [(a, 0) for a in lrs]
    return [(a, b) for a in lrs for b in (warmups or args.warmup_list)]


def check_pairs(args, cores: int) -> None:
    """Pairs of settings that cannot work together; ``args`` is study.validate's, after its own checks."""
    if args.data_bin is not None:
        for name, variable in (("train_lines", "TRAIN_LINES"), ("vocab_size", "VOCAB_SIZE")):
            if name in args.explicit:
                raise RecipeError(f"DATA_BIN and {variable} are both set: {variable} only shapes the Multi30k data the "
                                  "study prepares itself; DATA_BIN is already prepared (drop one of them)")  # fmt: skip
    if args.max_update and args.valid_every > args.max_update:
        raise RecipeError(f"VALID_EVERY={args.valid_every} is larger than MAX_UPDATE={args.max_update}: no validation "
                          f"before the end; use VALID_EVERY <= {args.max_update} (default MAX_UPDATE / 8)")  # fmt: skip
    if args.patience and args.max_update:
        validations = args.max_update // args.valid_every
        if validations <= args.patience:
            raise RecipeError(f"PATIENCE={args.patience} with MAX_UPDATE={args.max_update} and VALID_EVERY={args.valid_every}: "
                              f"only {validations} validations, so early stopping can never stop a run; use PATIENCE "
                              f"<= {max(1, validations // 4)}, a smaller VALID_EVERY or a larger MAX_UPDATE (the cap)")  # fmt: skip
    if args.train_minutes and args.jobs * args.threads > cores and getattr(args, "executor", "local") != "slurm":  # slurm: a node each
        raise RecipeError(f"TRAIN_MINUTES={args.train_minutes:g} with JOBS={args.jobs} x THREADS={args.threads} on "
                          f"{cores} cores: runs sharing cores get less work done per minute, so a time budget is not "
                          f"equal; use JOBS x THREADS <= {cores}, or MAX_UPDATE instead of TRAIN_MINUTES")  # fmt: skip
    warm = any(v in WARMUP_VARIANTS for v in args.variant_list)
    tried = max(len(candidates(args, a, v)) for a in args.arch_list for v in args.variant_list)
    if tried > 1 and len(args.seed_list) < 2:
        raise RecipeError(f"LRS/WARMUPS offer {tried} settings with SEEDS={args.seeds!r}: the chosen setting's "
                          "only result would be the run it was chosen on (a choice on the same seed flatters it); "
                          "give SEEDS two or more seeds (the later ones run at the chosen setting), or one setting")  # fmt: skip
    if args.warmups.strip() and not warm:
        raise RecipeError(f"WARMUPS={args.warmups!r} with VARIANTS={args.variants!r}: no variant has a warm-up, so "
                          f"WARMUPS would be ignored; add {' or '.join(WARMUP_VARIANTS)} to VARIANTS, or drop WARMUPS")  # fmt: skip
    own_warmups = {arch: max(w) for arch, (_, w) in args.arch_settings.items() if w is not None}
    if own_warmups and not warm:
        raise RecipeError(f"ARCH_LRS={args.arch_lrs!r} gives warm-ups with VARIANTS={args.variants!r}: no variant has a "
                          f"warm-up, so they would be ignored; drop the @WARMUP parts or add {' or '.join(WARMUP_VARIANTS)}")  # fmt: skip
    if args.max_update and (late := [(a, w) for a, w in own_warmups.items() if w >= args.max_update]):
        raise RecipeError(f"ARCH_LRS gives {late[0][0]} warm-up {late[0][1]} with MAX_UPDATE={args.max_update}: the warm-up "
                          f"would not end within the budget; use warm-ups below {args.max_update} or a larger MAX_UPDATE")  # fmt: skip
    # an inverse-sqrt warm-up longer than a short budget is allowed when it is the default (a smoke run of a few
    # updates); asked for, or under warmdecay's linear decay, it is a mistake
    if (args.warmups.strip() or "warmdecay" in args.variant_list) and args.max_update and max(args.warmup_list) >= args.max_update:
        raise RecipeError(f"WARMUPS={args.warmups or max(args.warmup_list)} with MAX_UPDATE={args.max_update}: the warm-up "
                          f"would not end within the budget; use warm-ups below {args.max_update} or a larger MAX_UPDATE")  # fmt: skip


def vocabulary_limit(files: list[Path], lines: int) -> int | None:
    """The largest joint SentencePiece vocabulary (as scripts/data/data_common.train_sentencepiece trains it)
    that the first ``lines`` lines (0: all) of ``files`` allow, as SentencePiece itself computes it."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        inputs = []
        for i, path in enumerate(files):
            text = read_lines(path)
            inputs.append(Path(tmp) / f"input.{i}")
            inputs[-1].write_text("\n".join(text[:lines] if lines else text) + "\n", encoding="utf-8")
        try:
            spm.SentencePieceTrainer.train(
                input=",".join(map(str, inputs)), model_prefix=str(Path(tmp) / "probe"), vocab_size=_PROBE_SIZE,
                character_coverage=1.0, model_type="unigram", minloglevel=2, num_threads=1,
                bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
            )  # fmt: skip
        except RuntimeError as err:
            match = _TOO_HIGH.search(str(err))
            return int(match.group(2)) if match else None
    return _PROBE_SIZE


def _conflict(args, limit: int) -> RecipeError:
    lines = f"the first {args.train_lines} training pairs" if args.train_lines else "the whole training set"
    fix = f"set VOCAB_SIZE <= {limit}" + (", or raise TRAIN_LINES (0: all pairs)" if args.train_lines else "")
    pair = "TRAIN_LINES and VOCAB_SIZE" if args.train_lines else "MULTI30K_DIR and VOCAB_SIZE"
    return RecipeError(f"{pair} conflict: VOCAB_SIZE={args.vocab_size} SentencePiece pieces, but {lines} "
                       f"(TRAIN_LINES={args.train_lines}) allow at most {limit} (SentencePiece's own limit for "
                       f"this text); {fix}")  # fmt: skip


def check_vocabulary(args) -> None:
    """With a local Multi30k copy not yet prepared in OUT_DIR, VOCAB_SIZE against what TRAIN_LINES allow."""
    if args.data_bin is not None or args.raw_dir is None or getattr(args, "task", "translation") != "translation":
        return  # (a language-modeling study: scripts/lm/prepare_lm.py trains one side's pieces and names its errors)  # prepared already, or downloaded later: explain_vocabulary_error reads the preparation's error
    recipe = args.out_dir / "data-bin" / f"multi30k_{args.src}_{args.tgt}" / "recipe.json"
    if recipe.is_file():
        old = json.loads(recipe.read_text(encoding="utf-8")).get("settings") or {}
        if old.get("vocab_size") == args.vocab_size and old.get("train_lines") == args.train_lines:
            return
    files = []
    for lang in sorted((args.src, args.tgt)):
        gz, plain = args.raw_dir / f"train.{lang}.gz", args.raw_dir / f"train.{lang}"
        if not gz.is_file() and not plain.is_file():
            return  # the preparation names the missing file
        files.append(gz if gz.is_file() else plain)
    limit = vocabulary_limit(files, args.train_lines)
    if limit is not None and args.vocab_size > limit:
        raise _conflict(args, limit)


def explain_vocabulary_error(args, log_text: str) -> None:
    """SentencePiece's vocabulary error in the data preparation's log, as the conflict of two variables."""
    match = _TOO_HIGH.search(log_text)
    if match:
        raise _conflict(args, int(match.group(2)))
