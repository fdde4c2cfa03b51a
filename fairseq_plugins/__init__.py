"""Residual-connection ideas for deep NMT transformers, as a fairseq ``--user-dir`` plugin.

``fairseq-train DATA --user-dir fairseq_plugins --arch residual_e18d18 ...``. Importing the package
registers every model, architecture and criterion, lets fairseq load its own checkpoints under
torch >= 2.6 with weights-only loading kept on (see checkpoint_safety.py), and makes an uncaught option error
end the program with its message instead of a traceback (validation.report_option_error).
"""

# checkpoint_safety comes first (alphabetically too): it must run before fairseq reads any checkpoint
from . import (  # noqa: F401
    checkpoint_safety,
    criterions,
    lm,
    models,
    validation,
)

validation.install_error_report()  # an option error ends fairseq-train/-generate with its message, not a traceback

__version__ = "0.1.0"
