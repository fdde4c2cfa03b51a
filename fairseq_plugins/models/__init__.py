"""Models and named architectures. fairseq's ``--user-dir`` also imports every file here by itself;
importing them explicitly makes ``import fairseq_plugins`` register everything too (the Python API)."""

from . import baselines, crossformer, dca_transformer, residual_transformer  # noqa: F401
from .presets import DEPTHS, PRESETS, WIDTHS  # noqa: F401
