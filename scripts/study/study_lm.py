"""A study on a language-modeling dataset (scripts/study/study.py with an LM corpus): the same grid, seeds,
budget, resumption, patience and curves as for translation, with perplexity as the score and a paired
bootstrap on per-sentence log-likelihoods instead of BLEU.

- Which task: ``DATA_BIN``'s recipe.json says (``"task": "language_modeling"`` from scripts/lm/prepare_lm.py),
  or ``TASK=language_modeling`` / ``LM=1``, which with ``MULTI30K_DIR`` (or a download) prepares one side of
  Multi30k (TGT, default English) through scripts/lm/prepare_lm.py. Architectures must match the task:
  ``{family}_lm_*`` (or fairseq's ``transformer_lm*``) for an LM corpus, translation presets otherwise.
- Training: fairseq-train ``--task language_modeling`` with packed blocks (``--sample-break-mode none``) and
  the optimizer of scripts/lm/lm_setups.py's ``dca-cpu`` set-up (DeepCrossAttention sec. 5 at CPU scale:
  AdamW 0.9/0.98, weight decay 0.1, peak lr 1.6e-3, 400 warm-up updates, 128-token blocks, 2,048 tokens per
  update, tied embeddings, plain cross-entropy); the variants' schedules are the translation study's.
- Scoring (study_lm_eval.py): checkpoint_best.pt on the valid and test sets one sentence per example
  (``--sample-break-mode eos``), with ``fairseq_plugins.lm.scoring.sentence_log_likelihoods``: each sentence's
  summed natural-log probability and token count. Perplexity = exp(-sum log p / sum tokens), fairseq-eval-lm's
  number. The score is the validation perplexity; the test perplexity is reported beside it.
- Paired test (``paired_tests``): per seed, each model against the baseline on the same resampled test
  sentences: sacrebleu's resampling (the same ``default_rng(SACREBLEU_SEED)`` ``choice`` call as
  study_stats._bootstrap_indices) and p-value (``_compute_p_value`` on the centred absolute differences, as
  ``sacrebleu --paired-bs``), applied to the corpus perplexity of each resample; the 95% interval of the
  perplexity difference (model - baseline) and of the mean log-likelihood per token (nats) from the same
  resamples. "Level": every seed's interval of the perplexity difference inside +-LEVEL_MARGIN (perplexity
  points).
"""

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.lm.lm_setups import DCA_CPU
from scripts.recipe_common import fairseq_module
from scripts.study.study_common import (
    GUIDANCE_CRITERION,
    PLUGIN_ARG,
    Budget,
    RecipeError,
    Run,
    optimizer_args,
    run_args,
)

TASK = "language_modeling"
TASKS = ("translation", TASK)
ARCHS = "transformer_preln_lm_d6 dca_lm_d6"
MODEL_ARGS = "--decoder-embed-dim 128 --decoder-ffn-embed-dim 512"
_LM_NAME = re.compile(r"(^|_)lm(_|$)")


@dataclass(frozen=True)
class LMSetup:
    """What every run of an LM study shares: scripts/lm/lm_setups.py's dca-cpu values (sources there)."""

    lr: float = DCA_CPU["lr"].value
    warmup: int = DCA_CPU["warmup_updates"].value
    dropout: float = DCA_CPU["dropout"].value
    max_tokens: int = DCA_CPU["tokens_per_update"].value
    weight_decay: float = DCA_CPU["weight_decay"].value
    tokens_per_sample: int = DCA_CPU["tokens_per_sample"].value
    clip_norm: float = DCA_CPU["clip_norm"].value
    adam_betas: str = DCA_CPU["adam_betas"].value


def is_lm_arch(arch: str) -> bool:
    """The plugin's ``{family}_lm_*`` presets and fairseq's own ``transformer_lm*`` (by name: no import)."""
    return bool(_LM_NAME.search(arch))


def resolve_task(args, read_manifest) -> str:
    """TASK as asked, or DATA_BIN's recipe.json's; a contradiction between the two is refused."""
    found = None
    if args.data_bin is not None and (args.data_bin / "recipe.json").is_file():
        found = read_manifest(args.data_bin).get("task") or "translation"
        found = TASK if found == TASK else "translation"
    if args.task is not None and args.task not in TASKS:
        raise RecipeError(f"TASK (--task)={args.task!r}: allowed {', '.join(TASKS)} (LM=1 is language_modeling)")
    if args.task is not None and found is not None and args.task != found:
        raise RecipeError(f"TASK (--task)={args.task} but DATA_BIN={args.data_bin} is a {found} dataset (its "
                          "recipe.json): drop TASK/LM, or give a DATA_BIN of that task")  # fmt: skip
    return args.task or found or "translation"


def check_task_archs(archs: list[str], task: str) -> None:
    """Language-model names on a translation dataset, translation names on an LM corpus: refused by name."""
    if task == TASK:
        wrong = [a for a in archs if not is_lm_arch(a)]
        what = "is a translation architecture" if len(wrong) == 1 else "are translation architectures"
        if wrong:
            raise RecipeError(f"ARCHS (--archs): {', '.join(wrong)} {what}, but the dataset is a language-modeling "
                              "corpus: use the decoder-only presets {family}_lm_[gpt_|big_]d{6..42} (e.g. "
                              "transformer_preln_lm_d6 dca_lm_d6; docs/language_models.md), or a translation DATA_BIN "
                              "/ MULTI30K_DIR without LM/TASK")  # fmt: skip
        return
    wrong = [a for a in archs if is_lm_arch(a)]
    what = "is a language model" if len(wrong) == 1 else "are language models"
    if wrong:
        raise RecipeError(f"ARCHS (--archs): {', '.join(wrong)} {what}, but the dataset is a translation dataset: for "
                          "a language-model study set LM=1 (TASK=language_modeling) or DATA_BIN to a corpus of "
                          "recipes/prepare_lm.sh; to train one LM use recipes/train_lm.sh")  # fmt: skip


def criterion_args(arch: str) -> list[str]:
    if arch.startswith("crossformer_sg_lm"):  # the family's regularizer, as scripts/lm/train_lm.py trains it
        return ["--criterion", GUIDANCE_CRITERION, "--label-smoothing", "0.0", "--guidance-weight", "0.01"]
    return ["--criterion", "cross_entropy"]


def train_command(run: Run, setup: LMSetup, budget: Budget, data: Path, save_dir: Path, valid_every: int,
                  model_args: list[str], extra: list[str]) -> list[str]:  # fmt: skip
    """fairseq-train --task language_modeling for one run; ``model_args`` and ``extra`` come last (they win)."""
    cmd = fairseq_module("train") + [
        data, "--user-dir", PLUGIN_ARG, "--arch", run.arch, "--task", TASK,
        "--tokens-per-sample", str(setup.tokens_per_sample), "--sample-break-mode", "none",
        "--share-decoder-input-output-embed", *optimizer_args(run, setup, budget), *criterion_args(run.arch),
        *run_args(run, setup, budget, save_dir, valid_every),
    ]  # fmt: skip
    return [str(c) for c in cmd + model_args + extra]


def eval_command(data: Path, checkpoint: Path, output: Path) -> list[str]:
    return [str(c) for c in (sys.executable, "-m", "scripts.study.study_lm_eval", data, checkpoint, output)]


def prepare_command(args, dest: Path) -> list[str]:
    """scripts/lm/prepare_lm.py for the Multi30k preset: the TGT side, VOCAB_SIZE pieces."""
    cmd = [sys.executable, "-m", "scripts.lm.prepare_lm", "--corpus", "multi30k", "--lang", args.tgt,
           "--vocab-size", str(args.vocab_size), "--work-dir", args.out_dir / "data" / dest.name, "--dest-dir", dest,
           "--workers", "1"]  # fmt: skip
    cmd += ["--raw-dir", args.raw_dir] if args.raw_dir else []
    cmd += [] if args.verify_counts else ["--no-verify-counts"]
    return [str(c) for c in cmd]


def read_eval(ev: dict) -> dict:
    """A run's result fields from its eval/results.json (study_lm_eval.py)."""
    valid, test = ev["splits"]["valid"], ev["splits"]["test"]
    return {"valid_ppl": valid["perplexity"], "test_ppl": test["perplexity"], "sentences": test["sentences"],
            "skipped": {split: ev["splits"][split]["total"] - ev["splits"][split]["sentences"] for split in ("valid", "test")},
            "test_tokens": test["tokens"], "scores": (test["ids"], test["log_probs"], test["token_counts"])}  # fmt: skip


def _perplexities(log_probs, tokens, idxs):
    import numpy as np

    return np.exp(-log_probs[idxs].sum(axis=1) / tokens[idxs].sum(axis=1))


def paired_tests(groups: dict[tuple, list[tuple[str, tuple]]], samples: int) -> dict[tuple, dict]:
    """KEY + (name,) -> {"ppl_p", "ppl_diff", "ppl_ci", "ll_diff", "ll_ci"}: each system of a group against the
    group's first on the same resampled test sentences (module docstring); ll is the mean log-likelihood per
    token in nats (higher is better), ppl the corpus perplexity (lower is better)."""
    import numpy as np
    from sacrebleu.significance import _compute_p_value

    from scripts.study.study_stats import _bootstrap_indices, difference_ci

    out = {}
    for key, systems in groups.items():
        if len(systems) < 2:
            continue
        base_ids, base_lp, base_n = systems[0][1]
        base_lp, tokens = np.array(base_lp, dtype="float64"), np.array(base_n, dtype="float64")
        idxs = _bootstrap_indices(len(base_ids), samples)
        base_ppl = _perplexities(base_lp, tokens, idxs)
        base_real = math.exp(-base_lp.sum() / tokens.sum())
        for name, (ids, lp, n) in systems[1:]:
            if list(ids) != list(base_ids) or list(n) != list(base_n):
                raise RecipeError(f"{name} and {systems[0][0]} were scored on different test sentences or tokens "
                                  f"({key}): the paired test needs the same data and dictionary")  # fmt: skip
            lp = np.array(lp, dtype="float64")
            real = math.exp(-lp.sum() / tokens.sum())
            diffs = _perplexities(lp, tokens, idxs) - base_ppl
            sample_diffs = np.abs(diffs)  # sacrebleu's paired-bs statistic: centred absolute differences
            p = _compute_p_value(sample_diffs - sample_diffs.mean(), abs(real - base_real))
            ll = (lp[idxs].sum(1) - base_lp[idxs].sum(1)) / tokens[idxs].sum(1)
            out[(*key, name)] = {"ppl_p": float(p), "ppl_diff": round(real - base_real, 4),
                                 "ppl_ci": [round(v, 4) for v in difference_ci(diffs)],
                                 "ll_diff": round(float((lp.sum() - base_lp.sum()) / tokens.sum()), 5),
                                 "ll_ci": [round(v, 5) for v in difference_ci(ll)]}  # fmt: skip
    return out
