"""The golden command table (tests/golden/train_commands.txt, compared by tests/test_golden_commands.py):
every fairseq-train command the training recipe generates, per (set-up, dataset, family, GPU count)."""

import shlex
import sys
from pathlib import Path

from scripts.training.setups import DATASETS, SETUPS, SETUPS_ORDER
from scripts.training.train_arguments import attach_save_dirs, parse_args
from scripts.training.train_options import DEFAULT_DIRECTION, TAG
from scripts.training.train_plan import plan
from scripts.training.train_run import render
from scripts.training.training_common import REPO, RecipeError, log, write_lines


def family_representatives(width: str) -> dict[str, str]:
    """{family: one arch} from the preset table: depth E6D6 at the set-up's width where the family has it."""
    from fairseq_plugins.models.presets import PRESETS

    families: dict[str, list[str]] = {}
    for arch, preset in PRESETS.items():
        families.setdefault(preset.family, []).append(arch)

    def rank(arch):
        preset = PRESETS[arch]
        w = f"{preset.width.embed_dim}/{preset.width.ffn_dim}/{preset.width.heads}"
        return (w != width, (preset.encoder_layers, preset.decoder_layers) != (6, 6), arch)

    return {family: min(archs, key=rank) for family, archs in sorted(families.items())}


def golden_name(setup: str, dataset: str) -> str:
    """The data-bin name of the set-up's direction (what prepare_*.sh writes for it)."""
    want = SETUPS[setup][dataset]["direction"].value
    if isinstance(want, tuple):
        return f"{dataset.split('_')[0]}_{want[0]}_{want[1]}"
    return dataset if dataset == "opus100" else f"{dataset.split('_')[0]}_{'_'.join(DEFAULT_DIRECTION[dataset])}"


def golden_lines() -> list[str]:
    """Every (set-up, dataset, family, GPU count) command with repository-relative paths, as two kinds of line:

        SETUP DATASET gpus=N: the command up to the architecture's own options, with {arch} for the name
        SETUP DATASET gpus=N FAMILY: the family's arch, then its own options (the command's tail)

    so a command is its template with ``{arch}`` replaced plus its tail, and a set-up's fairness (one command
    for every family up to the architecture) is the file's shape: a family whose template differs stops here.
    """
    lines = []
    for setup in SETUPS_ORDER:
        for dataset in DATASETS:
            if dataset not in SETUPS[setup]:
                continue
            name = golden_name(setup, dataset)
            families = family_representatives(SETUPS[setup][dataset]["width"].value)
            for gpus in (0, 1, 8):
                key = f"{setup} {dataset} gpus={gpus}"
                template, tails = None, []
                for family, arch in families.items():
                    args = parse_args([arch, name, "--hparams", setup, "--gpus", str(gpus), "--dry-run"])
                    attach_save_dirs(args)
                    cmd = plan(args, arch, setup, f"HPARAMS={setup}", env={}, visible=0, read_data=False).command
                    cut = len(cmd) - 1 - cmd[::-1].index("--criterion")  # arch_options come last
                    text = golden_text(cmd[:cut]).replace(arch, "{arch}")
                    if template not in (None, text):
                        raise RecipeError(f"{key}: {arch}'s command differs from the other families' beyond the "
                                          f"architecture's own options:\n{template}\n{text}")  # fmt: skip
                    template = text
                    tails.append(f"{key} {family}: {arch} {golden_text(cmd[cut:])}")
                lines += [f"{key}: {template}", *tails]
    return lines


def golden_text(cmd: list[str]) -> str:
    return render(cmd).replace(shlex.quote(sys.executable), "python").replace(f"{REPO}/", "")


def golden_command(lines: list[str], setup: str, dataset: str, gpus: int, family: str) -> str:
    """The full command of one combination, read back from golden lines."""
    key = f"{setup} {dataset} gpus={gpus}"
    template = next(line.split(": ", 1)[1] for line in lines if line.startswith(key + ": "))
    arch, tail = next(line.split(": ", 1)[1] for line in lines if line.startswith(f"{key} {family}: ")).split(" ", 1)
    return template.replace("{arch}", arch) + " " + tail


GOLDEN_HEADER = [
    "# fairseq-train commands of every (set-up, dataset, family, GPU count): tests/test_golden_commands.py",
    "# a command = its 'SETUP DATASET gpus=N:' line with {arch} replaced + the tail of its family's line",
    "# regenerate: python -m scripts.training.train_recipe --write-golden tests/golden/train_commands.txt",
]


def write_golden(path: Path) -> None:
    lines = golden_lines()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, GOLDEN_HEADER + lines)
    commands = sum(1 for line in lines if "{arch}" not in line)
    log(TAG, f"{commands} commands ({len(lines)} lines) written to {path}")
