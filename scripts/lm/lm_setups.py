"""The language-model training set-ups (``HPARAMS`` of recipes/train_lm.sh): every hyper-parameter with its
source, as scripts/training/setups.py does for translation.

- ``dca-paper``: DeepCrossAttention (Heddes et al. 2025, arXiv:2502.06785) section 5, its LM1B and C4 runs:
  sequence length 128, batch 2048 sequences, 500k steps, AdamW (beta 0.9/0.98, weight decay 0.1), learning rate
  0.0016 with 1,000 warm-up steps and an inverse square root schedule. What the paper leaves unstated (dropout,
  clipping, embedding tying, precision, warm-up start) is fairseq's LM example's choice and says so.
- ``dca-cpu``: the same optimizer at the scale of this project's 2-core machine (the offline corpus, one side of
  Multi30k): 16 sequences of 128 tokens per update and a few thousand updates. The changed values are the
  recipe's choices, not measured optima.

Interpretation: the paper cites Raffel et al. (T5) for the schedule; fairseq's ``inverse_sqrt`` rises linearly
from ``warmup_init_lr`` to the peak over the warm-up and then decays as lr * sqrt(warmup / step), which is the
peak-and-decay the paper describes. fairseq's ``adam`` decouples weight decay as AdamW does.
"""



from scripts.training.setups import FIELDS as TRANSLATION_FIELDS
from scripts.training.setups import Sourced, _rows

# the settings that mean the same for language models as for translation (described once, in setups.FIELDS)
_OPTIMIZER = ("optimizer", "adam_betas", "lr", "lr_scheduler", "warmup_updates", "warmup_init_lr", "weight_decay",
              "clip_norm", "dropout", "attention_dropout")  # fmt: skip

# every setting of a set-up, in the order the dry run prints them
FIELDS = {
    "tokens_per_sample": "sequence length (tokens per block)",
    "sample_break_mode": "how text is cut into blocks (none: a continuous stream)",
    **{name: TRANSLATION_FIELDS[name] for name in _OPTIMIZER},
    "tokens_per_update": "tokens per update (all GPUs x sequences x length x update_freq)",
    "max_tokens": "largest batch per GPU, in tokens (lowered to split tokens_per_update exactly)",
    "max_update": TRANSLATION_FIELDS["max_update"],
    "share_embeddings": "input and output embeddings tied",
    "precision": TRANSLATION_FIELDS["precision"],
    "checkpoint": "which checkpoint the evaluation reads",
    "seed": TRANSLATION_FIELDS["seed"],
    "guidance_weight": TRANSLATION_FIELDS["guidance_weight"],
}

_DCA = "DeepCrossAttention sec. 5"
_FAIRSEQ_LM = "fairseq's LM example (examples/language_model, transformer_lm on WikiText-103)"


DCA_PAPER = _rows(
    tokens_per_sample=(128, f"{_DCA} (sequence length 128)"),
    sample_break_mode=("none", f"not stated; {_FAIRSEQ_LM} (--sample-break-mode none: packed blocks)"),
    optimizer=("adam", f"{_DCA} (AdamW; fairseq's adam decouples weight decay)"),
    adam_betas=("(0.9, 0.98)", _DCA),
    lr=(1.6e-3, f"{_DCA} (0.0016)"),
    lr_scheduler=("inverse_sqrt", f"{_DCA} (inverse square root, Raffel et al. 2020)"),
    warmup_updates=(1000, _DCA),
    warmup_init_lr=(1e-7, f"not stated; {_FAIRSEQ_LM}"),
    weight_decay=(0.1, _DCA),
    clip_norm=(0.0, f"not stated; {_FAIRSEQ_LM} (none)"),
    dropout=(0.1, f"not stated; {_FAIRSEQ_LM}"),
    attention_dropout=(0.0, "not stated; fairseq's transformer_lm default"),
    tokens_per_update=(262_144, f"{_DCA}: batch size 2048 sequences x 128 tokens"),
    max_tokens=(4096, f"{_DCA}: 2048 sequences over 64 TPUs = 32 sequences of 128 tokens per device"),
    max_update=(500_000, f"{_DCA} (500k steps, 131B tokens)"),
    share_embeddings=(True, f"not stated; {_FAIRSEQ_LM} (--share-decoder-input-output-embed)"),
    precision=("fp16", "not stated (TPUs); fp16 on GPUs assumed, fp32 on CPU"),
    checkpoint=("last", f"{_DCA} reports the final perplexity after 500k steps: checkpoint_last.pt"),
    seed=(1, "not stated; the recipe's default"),
    guidance_weight=(0.01, "Crossformer A.1 (only crossformer_sg models use it)"),
)

_CPU = "CPU scale (2 cores, the Multi30k side): the recipe's choice, not measured"
DCA_CPU = {
    **DCA_PAPER,
    **_rows(
        tokens_per_update=(2048, f"{_CPU}: 16 sequences x 128 tokens"),
        max_tokens=(2048, _CPU),
        max_update=(4000, _CPU),
        warmup_updates=(400, f"{_CPU}: warm-up in proportion to the run"),
        precision=("fp32", _CPU),
    ),
}

SETUPS: dict[str, dict[str, Sourced]] = {"dca-paper": DCA_PAPER, "dca-cpu": DCA_CPU}
SETUPS_ORDER = ("dca-paper", "dca-cpu")
for _name, _values in SETUPS.items():  # a set-up that misses a setting (or adds an unknown one) fails at import
    assert set(_values) == set(FIELDS), (_name, set(FIELDS) ^ set(_values))
