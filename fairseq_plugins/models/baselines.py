"""Matched baselines: fairseq's own transformer, plus only the plugin's ``--autocast-dtype`` option.

``transformer_preln_e18d18`` is fairseq's transformer with ``--encoder-normalize-before
--decoder-normalize-before`` at 18+18 layers; ``transformer_postln_*`` keeps fairseq's default Post-LN.
Same widths and depths as every plugin family (see presets.py), so comparisons are like for like.

The rows build ``transformer_autocast``: fairseq's ``TransformerModel`` itself (its encoder, decoder, layers and
forward, unchanged), with ``AutocastModel`` in front only so that ``--autocast-dtype bfloat16`` trains every
configuration, the baselines included (issue 31). Without the option no plugin code runs in the model: the same
parameters, initial weights and outputs as ``--arch transformer`` with the same flags, and checkpoints saved
before the model had its own name load into it unchanged (fairseq finds the model through the arch name).
"""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, base_architecture

from ..precision import AutocastModel
from .presets import LEGACY_DEPTHS, register_family

BASELINE_MODEL = "transformer_autocast"
PRE_LN = {"encoder_normalize_before": True, "decoder_normalize_before": True}
POST_LN = {"encoder_normalize_before": False, "decoder_normalize_before": False}


@register_model(BASELINE_MODEL)
class AutocastTransformerModel(AutocastModel, TransformerModel):
    """fairseq's transformer with ``--autocast-dtype`` (fairseq_plugins/precision.py); nothing else differs."""


# the baselines are legacy families: every width and depth (presets.py)
register_family("transformer_preln", BASELINE_MODEL, base_architecture, PRE_LN, LEGACY_DEPTHS)
register_family("transformer_postln", BASELINE_MODEL, base_architecture, POST_LN, LEGACY_DEPTHS)
