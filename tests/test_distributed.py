"""fairseq's own distributed data parallel training, launched the way a cluster launches it: through
the command scripts/training/train_recipe.py plans (in-process; one family end to end through recipes/train.sh,
its Python processes forked from a pre-imported interpreter: tests/forkserver.py's shim), which starts 2 CPU
processes with torchrun (scripts/training/fairseq_rank.py, gloo) exactly as it starts NUM_GPUS processes per node
on GPUs. For every family, the losses match a
single-process run of the same recipe over the same total batch (the recipe itself splits 1,000 tokens per
update into 2 x 500 x update-freq 1 and 1 x 500 x update-freq 2), which also shows that no gradient is lost or
counted twice (tied weights, extra modules). The same for the first two combinations of the covering sample of the
axes grid (``residual_axes``; tests/grid_sample.py: those adding the most axis choices CI's families do not hold);
the whole grid and every family with ALL_FAMILIES=1. The single-process runs share one process (fairseq-train's own
entry point, tests/one_process.py; forked from tests/forkserver.py's server, conftest's in_one_forked_process); the
2-process runs but the end-to-end one share one torchrun launch: each rank runs every family's command (its
recipe's fairseq_rank arguments) in turn through ``fairseq_rank.main`` on one process group, kept between them
(fairseq trains on an initialized group as it is) and destroyed after the last."""

import json
import sys
from pathlib import Path

import pytest

from scripts.training import train_recipe

from .forkserver import forked_python_modules
from .grid_sample import axis_flags, combo_id, family_choices, grid_sample
from .helpers import REPO, TINY, run, train_log, trained_families
from .one_process import MARK, Run

FAMILIES = trained_families()
UPDATES = 4
FULL_RECIPE_ARCH = "residual_e6d6"
# two combinations in CI (each costs a family's subprocess runs, ~1 min on a loaded machine); all with ALL_FAMILIES=1
GRID = grid_sample(covered=family_choices(f"{family}_e6d6" for family in FAMILIES), limit=2)
CONFIGS = [(f"{family}_e6d6", ()) for family in FAMILIES] + [("residual_axes", tuple(axis_flags(c))) for c in GRID]
IDS = FAMILIES + [combo_id(c) for c in GRID]
CONFIG = dict(zip(IDS, CONFIGS, strict=True))
# no dropout: each rank draws its own masks, so only a deterministic model can match exactly; a short
# warm-up so that 4 updates move the weights; one JSON record per update
PASSTHROUGH = [*TINY, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0", "--lr", "1e-3",
               "--warmup-updates", "1", "--log-format", "json", "--log-interval", "1", "--no-progress-bar",
               "--num-workers", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def recipe_data(corpus_bin, tmp_path_factory):
    """The tiny corpus with the manifest the recipe reads (trained with the CPU-scale Multi30k set-up)."""
    data = tmp_path_factory.mktemp("recipe_data")
    for path in corpus_bin.iterdir():
        (data / path.name).symlink_to(path)
    manifest = {"dataset": "multi30k", "source_lang": "src", "target_lang": "tgt", "joined_dictionary": True}
    (data / "recipe.json").write_text(json.dumps(manifest), encoding="utf-8")
    return data


def plan(arch, data, save_dir, processes, axes=()):
    """The recipe's plan, in-process (its command is what recipes/train.sh runs)."""
    args = train_recipe.parse_args([str(arch), str(data), "--save-dir", str(save_dir), "--gpus", "0",
                                    "--cpu-procs", str(processes), "--tokens-per-update", "1000", "--max-tokens",
                                    "500", "--max-update", str(UPDATES), "--", *PASSTHROUGH, *axes])  # fmt: skip
    train_recipe.attach_save_dirs(args)
    setup, why = train_recipe.choose_setup(args.hparams, arch)
    return train_recipe.plan(args, arch, setup, why, env={})


# single-process runs per process: CI's all at once; with ALL_FAMILIES=1 (hundreds of combinations) the set of the
# one a test asks for runs in that test's time (conftest.py's limit per test), not all of them before the first test
CHUNK = 12


class Singles:
    """id -> (the recipe's single-process plan, its Run): the plan's command (``python -m fairseq_cli.train ARGS``,
    checked by the test) run as fairseq-train ARGS on first use, with the ids next to it, in one process."""

    def __init__(self, data, root, run_in_one_process):
        self.data, self.root, self.ids, self.done = data, root, list(IDS), {}
        self.run_in_one_process = run_in_one_process

    def __getitem__(self, id_):
        if id_ not in self.done:
            chunk = self.ids[self.ids.index(id_) // CHUNK * CHUNK :][:CHUNK]
            plans = [plan(arch, self.data, self.root / i, 1, axes) for i in chunk for arch, axes in [CONFIG[i]]]
            runs = self.run_in_one_process([("train", p.command[3:]) for p in plans])
            self.done.update(zip(chunk, zip(plans, runs, strict=True), strict=True))
        return self.done[id_]


@pytest.fixture(scope="module")
def singles(recipe_data, tmp_path_factory, in_one_forked_process):
    return Singles(recipe_data, tmp_path_factory.mktemp("single"), in_one_forked_process)


# one rank of the shared launch: fairseq_rank.main (the recipe's rank module, unchanged) for each family's arguments in
# turn, the process group left alive between them (the group is the launch's, as torchrun's store) and destroyed
# after the last; rank 0 marks where each family's output starts and ends, as tests/one_process.py does
RANKS = f"""
import json, logging, os, sys
# fairseq_cli.train's logging, set before any fairseq import as it does (fairseq's own modules would set stderr)
logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                    level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout)
sys.path.insert(0, {str(REPO)!r})
import torch.distributed as dist
from fairseq import checkpoint_utils
from scripts.training import fairseq_rank
destroy, dist.destroy_process_group = dist.destroy_process_group, lambda *args, **kwargs: None
for argv in json.loads(open(sys.argv[1]).read()):
    if hasattr(checkpoint_utils.save_checkpoint, "best"):  # as tests/one_process.py: a new process has none
        del checkpoint_utils.save_checkpoint.best
    sys.argv = [fairseq_rank.__file__, *argv]
    if os.environ["RANK"] == "0":
        print("{MARK} START", flush=True)
    fairseq_rank.main()  # an exception ends the launch: the other rank would wait on this one's collectives
    if os.environ["RANK"] == "0":
        print("{MARK} EXIT 0", flush=True)
destroy()
"""


class Doubles:
    """id -> the output of its recipe's 2-process command, the ids next to it run in one torchrun launch (the
    launcher's arguments are the recipe's own, checked equal for every command of the launch)."""

    def __init__(self, data, root: Path):
        self.data, self.root, self.ids, self.done = data, root, [i for i in IDS if CONFIG[i][0] != FULL_RECIPE_ARCH], {}

    def __getitem__(self, id_) -> Run:
        if id_ not in self.done:
            chunk = self.ids[self.ids.index(id_) // CHUNK * CHUNK :][:CHUNK]
            commands = [plan(arch, self.data, self.root / i, 2, axes).command for i in chunk for arch, axes in [CONFIG[i]]]
            at = commands[0].index("scripts.training.fairseq_rank") - 1  # the launcher's arguments, then -m MODULE
            assert all(c[:at] == commands[0][:at] and c[at : at + 2] == ["-m", "scripts.training.fairseq_rank"]
                       for c in commands)  # fmt: skip
            (self.root / "ranks.py").write_text(RANKS, encoding="utf-8")
            (self.root / "argv.json").write_text(json.dumps([c[at + 2 :] for c in commands]), encoding="utf-8")
            proc = run([*commands[0][:at], self.root / "ranks.py", self.root / "argv.json"], timeout=300 * len(chunk),
                       env={"PYTHONUNBUFFERED": "1"}, check=False)  # fmt: skip
            parts = proc.stdout.split(f"{MARK} START\n")[1:]
            for i, argv, part in zip(chunk, commands, parts + [""] * (len(chunk) - len(parts)), strict=True):
                output, marker, _ = part.rpartition(f"{MARK} EXIT ")
                failed = f"\n(the launch stopped here, exit {proc.returncode}: {proc.stderr[-4000:]})"
                self.done[i] = Run([str(a) for a in argv], 0 if marker else 1, output if marker else part + failed)
        return self.done[id_]


def without_save_dir(command) -> list[str]:
    command = [str(a) for a in command]
    at = command.index("--save-dir")
    return command[:at] + command[at + 2 :]


@pytest.fixture(scope="module")
def doubles(recipe_data, tmp_path_factory):
    return Doubles(recipe_data, tmp_path_factory.mktemp("ddp"))


@pytest.mark.parametrize(("id_", "arch", "axes"), [(i, *CONFIG[i]) for i in IDS], ids=IDS)
def test_two_process_ddp_through_the_recipe_matches_single_process(id_, arch, axes, recipe_data, singles, doubles,
                                                                   tmp_path):
    (single, single_run), ddp = singles[id_], plan(arch, recipe_data, tmp_path / "ddp", 2, axes)
    assert single.command[:3] == [sys.executable, "-m", "fairseq_cli.train"]  # what the shared process runs
    assert (single.launcher, single.max_tokens, single.update_freq) == ("single", 500, 2)
    assert (ddp.launcher, ddp.max_tokens, ddp.update_freq) == ("torchrun", 500, 1)
    assert single.tokens_per_update == ddp.tokens_per_update == 1000
    assert "scripts.training.fairseq_rank" in ddp.command and "gloo" in ddp.command
    single_out = single_run.check().output
    if arch == FULL_RECIPE_ARCH:  # one family end to end through recipes/train.sh: same command, manifest
        env = {"RECIPE_PYTHON": sys.executable, "NUM_GPUS": "0", "CPU_PROCS": "2", "TOKENS_PER_UPDATE": "1000",
               "MAX_TOKENS": "500", "MAX_UPDATE": str(UPDATES), "SAVE_DIR": str(tmp_path / "ddp")}  # fmt: skip
        # the recipe's Python processes (train_recipe, then torchrun's two fairseq_rank processes) forked from one
        # pre-imported interpreter (tests/forkserver.py's shim): one start-up instead of three; torchrun is its own
        with forked_python_modules():
            ddp_out = run(["bash", REPO / "recipes" / "train.sh", arch, recipe_data, "--", *PASSTHROUGH], env=env,
                          timeout=300).stdout  # fmt: skip
        manifest = json.loads((tmp_path / "ddp" / "train_setup.json").read_text(encoding="utf-8"))
        assert manifest["command"] == ddp.command and manifest["tokens_per_update"] == 1000
        assert manifest["values"]["lr"]["source"].startswith("CPU-scale") and manifest["launcher"] == "torchrun"
        assert json.loads((tmp_path / "ddp" / "train_summary.json").read_text())["num_updates"] == UPDATES
    else:  # the recipe's command (but for its save dir), its rank arguments run in the shared launch (Doubles)
        shared = doubles[id_].check()
        assert without_save_dir(shared.argv) == without_save_dir(ddp.command)
        ddp_out = shared.output
    single_log, ddp_log = train_log(single_out), train_log(ddp_out)
    assert [int(r["num_updates"]) for r in ddp_log] == list(range(1, UPDATES + 1))
    for a, b in zip(single_log, ddp_log, strict=True):
        assert a["wpb"] == b["wpb"], "the two runs must see the same total batch"
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), abs=2e-3), (a, b)
        assert float(a["gnorm"]) == pytest.approx(float(b["gnorm"]), rel=1e-3, abs=2e-3), (a, b)
