"""tests/golden/train_commands.txt and lm_commands.txt: the commands the training and LM recipes generate."""

from scripts.lm import train_lm
from scripts.training import train_golden


def golden_train() -> str:
    return "\n".join(train_golden.GOLDEN_HEADER + train_golden.golden_lines()) + "\n"


def golden_lm() -> str:
    return "\n".join(train_lm.GOLDEN_HEADER + train_lm.golden_lines()) + "\n"
