"""Per-sentence (or per-block) log-likelihoods of a language model, for paired tests between two models.

fairseq-eval-lm reports one number, the perplexity of a whole split. A paired test (two models on the same
sentences, as a paired bootstrap on BLEU does for translation) needs each sentence's own score:
``sentence_log_likelihoods`` gives, for every example of the split, the sum of its tokens' log-probabilities
(natural log) and its token count, computed by fairseq's ``SequenceScorer`` exactly as fairseq-eval-lm does.
Summing them reproduces eval-lm's loss: perplexity = exp(-sum(log_prob) / sum(tokens)).

An "example" is what the task's ``--sample-break-mode`` makes of the data: a sentence with ``eos``, a block of
``--tokens-per-sample`` tokens with ``none``.
"""

import math
from dataclasses import dataclass

import torch
from fairseq import utils
from fairseq.sequence_scorer import SequenceScorer


@dataclass(frozen=True)
class ExampleScore:
    log_prob: float  # sum over the example's target tokens, natural log
    tokens: int


def sentence_log_likelihoods(model, task, split: str = "valid", max_tokens: int = 4096) -> dict[int, ExampleScore]:
    """{example id: its log-likelihood and token count} for ``split`` of a ``language_modeling`` task.

    Args:
        model: a fairseq language model (put in eval mode here).
        task: the ``LanguageModelingTask`` the model was built for (``split`` is loaded if needed).
    """
    model.eval()
    if split not in task.datasets:
        task.load_dataset(split)
    itr = task.eval_lm_dataloader(
        dataset=task.dataset(split), max_tokens=max_tokens, max_positions=model.max_positions(), num_workers=0
    )
    scorer = SequenceScorer(task.target_dictionary)
    device = next(model.parameters()).device
    scores: dict[int, ExampleScore] = {}
    with torch.no_grad():
        for sample in itr:
            if not sample:
                continue
            sample = utils.move_to_cuda(sample, device=device) if device.type == "cuda" else sample
            hypos = scorer.generate([model], sample)
            for i, example_id in enumerate(sample["id"].tolist()):
                positional = hypos[i][0]["positional_scores"].float()
                scores[example_id] = ExampleScore(float(positional.sum()), positional.numel())
    return scores


def perplexity(scores: dict[int, ExampleScore]) -> float:
    """exp of the mean negative log-likelihood per token over the examples (fairseq-eval-lm's perplexity)."""
    total = sum(s.log_prob for s in scores.values())
    return math.exp(-total / sum(s.tokens for s in scores.values()))
