"""The checked-in table of every fairseq-train command the training recipe generates (tests/golden/
train_commands.txt): every (set-up, dataset, family, GPU count 0/1/8) combination, so that no number can drift
unnoticed. After a deliberate change (or a new family in the preset table) regenerate it with

    python -m scripts.training.train_recipe --write-golden tests/golden/train_commands.txt

and review the diff: each changed line is a changed command."""

import difflib

from fairseq_plugins.models.presets import PRESETS
from scripts.training import setups, train_recipe

from .helpers import REPO

GOLDEN = REPO / "tests" / "golden" / "train_commands.txt"
REGENERATE = "python -m scripts.training.train_recipe --write-golden tests/golden/train_commands.txt"


def checked_in() -> list[str]:
    return [line for line in GOLDEN.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]


def test_generated_commands_match_the_golden_table():
    generated, golden = train_recipe.golden_lines(), checked_in()
    if generated != golden:
        diff = "\n".join(list(difflib.unified_diff(golden, generated, "checked in", "generated", lineterm="", n=0))[:40])
        raise AssertionError(f"the recipe's commands changed; if on purpose, run `{REGENERATE}`:\n{diff}")


def test_the_table_covers_every_set_up_dataset_family_and_gpu_count():
    lines = checked_in()
    families = {p.family for p in PRESETS.values()}
    combos = [(s, d) for s in setups.SETUPS_ORDER for d in setups.DATASETS if d in setups.SETUPS[s]]
    assert len(combos) == 19
    for setup, dataset in combos:
        for gpus in (0, 1, 8):
            for family in families:
                cmd = train_recipe.golden_command(lines, setup, dataset, gpus, family)
                assert "{arch}" not in cmd and f"--arch {family}_" in cmd and "--max-tokens" in cmd
    assert train_recipe.GOLDEN_HEADER[-1].endswith(REGENERATE)


def test_a_golden_command_is_the_recipes_dry_run_command():
    lines = checked_in()
    cmd = train_recipe.golden_command(lines, "residual-paper", "iwslt14", 8, "residual")
    assert cmd.startswith("python -m torch.distributed.run --nproc-per-node 8 --standalone -m scripts.training.fairseq_rank")
    assert "--max-tokens 512 --update-freq 1" in cmd and "--distributed-world-size 8" in cmd
    args = train_recipe.parse_args(["residual_iwslt_e6d6", "iwslt14_en_de", "--gpus", "8", "--dry-run"])
    train_recipe.attach_save_dirs(args)
    p = train_recipe.plan(args, "residual_iwslt_e6d6", "residual-paper", "test", env={}, visible=0, read_data=False)
    assert train_recipe.golden_text(p.command) == cmd
