"""Models and named architectures. fairseq's ``--user-dir`` also imports every file here by itself;
importing them explicitly makes ``import fairseq_plugins`` register everything too (the Python API)."""

from . import (  # noqa: F401
    axes_transformer,
    baselines,
    crossformer,
    families,
)
from .presets import DEPTHS, PRESETS, WIDTHS  # noqa: F401
