"""``label_smoothed_cross_entropy_with_guidance``: Crossformer-SG's objective (eq. 2)

    L = L_nll + alpha * L_reg

with L_nll fairseq's label-smoothed cross entropy and L_reg the model's ``guidance_loss()`` (eq. 1).

The interface: a model provides the regularizer as a method ``guidance_loss(self) -> Tensor`` returning
a scalar, differentiable in the parameters it regularizes (``crossformer_sg`` does). Any model may
implement it; a model without one is refused when the criterion is built (fairseq builds the model first,
through ``fairseq.models.build_model``, which this module wraps to remember the model it built for each task),
with one message naming the criterion, before any data is read.

alpha (``--guidance-weight``) lives here, on the criterion, and only here: eq. 2 is the training
objective, alpha weighs its two terms like ``--label-smoothing`` shapes the first, and it changes neither
the model's function nor its checkpoint. The model defines *what* L_reg is (``--guidance``,
``--guidance-norm``), the criterion *how much* it counts, so one trained model can be fine-tuned or
validated with another alpha, and alpha = 0 is exactly fairseq's label_smoothed_cross_entropy.

Scale: fairseq sums the loss over the batch and divides the gradient by ``sample_size`` (target tokens,
or sentences with ``--sentence-avg``), so L_reg enters the summed loss as alpha * L_reg * sample_size: the
per-token objective is L_nll/token + alpha * L_reg, for any batch size, gradient accumulation or number
of workers. The logged ``loss`` includes alpha * L_reg (in base 2, as fairseq reports loss); ``nll_loss``
does not; ``guidance_loss`` is L_reg itself (a norm of weights, so not divided by ln 2).
"""

import functools
import math
import weakref
from dataclasses import dataclass, field

import fairseq.models
import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from ..validation import PluginOptionError, check_float

NAME = "label_smoothed_cross_entropy_with_guidance"


@dataclass
class LabelSmoothedCrossEntropyWithGuidanceConfig(LabelSmoothedCrossEntropyCriterionConfig):
    guidance_weight: float = field(
        default=0.01,
        metadata={"help": "alpha of eq. 2, L = L_nll + alpha * L_reg, alpha >= 0 (default 0.01, the paper's "
                  "IWSLT'14 value, appendix A.1.2); 0 gives label_smoothed_cross_entropy exactly"},
    )  # fmt: skip


def check_guided(model) -> None:
    """Refuse a model without ``guidance_loss()`` (or whose regularizer is identically 0), naming the criterion."""
    inner = model
    while hasattr(inner, "module"):  # name the model, not fairseq's distributed wrappers around it
        inner = inner.module
    if not callable(getattr(model, "guidance_loss", None)) or not getattr(inner, "soft_guidance", True):
        raise PluginOptionError(
            f"--criterion {NAME} needs a model with a guidance_loss() method (the regularizer of eq. 1), "
            f"e.g. --arch crossformer_sg_* or --guidance BLOCKS; {type(inner).__name__} has none (crossformer_hg* only "
            "ties blocks, --tying: add --guidance with other blocks, or train it with --criterion "
            "label_smoothed_cross_entropy)"
        )


def model_guidance_loss(model) -> torch.Tensor:
    """Call ``model.guidance_loss()``; refuse a model that has none."""
    check_guided(model)
    return model.guidance_loss()


# task -> the model fairseq last built for it. The criterion receives only the task, and fairseq-train builds the
# model first (task.build_model, then task.build_criterion), so the criterion checks the model when it is built,
# like every other option: refused in its forward, the error came after fairseq had started its data-buffer
# thread, and a third of such runs then died with SIGABRT (exit 134) instead of exit 1 (issue 56).
_BUILT_MODELS = weakref.WeakKeyDictionary()


def _remembering_built_model(build_model):
    # wraps the function every task's build_model calls (FairseqTask and LegacyFairseqTask look it up in
    # fairseq.models at call time); fairseq has no hook after a model is built
    @functools.wraps(build_model)
    def wrapper(cfg, task, *args, **kwargs):
        model = build_model(cfg, task, *args, **kwargs)
        try:
            _BUILT_MODELS[task] = weakref.ref(model)
        except TypeError:  # a task that cannot be weakly referenced: the check happens at the first batch
            pass
        return model

    wrapper.remembers_built_model = True
    return wrapper


if not getattr(fairseq.models.build_model, "remembers_built_model", False):
    fairseq.models.build_model = _remembering_built_model(fairseq.models.build_model)


def model_built_for(task):
    """The model fairseq built for ``task`` (None: none was built through fairseq.models.build_model)."""
    try:
        ref = _BUILT_MODELS.get(task)
    except TypeError:
        return None
    return ref() if ref is not None else None


@register_criterion(NAME, dataclass=LabelSmoothedCrossEntropyWithGuidanceConfig)
class LabelSmoothedCrossEntropyWithGuidanceCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False, guidance_weight=0.01
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.guidance_weight = check_float("guidance_weight", guidance_weight, 0.0, math.inf)
        model = model_built_for(task)
        if model is not None:  # else (a criterion built by hand) the forward checks the model it is given
            check_guided(model)

    def forward(self, model, sample, reduce=True):
        """fairseq's label-smoothed loss plus alpha * L_reg * sample_size (see the module docstring).

        With ``reduce=False`` the per-token losses are returned without L_reg, which has no per-token share.
        """
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.guidance_weight > 0):
            regularizer = model_guidance_loss(model)
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        if reduce and self.guidance_weight > 0:
            loss = loss + self.guidance_weight * sample_size * regularizer
            logging_output["loss"] = loss.data
        logging_output["guidance_loss"] = regularizer.data * sample_size  # summed over workers like "loss"
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        guidance_sum = sum(log.get("guidance_loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("guidance_loss", guidance_sum / max(sample_size, 1), sample_size, round=4)
