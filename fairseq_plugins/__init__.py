"""Residual-connection ideas for deep NMT transformers, as a fairseq ``--user-dir`` plugin.

``fairseq-train DATA --user-dir fairseq_plugins --arch residual_e18d18 ...``. Importing the package
registers every model, architecture and criterion, lets fairseq load its own checkpoints under
torch >= 2.6 with weights-only loading kept on (see checkpoint_safety.py), makes fairseq-train's checkpoint
copies atomic and its resume skip a damaged checkpoint_last.pt (checkpoint_saving.py), and makes an uncaught option error
end the program with its message instead of a traceback (validation.report_option_error); a misspelt ``--arch``
is answered with the nearest names and fairseq-hydra-train is refused in one line (fairseq_hooks.py).
Installed, the package adds the command ``fairseq-residual`` (cli.py, docs/cli.md).
"""

# checkpoint_safety comes first (alphabetically too): it must run before fairseq reads any checkpoint
from . import (  # noqa: F401
    checkpoint_safety,
    checkpoint_saving,
    criterions,
    fairseq_hooks,
    lm,
    models,
    quiet_warnings,
    validation,
)

validation.install_error_report()  # an option error ends fairseq-train/-generate with its message, not a traceback
fairseq_hooks.install()
quiet_warnings.install()  # fairseq's warnings no user can act on (quiet_warnings.py)

__version__ = "0.1.0"
