"""Every family of the plugin as a decoder-only language model for fairseq's ``language_modeling`` task.

``fairseq-train DATA --task language_modeling --user-dir fairseq_plugins --arch dca_lm_d12 ...``; see
docs/language_models.md. language_model.py is the model, decoder_only.py builds a family's decoder without
cross-attention, presets.py registers the ``{family}_lm_*`` architectures, scoring.py gives per-sentence
log-likelihoods, numpy_compat.py lets fairseq's sentence-level LM data load under NumPy 2.
"""

from . import numpy_compat, presets  # noqa: F401  (fairseq's LM data under NumPy 2; registers the models)
from .presets import LM_FAMILIES, LM_PRESETS  # noqa: F401
