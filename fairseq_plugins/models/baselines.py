"""Matched baselines built on fairseq's own ``transformer`` model: no plugin code runs in them.

``transformer_preln_e18d18`` is fairseq's transformer with ``--encoder-normalize-before
--decoder-normalize-before`` at 18+18 layers; ``transformer_postln_*`` keeps fairseq's default Post-LN.
Same widths and depths as every plugin family (see presets.py), so comparisons are like for like.
"""

from fairseq.models.transformer import base_architecture

from .presets import register_family

PRE_LN = {"encoder_normalize_before": True, "decoder_normalize_before": True}
POST_LN = {"encoder_normalize_before": False, "decoder_normalize_before": False}

register_family("transformer_preln", "transformer", base_architecture, PRE_LN)
register_family("transformer_postln", "transformer", base_architecture, POST_LN)
