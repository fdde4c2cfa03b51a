"""The documented commands run as written: the fenced ```bash blocks of README.md and of the pages with
step-by-step commands (docs/language_models.md; its ```python block too), in order, in a fresh copy of the
repository, offline at tiny scale (MULTI30K_DIR at the Multi30k fixture; sizes from the variables the commands
read: VOCAB_SIZE, VERIFY_COUNTS, MAX_UPDATE). Left out: the README's two long set-up commands (the main job,
the test suite), which other tests run, and blocks fenced ```sh, which download or need the user's files. The
worked example must define its paths, stop, write TensorBoard logs and decode every test sentence to text
without SentencePiece's marks; the LM walkthrough must prepare with the recipe's default settings but the size,
train, score and sample."""

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import recipe_fixtures as fx
from .forkserver import python_modules_forked  # noqa: F401  (a fixture)
from .helpers import REPO, run
from .study_fixtures import slow

# the study tool's and the recipes' python processes are forks of a pre-imported interpreter (forkserver.py)
pytestmark = pytest.mark.usefixtures("python_modules_forked")

SKIPPED = ("bash recipes/main_job.sh", "bash scripts/run_tests.sh")  # long set-up commands, tested elsewhere
BLOCK = r"^```{}\n(.*?)^```"


def blocks(markdown: str, language: str) -> list[str]:
    return re.findall(BLOCK.format(language), markdown, re.MULTILINE | re.DOTALL)


def commands(markdown: str) -> list[str]:
    """The commands of the page's ```bash blocks, in order; a command continued with a backslash is one."""
    out = []
    for block in blocks(markdown, "bash"):
        for command in re.split(r"(?<!\\)\n", block.strip()):
            if command.strip() and not command.strip().startswith("#"):
                out.append(command)
    return out


def test_the_readme_blocks_are_found():
    found = commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert [c.split("#")[0].strip() for c in found[:2]] == list(SKIPPED)
    assert any(c.startswith("fairseq-train ") for c in found) and any(c.startswith("fairseq-generate ") for c in found)


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new ones not ignored), with the running venv."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").is_file():
        (dest / ".venv").symlink_to(venv)
    else:  # no venv (a system Python): an activate that puts this interpreter's scripts first
        (dest / ".venv" / "bin").mkdir(parents=True)
        (dest / ".venv" / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    return dest


def multi30k(root: Path) -> Path:
    """The Multi30k fixture, its English side with enough distinct words for a 100-piece SentencePiece model of
    one side (the LM page; the shared fixture's 16 words allow fewer)."""
    fx.make_multi30k(root)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    for split, n in (("train", 80), ("val", 12), ("test_2016_flickr", 13)):
        fx.write_gz(root / f"{split}.en.gz", [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) for _ in range(n)])
    return root


def run_page(tmp_path: Path, page: str):
    """The page's ```bash commands (then its ```python blocks) in a fresh copy; returns (copy, combined output)."""
    repo = fresh_copy(tmp_path / "repo")
    text = (repo / page).read_text(encoding="utf-8")
    script = [c for c in commands(text) if c.split("#")[0].strip() not in SKIPPED]
    (tmp_path / "page.sh").write_text("set -eo pipefail\n" + "\n".join(script) + "\n", encoding="utf-8")
    env = {"MULTI30K_DIR": str(multi30k(tmp_path / "multi30k")), "VERIFY_COUNTS": "0", "VOCAB_SIZE": "100",
           "MAX_UPDATE": "2", "RECIPE_PYTHON": sys.executable, "PYTHONWARNINGS": "default"}  # fmt: skip
    procs = [run(["bash", tmp_path / "page.sh"], cwd=repo, env=env, timeout=600)]
    for block in blocks(text, "python"):
        procs.append(run([sys.executable, "-"], cwd=repo, env=env, input_text=block, timeout=300))
    return repo, procs


@slow
def test_readme_commands_run_as_written(tmp_path):
    repo, [proc] = run_page(tmp_path, "README.md")
    output = proc.stdout + proc.stderr
    assert "Please install tensorboardX" not in output
    hyps = [line.split("\t")[2] for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 13 and not any("\u2581" in h for h in hyps)  # every test sentence, as text
    events = list((repo / "checkpoints" / "residual_iwslt_e12d12" / "tensorboard").rglob("events.out.tfevents.*"))
    assert {e.parent.name for e in events} >= {"train", "valid"}  # train_inner: every --log-interval (100) updates


@slow
def test_language_model_page_commands_run_as_written(tmp_path):
    repo, [proc, sample] = run_page(tmp_path, "docs/language_models.md")
    assert (repo / "data-bin" / "lm_multi30k_en" / "spm.model").is_file()
    assert "num_updates" in proc.stdout + proc.stderr
    assert re.search(r"Perplexity: [0-9.]+", proc.stdout + proc.stderr), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sample.stdout.strip()
