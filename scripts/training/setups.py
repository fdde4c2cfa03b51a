"""The training set-ups: every hyper-parameter of a paper's (or its authors' released) configuration, each
value with its source. ``train_recipe.py`` turns one set-up into one fairseq-train command per architecture.

Set-ups (``HPARAMS``; the facts are collected in REFERENCE_SETUPS.md of the project's shared notes):

- ``residual-paper``: ResiDual (Xie et al. 2023, arXiv:2304.14802) appendix H, tables 9 (IWSLT'14),
  10 (WMT'14) and 11 (OPUS-100). What the paper leaves unstated (batch, embeddings, attention/activation
  dropout, warm-up start) is taken from the authors' released configuration and says so.
- ``residual-authors``: the authors' released ``hydra_config/{iwslt,wmt,opus}.yaml``. Where it disagrees
  with the paper (direction, updates, OPUS-100's lr / warm-up / clipping / weight decay / embeddings,
  precision, checkpoint choice) it wins here.
- ``crossformer-paper``: Crossformer section 4.1 and appendix A.1 (no released code): Transformer-Base,
  Vaswani et al.'s optimizer and schedule, Wu et al. 2019's IWSLT set-up (50k updates of 4k tokens),
  100k (En-De) / 60k (En-Fr) WMT updates, guidance weight 0.01.
- ``dca``: ``residual-paper`` with DeepCrossAttention section 5's weight decay 0.1 (decoupled, as AdamW:
  fairseq's ``adam`` decays weights that way). DCA trains only language models, so there is no NMT set-up
  of its own: the point is that its baseline gets the same optimizer (a comparison that gives wd 0.1 to
  DCA only measures the weight decay too).

Multi30k is no paper's dataset: every set-up trains it with one CPU-scale row (the measured setting of
recipes/main_job.sh), which ``dca`` changes only by its weight decay.

A set-up is chosen for a whole comparison: every architecture trained with it gets the same command up to
``--arch``, the save directory and the options only its model has (``arch_options``).
"""

from dataclasses import dataclass

from scripts.training.training_common import RecipeError


@dataclass(frozen=True)
class Sourced:
    value: object
    source: str


# every setting of a set-up, in the order the dry run prints them
FIELDS = {
    "direction": "source->target ('any': the data's; 'multilingual': all directions in one model)",
    "width": "model width (embedding / FFN / heads) the set-up was run at; the --arch decides",
    "optimizer": "optimizer",
    "adam_betas": "Adam betas",
    "lr": "peak learning rate",
    "lr_scheduler": "learning-rate schedule",
    "warmup_updates": "warm-up updates",
    "warmup_init_lr": "learning rate at the start of warm-up",
    "weight_decay": "weight decay (decoupled)",
    "clip_norm": "gradient clipping (0: none)",
    "dropout": "dropout",
    "attention_dropout": "attention dropout",
    "activation_dropout": "activation (FFN) dropout",
    "label_smoothing": "label smoothing",
    "tokens_per_update": "tokens per update (all GPUs x max_tokens x update_freq)",
    "max_tokens": "largest batch per GPU (lowered to split tokens_per_update exactly)",
    "max_update": "updates",
    "embeddings": "embedding sharing: share-all | share-decoder (separate source and target)",
    "max_positions": "largest source/target positions (0: fairseq's default)",
    "precision": "fp32 | fp16 | amp | memory-efficient-fp16 (on GPUs)",
    "fp16_init_scale": "initial loss scale (0: fairseq's default)",
    "dual_residual_scale": "ResiDual's dual-branch downscale in half precision (residual models only)",
    "checkpoint": "best-loss | best-bleu | last-10-epochs | average-N",
    "patience": "early stopping: validations without improvement (0: none)",
    "seed": "random seed",
    "guidance_weight": "Crossformer-SG's alpha (crossformer_sg models only)",
}

DATASETS = ("iwslt14", "wmt14_en_de", "wmt14_en_fr", "opus100", "multi30k")
SETUPS_ORDER = ("residual-paper", "residual-authors", "crossformer-paper", "dca")
MULTILINGUAL = "multilingual"


def _rows(**fields) -> dict[str, Sourced]:
    return {name: Sourced(*pair) for name, pair in fields.items()}


def _with(base: dict[str, Sourced], **fields) -> dict[str, Sourced]:
    return {**base, **_rows(**fields)}


# ---------------------------------------------------------------------------------------- ResiDual

_T9, _T10, _T11 = "ResiDual table 9", "ResiDual table 10", "ResiDual table 11"
_YI, _YW, _YO = ("ResiDual authors' hydra_config/iwslt.yaml", "ResiDual authors' hydra_config/wmt.yaml",
                 "ResiDual authors' hydra_config/opus.yaml")  # fmt: skip
_ONE_GPU = "(the config gives no world size: one GPU assumed)"

_RESIDUAL_COMMON = _rows(
    optimizer=("adam", "ResiDual tables 9-11 (Adam)"),
    adam_betas=("(0.9, 0.98)", "ResiDual tables 9-11"),
    lr_scheduler=("inverse_sqrt", "ResiDual tables 9-11"),
    warmup_init_lr=(1e-7, "not in the paper; the authors' configs (warmup_init_lr 1e-7)"),
    label_smoothing=(0.1, "ResiDual tables 9-11"),
    attention_dropout=(0.1, "not in the paper; all three of the authors' configs"),
    activation_dropout=(0.1, "not in the paper; all three of the authors' configs"),
    max_tokens=(4096, "not in the paper; the authors' configs (max_tokens 4096 per GPU)"),
    max_positions=(0, "not stated; fairseq's default"),
    fp16_init_scale=(0, "not stated; fairseq's default"),
    checkpoint=("best-loss", "not stated; fairseq's checkpoint_best.pt (lowest valid loss)"),
    patience=(0, "not stated: no early stopping"),
    seed=(1, "not stated; the recipe's default"),
    guidance_weight=(0.01, "Crossformer A.1 (only crossformer_sg models use it)"),
)

RESIDUAL_PAPER = {
    "iwslt14": _with(
        _RESIDUAL_COMMON,
        direction=(("en", "de"), "ResiDual sec. 4.1 and H.1 (IWSLT'14 EN->DE)"),
        width=("256/1024/4", _T9),
        lr=(5e-4, _T9), warmup_updates=(4000, _T9), weight_decay=(1e-4, _T9), clip_norm=(0.0, _T9),
        dropout=(0.3, _T9), max_update=(300_000, _T9),
        tokens_per_update=(4096, f"not in the paper; {_YI} (4096 tokens x update_freq 1) {_ONE_GPU}"),
        embeddings=("share-all", f"not in the paper; {_YI} (share_all_embeddings)"),
        precision=("fp16", "ResiDual appendix H.3 (fp16 training)"),
        dual_residual_scale=(0.05, f"ResiDual appendix H.3 (the value: {_YO})"),
    ),
    "wmt14_en_de": _with(
        _RESIDUAL_COMMON,
        direction=(("de", "en"), "ResiDual sec. 4.1 and H.1 (WMT'14 DE->EN)"),
        width=("512/2048/8", _T10),
        lr=(1e-3, _T10), warmup_updates=(4000, _T10), weight_decay=(1e-4, _T10), clip_norm=(0.0, _T10),
        dropout=(0.3, _T10), max_update=(500_000, _T10),
        tokens_per_update=(65536, f"not in the paper; {_YW} (4096 tokens x update_freq 16) {_ONE_GPU}"),
        embeddings=("share-all", f"not in the paper; {_YW} (share_all_embeddings)"),
        precision=("fp16", "not stated for WMT; ResiDual appendix H.3 (fp16 training)"),
        dual_residual_scale=(0.05, f"ResiDual appendix H.3 (the value: {_YO})"),
    ),
    "opus100": _with(
        _RESIDUAL_COMMON,
        direction=(MULTILINGUAL, "ResiDual sec. 4.1 and table 11 (both directions, one model)"),
        width=("512/2048/8", _T11),
        lr=(1e-3, _T11), warmup_updates=(4000, _T11), weight_decay=(1e-4, _T11), clip_norm=(0.0, _T11),
        dropout=(0.1, _T11), max_update=(100_000, _T11),
        tokens_per_update=(65536, f"not in the paper; {_YO} (4096 tokens x update_freq 16) {_ONE_GPU}"),
        embeddings=("share-decoder", f"not in the paper; {_YO} (share_decoder_input_output_embed)"),
        max_positions=(256, f"not in the paper; {_YO} (max_source/target_positions 256)"),
        precision=("fp16", "ResiDual table 11 / appendix H.3 (fp16 with the dual-branch scale)"),
        dual_residual_scale=(0.05, f"ResiDual appendix H.3 (the value: {_YO})"),
        seed=(1379, f"not in the paper; {_YO} (seed 1379)"),
    ),
}
RESIDUAL_PAPER["wmt14_en_fr"] = _with(
    RESIDUAL_PAPER["wmt14_en_de"],
    direction=("any", "ResiDual trains no En-Fr: its WMT'14 En-De row (table 10), the data's direction"),
)

RESIDUAL_AUTHORS = {
    "iwslt14": _with(
        RESIDUAL_PAPER["iwslt14"],
        direction=(("de", "en"), f"{_YI} (de->en; the paper says EN->DE)"),
        warmup_init_lr=(1e-7, _YI), attention_dropout=(0.1, _YI), activation_dropout=(0.1, _YI),
        lr=(5e-4, _YI), warmup_updates=(4000, _YI), weight_decay=(1e-4, _YI), clip_norm=(0.0, _YI),
        dropout=(0.3, _YI), max_update=(500_000, f"{_YI} (the paper: 300k)"),
        tokens_per_update=(4096, f"{_YI} (4096 tokens x update_freq 1) {_ONE_GPU}"), max_tokens=(4096, _YI),
        embeddings=("share-all", _YI),
        precision=("fp32", f"{_YI} (no fp16 option)"), dual_residual_scale=(None, f"{_YI} (fp32: not used)"),
        checkpoint=("best-bleu", f"{_YI} (best valid BLEU: beam 5, max_len_a 1.2, max_len_b 10, moses detok)"),
        patience=(20, f"{_YI} (patience 20 on valid BLEU)"),
    ),
    "wmt14_en_de": _with(
        RESIDUAL_PAPER["wmt14_en_de"],
        direction=(("en", "de"), f"{_YW} (en->de; the paper says DE->EN)"),
        warmup_init_lr=(1e-7, _YW), attention_dropout=(0.1, _YW), activation_dropout=(0.1, _YW),
        lr=(1e-3, _YW), warmup_updates=(4000, _YW), weight_decay=(1e-4, _YW), clip_norm=(0.0, _YW),
        dropout=(0.3, _YW), max_update=(50_000, f"{_YW} (the paper: 500k)"),
        tokens_per_update=(65536, f"{_YW} (4096 tokens x update_freq 16) {_ONE_GPU}"), max_tokens=(4096, _YW),
        embeddings=("share-all", _YW),
        precision=("amp", _YW), dual_residual_scale=(None, f"{_YW} (amp, no dual-branch scale)"),
        checkpoint=("last-10-epochs", f"{_YW} (keep_last_epochs 10)"),
    ),
    "opus100": _with(
        RESIDUAL_PAPER["opus100"],
        direction=(MULTILINGUAL, f"{_YO} (188 directions, translation_multi_simple_epoch)"),
        warmup_init_lr=(1e-7, _YO), attention_dropout=(0.1, _YO), activation_dropout=(0.1, _YO),
        lr=(4e-3, f"{_YO} (the paper: 1e-3)"), warmup_updates=(8000, f"{_YO} (the paper: 4000)"),
        weight_decay=(0.0, f"{_YO} (weight_decay commented out; the paper: 1e-4)"),
        clip_norm=(1.0, f"{_YO} (the paper: 0)"), dropout=(0.1, _YO), max_update=(100_000, _YO),
        tokens_per_update=(65536, f"{_YO} (4096 tokens x update_freq 16) {_ONE_GPU}"), max_tokens=(4096, _YO),
        embeddings=("share-decoder", f"{_YO} (share_decoder_input_output_embed; separate source/target)"),
        max_positions=(256, _YO),
        precision=("memory-efficient-fp16", _YO), fp16_init_scale=(8, _YO),
        dual_residual_scale=(0.05, _YO), seed=(1379, _YO),
    ),
}
RESIDUAL_AUTHORS["wmt14_en_fr"] = _with(
    RESIDUAL_AUTHORS["wmt14_en_de"],
    direction=("any", "the authors train no En-Fr: their wmt.yaml (En-De), the data's direction"),
)

# -------------------------------------------------------------------------------------- Crossformer

_H3_OTHERS = "ResiDual appendix H.3: residual models in half precision need it (the value: the authors' opus.yaml)"

_XF = "Crossformer sec. 4.1"
_XA = "Crossformer A.1"
_WU = "Crossformer sec. 4.1: Wu et al. 2019's IWSLT set-up"
_VASWANI = "Crossformer A.1: Transformer-Base hyper-parameters (Vaswani et al. 2017)"
_XF_WMT = _rows(
    direction=(("en", "de"), f"{_XF} (WMT'14 En-De)"),
    width=("512/2048/8", f"{_XF} (Transformer-Base)"),
    optimizer=("adam", f"{_XF} (Adam)"),
    adam_betas=("(0.9, 0.98)", _VASWANI),
    lr=(7e-4, f"{_VASWANI}: peak 512^-0.5 x 4000^-0.5"),
    lr_scheduler=("inverse_sqrt", f"{_XA} (Vaswani et al.'s schedule)"),
    warmup_updates=(4000, _VASWANI),
    warmup_init_lr=(1e-7, "not stated; fairseq's translation examples"),
    weight_decay=(0.0, f"{_VASWANI} (none)"),
    clip_norm=(0.0, f"{_VASWANI} (none)"),
    dropout=(0.1, _VASWANI),
    attention_dropout=(0.0, f"{_VASWANI} (residual and embedding dropout only)"),
    activation_dropout=(0.0, f"{_VASWANI} (residual and embedding dropout only)"),
    label_smoothing=(0.1, _XF),
    tokens_per_update=(32768, "not stated; Vaswani et al.'s ~25k source + 25k target tokens, as 32768"),
    max_tokens=(4096, "not stated; fairseq's WMT examples (4096 per GPU)"),
    max_update=(100_000, f"{_XF} (En-De: 100k)"),
    embeddings=("share-all", f"{_XA} (joint BPE: 32k merges En-De, 40k En-Fr; Vaswani et al. share them)"),
    max_positions=(0, "not stated; fairseq's default"),
    precision=("fp16", "not stated; fp16 assumed (fairseq's WMT scripts, Ott et al. 2018)"),
    fp16_init_scale=(0, "not stated; fairseq's default"),
    dual_residual_scale=(0.05, _H3_OTHERS),
    checkpoint=("average-5", f"{_VASWANI}: average of the last 5 checkpoints (saved every 1000 updates here)"),
    patience=(0, "not stated: no early stopping"),
    seed=(1, "not stated; the recipe's default"),
    guidance_weight=(0.01, f"{_XA} gives alpha = 0.01 for IWSLT'14; kept for WMT (none given)"),
)
_SEPARATE = ("table 1: 52M parameters = base width with separate source and target embeddings over fairseq's "
             "IWSLT'14 dictionaries")
CROSSFORMER_PAPER = {
    "iwslt14": _with(
        _XF_WMT,
        direction=(("de", "en"), f"{_XF} and table 1 (IWSLT'14 De-En)"),
        width=("512/2048/8", f"{_XF} (Transformer-Base; table 1: 52M parameters)"),
        lr=(5e-4, _WU), warmup_updates=(4000, _WU), weight_decay=(1e-4, _WU), dropout=(0.3, _WU),
        tokens_per_update=(4096, f"{_XF} ('a batch size of 4K tokens')"), max_tokens=(4096, f"{_XF} (4K tokens)"),
        max_update=(50_000, f"{_XF} (50K iterations)"),
        embeddings=("share-decoder", _SEPARATE),
        checkpoint=("best-loss", "not stated; fairseq's checkpoint_best.pt (lowest valid loss)"),
        guidance_weight=(0.01, f"{_XA} (alpha = 0.01 on IWSLT'14)"),
    ),
    "wmt14_en_de": _XF_WMT,
    "wmt14_en_fr": _with(
        _XF_WMT, direction=(("en", "fr"), f"{_XF} (WMT'14 En-Fr)"), max_update=(60_000, f"{_XF} (En-Fr: 60k)")
    ),
}

# ---------------------------------------------------------------------------------- Multi30k, DCA

_CPU = "CPU-scale setting measured for Multi30k (no paper trains on it; recipes/main_job.sh)"
MULTI30K = _rows(
    direction=("any", f"{_CPU}: the data's direction"),
    width=("any", f"{_CPU}: any width (the main job trains width 128)"),
    optimizer=("adam", _CPU), adam_betas=("(0.9, 0.98)", _CPU), lr=(1e-3, _CPU),
    lr_scheduler=("inverse_sqrt", _CPU), warmup_updates=(400, f"{_CPU}: a CPU run makes a few thousand updates"),
    warmup_init_lr=(1e-7, _CPU), weight_decay=(1e-4, _CPU), clip_norm=(0.0, _CPU), dropout=(0.3, _CPU),
    attention_dropout=(0.0, _CPU), activation_dropout=(0.0, _CPU), label_smoothing=(0.1, _CPU),
    tokens_per_update=(2048, _CPU), max_tokens=(4096, _CPU), max_update=(20_000, _CPU),
    embeddings=("share-all", f"{_CPU} (joint SentencePiece)"), max_positions=(0, "fairseq's default"),
    precision=("fp32", _CPU), fp16_init_scale=(0, "fairseq's default"), dual_residual_scale=(0.05, _H3_OTHERS),
    checkpoint=("best-loss", f"{_CPU}: checkpoint_best.pt (lowest valid loss)"), patience=(0, _CPU),
    seed=(1, _CPU), guidance_weight=(0.01, "Crossformer A.1 (only crossformer_sg models use it)"),
)  # fmt: skip

_DCA_WD = "DeepCrossAttention sec. 5 (AdamW, weight decay 0.1), for every architecture of the comparison"


def _dca(rows: dict[str, Sourced]) -> dict[str, Sourced]:
    return {**rows, "weight_decay": Sourced(0.1, _DCA_WD)}


SETUPS: dict[str, dict[str, dict[str, Sourced]]] = {
    "residual-paper": {**RESIDUAL_PAPER, "multi30k": MULTI30K},
    "residual-authors": {**RESIDUAL_AUTHORS, "multi30k": MULTI30K},
    "crossformer-paper": {**CROSSFORMER_PAPER, "multi30k": MULTI30K},
    "dca": {name: _dca(rows) for name, rows in {**RESIDUAL_PAPER, "multi30k": MULTI30K}.items()},
}
for _name, _datasets in SETUPS.items():  # a set-up that misses a setting (or adds an unknown one) fails at import
    for _dataset, _values in _datasets.items():
        assert set(_values) == set(FIELDS), (_name, _dataset, set(FIELDS) ^ set(_values))

# what HPARAMS accepts besides a set-up's name; the family's paper decides paper/authors/auto
CHOICES = ("auto", "paper", "authors", *SETUPS_ORDER)
LEGACY = {"residual": "residual-paper", "crossformer": "crossformer-paper"}  # the recipe's earlier names


def family_paper(arch: str) -> str:
    """Whose paper an architecture belongs to: crossformer_*, dca_*, else ResiDual (whose tables also train
    the Pre-LN/Post-LN baselines)."""
    if arch.startswith("crossformer_"):
        return "crossformer"
    if arch.startswith("dca_"):
        return "dca"
    return "residual"


def choose_setup(hparams: str, arch: str) -> tuple[str, str]:
    """(set-up name, why) for ``HPARAMS=hparams``; ``arch`` is the first architecture of the comparison."""
    if hparams in LEGACY:
        return LEGACY[hparams], f"HPARAMS={hparams} (the earlier name of {LEGACY[hparams]})"
    if hparams not in CHOICES:
        raise RecipeError(f"--hparams {hparams!r} (HPARAMS): allowed {', '.join(CHOICES)}")
    if hparams in SETUPS:
        return hparams, f"HPARAMS={hparams}"
    paper = family_paper(arch)
    if hparams == "authors":
        if paper != "residual":
            raise RecipeError(f"HPARAMS=authors: the {paper} paper's authors released no NMT configuration; "
                              f"allowed for {arch}: {', '.join(s for s in SETUPS_ORDER if s != 'residual-authors')}"
                              " or residual-authors")  # fmt: skip
        return "residual-authors", f"HPARAMS=authors: the ResiDual authors' configs ({arch}'s family)"
    name = "dca" if paper == "dca" else f"{paper}-paper"
    why = "HPARAMS=auto: the default" if hparams == "auto" else "HPARAMS=paper: the paper"
    return name, f"{why} of {arch}'s family ({paper}), for every architecture of the run"


def setup_rows(name: str, dataset: str) -> dict[str, Sourced]:
    if dataset not in DATASETS:
        raise RecipeError(f"dataset {dataset!r} (the data's recipe.json): no set-up; known: {', '.join(DATASETS)}")
    rows = SETUPS[name]
    if dataset not in rows:
        others = [s for s in SETUPS_ORDER if dataset in SETUPS[s]]
        raise RecipeError(f"HPARAMS={name} has no {dataset} set-up (the paper trains none); "
                          f"set-ups for {dataset}: {', '.join(others)}")  # fmt: skip
    return dict(rows[dataset])


def override(rows: dict[str, Sourced], field: str, value, option: str) -> None:
    """A user's value replaces the set-up's; the source says both."""
    old = rows[field]
    if value != old.value:
        rows[field] = Sourced(value, f"{option} (user; the set-up's {old.value!r}: {old.source})")


def split_batch(tokens: int, world: int, cap: int) -> tuple[int, int] | None:
    """(max_tokens, update_freq) with world x max_tokens x update_freq == tokens and max_tokens <= cap, the
    fewest accumulation steps first (largest batches per GPU); None when no split is exact."""
    if tokens <= 0 or world <= 0 or cap <= 0 or tokens % world:
        return None
    for update_freq in range(1, tokens // world + 1):
        if tokens % (world * update_freq) == 0 and tokens // (world * update_freq) <= cap:
            return tokens // (world * update_freq), update_freq
    return None


def exact_worlds(tokens: int, limit: int = 64) -> list[int]:
    """Process counts up to ``limit`` that split ``tokens`` exactly (for error messages)."""
    return [n for n in range(1, limit + 1) if tokens % n == 0]
