"""fairseq's own multilingual task for a dataset whose recipe.json says ``"task":
"translation_multi_simple_epoch"`` (OPUS-100, prepared by scripts/data/prepare_opus100.py).

The ResiDual authors train OPUS-100 as one model for every English-centric direction with fairseq's
``translation_multi_simple_epoch`` (released ``hydra_config/opus.yaml``, ../shared/REFERENCE_SETUPS.md):

- the target language's token on the encoder side (``--encoder-langtok tgt``): the task prepends
  ``__xx__`` to every source sentence; the language-token symbols are added to the shared dictionary by
  the task itself (``--lang-tok-style multilingual``), in the order of ``--langs``, so training and
  generation must give the same ``--langs`` (both are read from the manifest);
- temperature sampling over directions, p(direction) ~ (size / total)^(1/T), with T = 5
  (``--sampling-method temperature --sampling-temperature 5``);
- over-long sources truncated (``--truncate-source``) at 256 positions, reversed directions sharing one
  loaded dataset (one binarized en-xx pair serves en->xx and xx->en).

Interpretation, stated in the manifest's ``deviations``: the authors' schedule raises T linearly from 1 to
5 over 5 warm-up epochs and batches one language at a time; both come from a fairseq fork
(``--sampling-method linear --min-sampling-temperature 1.0 --warmup-epoch 5``, ``--same-lang-per-batch``)
that fairseq 0.12 does not have, so T = 5 holds from the first update and batches mix directions.

``train_args(manifest)`` gives the task and data options of fairseq-train (the training recipe adds the
model, optimizer, batch and seed); ``generate_args(manifest, src, tgt)`` those of fairseq-generate for one
direction.
"""

from scripts.training.training_common import MANIFEST, RecipeError

TASK = "translation_multi_simple_epoch"
KEYS = ("langs", "lang_pairs", "encoder_langtok", "lang_tok_style", "sampling_method", "sampling_temperature",
        "truncate_source", "max_source_positions", "max_target_positions")  # fmt: skip


def settings(manifest: dict) -> dict:
    """The manifest's ``multilingual`` block, checked: every key present, every pair made of listed languages."""
    if manifest.get("task") != TASK:
        raise RecipeError(f"{MANIFEST}: task {manifest.get('task')!r}, not {TASK}")
    block = manifest.get("multilingual")
    missing = [k for k in KEYS if not isinstance(block, dict) or k not in block]
    if missing:
        raise RecipeError(f"{MANIFEST}: the multilingual block lacks {', '.join(missing)}; prepare the data again "
                          "with recipes/prepare_opus100.sh")  # fmt: skip
    langs = set(block["langs"])
    bad = [p for p in block["lang_pairs"] if len(p.split("-")) != 2 or not set(p.split("-")) <= langs]
    if bad or not block["lang_pairs"]:
        raise RecipeError(f"{MANIFEST}: language pairs {bad or '(none)'} use languages outside {sorted(langs)}")
    return block


def _common(block: dict) -> list[str]:
    args = ["--task", TASK, "--langs", ",".join(block["langs"]), "--lang-pairs", ",".join(block["lang_pairs"]),
            "--encoder-langtok", block["encoder_langtok"], "--lang-tok-style", block["lang_tok_style"],
            "--max-source-positions", str(block["max_source_positions"]),
            "--max-target-positions", str(block["max_target_positions"])]  # fmt: skip
    if block.get("decoder_langtok"):
        args.append("--decoder-langtok")
    if block["truncate_source"]:
        args.append("--truncate-source")
    return args


def train_args(manifest: dict) -> list[str]:
    """fairseq-train options of the multilingual task: languages, pairs, language tokens, sampling."""
    block = settings(manifest)
    return _common(block) + [
        "--sampling-method", block["sampling_method"], "--sampling-temperature", repr(float(block["sampling_temperature"])),
        "--enable-reservsed-directions-shared-datasets",  # sic: fairseq's spelling
        # a dev target longer than the positions is skipped, as the training iterator skips them
        "--skip-invalid-size-inputs-valid-test",
    ]  # fmt: skip


def generate_args(manifest: dict, src: str, tgt: str) -> list[str]:
    """fairseq-generate options translating ``src`` -> ``tgt`` with a model trained on ``manifest``'s task."""
    block = settings(manifest)
    if f"{src}-{tgt}" not in block["lang_pairs"]:
        raise RecipeError(f"direction {src}-{tgt}: not among the dataset's {len(block['lang_pairs'])} directions")
    return _common(block) + ["--source-lang", src, "--target-lang", tgt]
