"""The pieces of a study (scripts/study/study.py): the runs of a grid, their fairseq-train commands (their
logs are read by study_logs.py), and the machine they ran on.

A run is one (architecture, set-up variant, learning rate, warm-up, seed). Every run of a study gets the same
fairseq-train command except ``--arch`` and these four, so differences come from the architecture (or the
variant being compared). The set-up is the CPU-scale one measured on Multi30k (issue 14): Adam (0.9, 0.98),
peak lr 1e-3, dropout 0.1, label smoothing 0.1, weight decay 1e-4, no gradient clipping, 4,096 tokens per
update, all embeddings shared. It is built here, not taken from scripts/training/train_recipe.py, so a
study's numbers do not move when a recipe's defaults do; the exact command of every run is in results.json.

Set-up variants (``--variants``):

- ``warmup``: fairseq's ``inverse_sqrt``, the lr rising linearly from 1e-7 to the peak over the warm-up
  updates, then falling as 1/sqrt(update) (Vaswani et al.; ResiDual's tables 9-11).
- ``nowarmup``: ``polynomial_decay`` with power 1 and ``--warmup-updates 0``: the peak lr from the first
  update, decaying linearly to 0 at the last update of the budget (``--total-num-update`` = MAX_UPDATE).
  Why not ``inverse_sqrt`` without warm-up: with 0 warm-up updates fairseq's ``inverse_sqrt`` sets the lr
  to 0 (its decay factor is lr * sqrt(warm-up)), and with 1 it decays as 1e-3/sqrt(update), 4e-5 by update
  700, so no model trains and the comparison says nothing about warm-up (measured: E6D6 width 128 left
  Post-LN, Pre-LN and ResiDual all at valid loss 7.3-7.6). Linear decay from the peak keeps the lr high, which
  is what "no warm-up" must test (the large early steps warm-up exists to avoid), and it is the other
  schedule shape of ResiDual's table 8. It needs an update budget (MAX_UPDATE) to know where the decay ends.
- ``warmdecay``: the same linear decay to 0 at MAX_UPDATE, after a linear warm-up from 0 to the peak over the
  warm-up updates (``polynomial_decay`` with ``--warmup-updates``). Against ``nowarmup`` the schedules differ
  only in the warm-up: ``warmup`` against ``nowarmup`` also compares two shapes (inverse square root against
  linear decay; mean lr 6.6e-4 against 5.0e-4 at peak 1e-3, 400 warm-up updates and 800 updates), while
  ``warmdecay`` and ``nowarmup`` both have mean lr peak / 2 (issue 29).

Early stopping (``Budget.patience``, PATIENCE): fairseq's ``--patience``, stopping a run after that many
validations in a row without a lower validation loss than the best so far. fairseq keeps that count in memory
only (``should_stop_early``'s attributes, not in the checkpoint), so a resumed run would start counting
afresh; the study tool applies the same rule to the run's whole validation record (``early_stop``) and stops
it there itself, so an interrupted run stops at the update an uninterrupted one would have.
"""

import os
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts.recipe_common import (  # noqa: F401  (re-exported for study.py)
    PLUGIN_DIR,
    REPO,
    RecipeError,
    atomic_path,
    exit_text,
    fairseq_module,
    log,
    misspelt_variables,
    read_lines,
    read_manifest,
    run_main,
    warn_misspelt,
    write_json,
    write_text,
)

# every fairseq step runs with the repository as its working directory (study_run.Proc), so the plugin is named
# relative to it: fairseq prints its arguments into train.log, which is committed and names no machine's directories
PLUGIN_ARG = str(PLUGIN_DIR.relative_to(REPO))

VARIANTS = ("warmup", "nowarmup", "warmdecay")
WARMUP_VARIANTS = ("warmup", "warmdecay")  # the variants with a warm-up (WARMUPS applies to them)
DECAY_VARIANTS = ("nowarmup", "warmdecay")  # the variants whose lr reaches 0 at MAX_UPDATE
GUIDANCE_CRITERION = "label_smoothed_cross_entropy_with_guidance"
@dataclass(frozen=True)
class Setup:
    """What every run of a study shares (see the module docstring for where the numbers come from)."""

    lr: float = 1e-3
    warmup: int = 400
    dropout: float = 0.1
    max_tokens: int = 4096
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    adam_betas: str = "(0.9, 0.98)"


@dataclass(frozen=True)
class Budget:
    """Equal for every run: ``max_update`` updates, or ``minutes`` of training time (fairseq's
    ``--stop-time-hours``, which counts the training time of earlier attempts too), whichever comes first."""

    max_update: int = 0
    minutes: float = 0.0
    patience: int = 0

    def describe(self) -> str:
        stop = (f", stopped early after {self.patience} validations in a row without a lower valid loss"
                if self.patience else "")  # fmt: skip
        if self.minutes:
            cap = f" (at most {self.max_update} updates)" if self.max_update else ""
            return f"{self.minutes:g} minutes of training each{cap}{stop}"
        return f"{'at most ' if self.patience else ''}{self.max_update} updates each{stop}"


@dataclass(frozen=True)
class Run:
    arch: str
    variant: str
    lr: float
    warmup: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arch}.{self.variant}.lr{self.lr:g}.wu{self.warmup}.s{self.seed}"

    @property
    def group(self) -> tuple[str, str]:
        return self.arch, self.variant

    @property
    def label(self) -> str:
        """The name, or for a later seed whose setting its first seed's grid has not chosen yet (lr 0: a
        placeholder) what it will be, rather than a name with lr0.wu0 that no run will ever have."""
        return self.name if self.lr else f"{self.arch}.{self.variant}.s{self.seed} (at its first seed's choice)"


def check_archs(archs: list[str], variable: str, lm: bool = False) -> None:
    """Every architecture must be registered with fairseq once the plugin is imported."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    import fairseq_plugins  # noqa: F401  (registers the plugin's architectures)

    unknown = [a for a in archs if a not in ARCH_MODEL_NAME_REGISTRY]
    if unknown:
        from fairseq_plugins.models import PRESETS

        families = sorted({p.family for p in PRESETS.values()})
        names, example = ("_lm_*", "dca_lm_d6") if lm else ("_*", "residual_iwslt_e12d12")
        raise RecipeError(f"{variable}: unknown architecture(s) {', '.join(unknown)}; the plugin's families are "
                          f"{', '.join(f + names for f in families)} (e.g. {example})")  # fmt: skip


def criterion_args(arch: str) -> list[str]:
    from fairseq_plugins.models import PRESETS

    family = PRESETS[arch].family if arch in PRESETS else ""
    if family == "crossformer_sg":  # soft guidance is a loss term: its criterion, the paper's alpha
        return ["--criterion", GUIDANCE_CRITERION, "--guidance-weight", "0.01"]
    return ["--criterion", "label_smoothed_cross_entropy"]


def schedule_args(run: Run, budget: Budget) -> list[str]:
    if run.variant in DECAY_VARIANTS:
        warmup = run.warmup if run.variant == "warmdecay" else 0
        return ["--lr-scheduler", "polynomial_decay", "--warmup-updates", str(warmup), "--power", "1",
                "--end-learning-rate", "0", "--total-num-update", str(budget.max_update)]  # fmt: skip
    return ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(run.warmup), "--warmup-init-lr", "1e-07"]


def optimizer_args(run: Run, setup, budget: Budget) -> list[str]:
    """Adam at the run's lr and schedule, with the set-up's clipping, weight decay and dropout (translation and
    language-model studies alike)."""
    return ["--optimizer", "adam", "--adam-betas", setup.adam_betas, "--lr", repr(run.lr), *schedule_args(run, budget),
            "--clip-norm", repr(setup.clip_norm), "--weight-decay", repr(setup.weight_decay),
            "--dropout", repr(setup.dropout)]  # fmt: skip


def run_args(run: Run, setup, budget: Budget, save_dir: Path, valid_every: int) -> list:
    """What every run's command ends with before MODEL_ARGS: batch, seed, one CPU process, a checkpoint and JSON
    log records at every validation, and the budget."""
    log_every = max(1, min(50, valid_every // 2))
    cmd = [
        "--max-tokens", str(setup.max_tokens), "--seed", str(run.seed), "--cpu", "--num-workers", "0",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval-updates", str(valid_every),
        "--keep-interval-updates", "1", "--validate-interval-updates", str(valid_every),
        "--log-format", "json", "--log-interval", str(log_every), "--no-progress-bar",
    ]  # fmt: skip
    if budget.max_update:
        cmd += ["--max-update", str(budget.max_update)]
    if budget.minutes:
        cmd += ["--stop-time-hours", repr(budget.minutes / 60)]
    if budget.patience:  # absent without PATIENCE, so the committed studies' commands stay as they were
        cmd += ["--patience", str(budget.patience)]
    return cmd


def train_command(run: Run, setup: Setup, budget: Budget, data: Path, manifest: dict, save_dir: Path,
                  valid_every: int, model_args: list[str], extra: list[str]) -> list[str]:  # fmt: skip
    """fairseq-train for one run; ``model_args`` and ``extra`` come last, so they override the set-up."""
    cmd = fairseq_module("train") + [
        data, "--user-dir", PLUGIN_ARG, "--arch", run.arch, "--task", "translation",
        "--source-lang", manifest["source_lang"], "--target-lang", manifest["target_lang"],
        "--share-all-embeddings", *optimizer_args(run, setup, budget),
        "--label-smoothing", repr(setup.label_smoothing), *criterion_args(run.arch),
        *run_args(run, setup, budget, save_dir, valid_every),
    ]  # fmt: skip
    return [str(c) for c in cmd + model_args + extra]


# fairseq-train options whose values name this machine's places, not the set-up of a run
_PLACES = ("--save-dir", "--user-dir")


def _options(cmd: list[str]) -> dict[str, tuple[str, ...]]:
    """A fairseq-train command as option -> values, without the interpreter, the data path and the places."""
    tokens = cmd[cmd.index("fairseq_cli.train") + 2 :] if "fairseq_cli.train" in cmd else cmd
    options: dict[str, tuple[str, ...]] = {}
    name, values = None, []
    for token in [*tokens, "--"]:
        if token.startswith("--"):
            if name is not None and name not in _PLACES:
                options[name] = tuple(values)  # the last occurrence wins, as in argparse
            name, values = token, []
        else:
            values.append(token)
    return options


# what fairseq-validate takes from a run's fairseq-train command to compute the validation loss as training did
# (the same task, criterion and batches); the model comes from the checkpoint
_VALIDATION_OPTIONS = ("--task", "--source-lang", "--target-lang", "--criterion", "--label-smoothing", "--guidance-weight",
                       "--max-tokens", "--max-tokens-valid", "--batch-size", "--batch-size-valid",
                       "--required-batch-size-multiple", "--max-source-positions", "--max-target-positions",
                       "--skip-invalid-size-inputs-valid-test", "--cpu")  # fmt: skip


def validate_command(train_cmd: list[str], data: Path, checkpoint: Path) -> list[str]:
    """fairseq-validate of ``checkpoint`` on the valid subset, as ``train_cmd`` validated in training."""
    options = _options(train_cmd)
    picked = [token for name in _VALIDATION_OPTIONS if name in options for token in (name, *options[name])]
    return [str(c) for c in fairseq_module("validate") + [
        data, "--user-dir", PLUGIN_ARG, "--path", checkpoint, "--valid-subset", "valid", "--num-workers", "0",
        "--log-format", "json", *picked]]  # fmt: skip


def command_differences(before: list[str], now: list[str]) -> list[str]:
    """How two fairseq-train commands differ in what they train (not where they run), readably. Both are made
    portable first: a stored record is, and a path-valued option (after --) names the same place either way."""
    old, new = _options(portable_command(before, REPO)), _options(portable_command(now, REPO))
    differences = []
    for name in dict.fromkeys([*old, *new]):
        if old.get(name) != new.get(name):
            shown = [" ".join(v[name]) if name in v else "absent" for v in (old, new)]
            differences.append(f"{name} {shown[0] or '(set)'} before, {shown[1] or '(set)'} now")
    return differences


def shown_path(path: Path, repo: Path) -> str:
    """A path inside the repository relative to it, so a committed study names no machine's directories."""
    try:
        return str(path.resolve().relative_to(repo.resolve()))
    except ValueError:
        return str(path)


def portable_command(cmd: list[str], repo: Path) -> list[str]:
    """A run's command without this machine's places: the interpreter as ``python``, the plugin and
    repository paths relative. Each run's command.json is stored so (resuming compares what a command trains,
    ``command_differences``, never where it runs), and so is every report."""
    out = []
    for i, token in enumerate(cmd):
        if i == 0 and token.startswith("/"):
            token = "python"
        elif token.startswith("/"):
            shown = shown_path(Path(token), repo)
            parts = Path(shown).parts
            if shown.startswith("/") and "fairseq_plugins" in parts:  # another checkout's plugin
                shown = str(Path(*parts[len(parts) - 1 - parts[::-1].index("fairseq_plugins") :]))
            token = shown
        out.append(token)
    return out


# ----------------------------------------------------------------------------------------- machine


def machine() -> dict:
    """What ran the study: CPU model, cores, torch and fairseq versions, Python, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import fairseq
    import sacrebleu
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "fairseq": fairseq.__version__,
            "sacrebleu": sacrebleu.__version__, "python": platform.python_version(), "os": platform.platform()}  # fmt: skip


def cpu_identity() -> dict:
    """The processor as /proc/cpuinfo names it (model name, family, model, AVX-512 or not): two machines sold under
    one name ("AMD EPYC") differ in family and model and vector width, and the fused kernels are built per machine."""
    fields = {"model name": "cpu", "cpu family": "family", "model": "model"}
    out: dict = {}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:  # the first processor's block is enough: every core of a machine is the same model
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in fields:
            out.setdefault(fields[key], value)
        elif key == "flags":
            out["avx512"] = "avx512f" in value.split()
            break
    out.setdefault("cpu", platform.processor() or platform.machine())
    return out


def git_commit(repo: Path, outputs: Path | None = None) -> str:
    """HEAD of the checkout the runs come from, with "+dirty" when tracked files differ from it ("unknown" outside
    a git checkout, e.g. an installed copy). ``outputs``, a study's own folder, is left out of that check: the study
    tool rewrites the committed report files there (results.json, results.md, the plots) as runs finish, which
    changes no code the runs execute."""
    exclude = []
    if outputs is not None:
        try:
            exclude = [f":(exclude){Path(outputs).resolve().relative_to(Path(repo).resolve()).as_posix()}"]
        except ValueError:  # a folder outside the checkout holds none of its tracked files
            pass
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *exclude], capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def describe_machine(info: dict) -> str:
    return (f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}, fairseq {info['fairseq']}, "
            f"sacrebleu {info['sacrebleu']}, Python {info['python']}")  # fmt: skip


def command_line(env_vars: tuple[str, ...]) -> str:
    """The command as the user gave it: the variables they set and the script with its arguments."""
    prefix = [f"{name}={shlex.quote(os.environ[name])}" for name in env_vars if os.environ.get(name) is not None]
    module = ".".join(Path(sys.argv[0]).resolve().relative_to(REPO).with_suffix("").parts)
    script = os.environ.get("STUDY_COMMAND") or " ".join(["python", "-m", module, *map(shlex.quote, sys.argv[1:])])
    return " ".join([*prefix, script])


def as_dict(obj) -> dict:
    return asdict(obj)
