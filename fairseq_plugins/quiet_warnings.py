"""Warnings that fairseq's own code raises on every command of a plugin model and that no user can act on, silenced
when the plugin is imported (issue 57): hydra's compatibility API and schema matching, which fairseq calls to turn
its options into a config; torch.cuda.amp in fairseq's task; pin_memory without a GPU and the mask types of
fairseq's attention, both inside fairseq's loops. Each filter names its module or message, so every other warning
still shows; a user's own ``-W``/``PYTHONWARNINGS`` filters are inserted later and win. recipes/common.sh sets the
same filters for the commands that run before the plugin is imported (fairseq-preprocess)."""

import warnings

# (category, module regex, message regex): module is where Python attributes the warning
FILTERS = (
    (Warning, r"hydra\.experimental\.(initialize|compose)", ""),
    (Warning, r"hydra\.core\.default_element", ""),
    (Warning, r"hydra\.compose", ""),
    (FutureWarning, r"fairseq\.tasks\.fairseq_task", ""),
    # hydra's deprecation warnings are attributed to the top of the stack (sys, runpy): matched by their text
    (UserWarning, "", r"\s*'?\S+'? is validated against ConfigStore schema with the same name"),
    (UserWarning, "", r"\s*The strict flag in the compose API is deprecated"),
    (UserWarning, "", r"\s*The version_base parameter is not specified"),
    (UserWarning, "", r"'pin_memory' argument is set as true but no accelerator is found"),
    (UserWarning, "", r"Support for mismatched key_padding_mask and attn_mask is deprecated"),
)


def install() -> None:
    """Add the filters once (appended, so that filters the user set before import stay first and win)."""
    if getattr(install, "done", False):
        return
    for category, module, message in FILTERS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module, append=True)
    install.done = True
