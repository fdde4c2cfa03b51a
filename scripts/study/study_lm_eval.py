#!/usr/bin/env python
"""Scores one LM study run (study_lm.py): checkpoint_best.pt on the valid and test sets, one sentence per
example (``--sample-break-mode eos``, whatever the training's blocks were), with
``fairseq_plugins.lm.scoring.sentence_log_likelihoods``; writes each sentence's summed natural-log probability
and token count and the split's perplexity (fairseq-eval-lm's) to OUTPUT (JSON).

    python -m scripts.study.study_lm_eval DATA CHECKPOINT OUTPUT
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from scripts.recipe_common import run_main, write_json

TAG = "study-lm-eval"


def score(data: Path, checkpoint: Path) -> dict:
    import torch
    from fairseq import checkpoint_utils

    import fairseq_plugins  # noqa: F401  (registers the models)
    from fairseq_plugins.lm.scoring import perplexity, sentence_log_likelihoods

    torch.set_grad_enabled(False)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data), "sample_break_mode": "eos"}
    )
    model = models[0]
    splits = {}
    for split in ("valid", "test"):
        scores = sentence_log_likelihoods(model, task, split)
        ids = sorted(scores)
        splits[split] = {"perplexity": perplexity(scores), "sentences": len(ids), "total": len(task.dataset(split)),
                         "tokens": sum(scores[i].tokens for i in ids), "ids": ids,
                         "log_probs": [scores[i].log_prob for i in ids],
                         "token_counts": [scores[i].tokens for i in ids]}  # fmt: skip
    return {"checkpoint": checkpoint.name, "sample_break_mode": "eos", "splits": splits}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        raise SystemExit(__doc__)
    data, checkpoint, output = map(Path, argv)
    result = score(data, checkpoint)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, result)


if __name__ == "__main__":
    run_main(TAG, main)
