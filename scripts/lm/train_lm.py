#!/usr/bin/env python
"""Train language models of the plugin (``{family}_lm_*``) on a prepared LM corpus (recipes/train_lm.sh).

    python -m scripts.lm.train_lm dca_lm_d6 lm1b
    python -m scripts.lm.train_lm --hparams dca-cpu dca_lm_d6,transformer_preln_lm_d6 lm_multi30k_en
    python -m scripts.lm.train_lm --dry-run --gpus 8 --nodes 4 dca_k2_lm_d12 lm1b

The set-up (``--hparams``, HPARAMS: dca-paper or dca-cpu, scripts/lm/lm_setups.py) fixes every hyper-parameter
with its source; the dry run prints them and the run stores them in SAVE_DIR/train_setup.json. Batches are
exact: every update holds ``tokens_per_update / tokens_per_sample`` blocks of ``tokens_per_sample`` tokens,
split as ``processes x --batch-size x --update-freq`` for any number of GPUs and nodes (``--batch-size`` blocks
per GPU at most ``max_tokens / tokens_per_sample``; ``--required-batch-size-multiple 1`` so fairseq does not
round it). With ``--sample-break-mode none`` only a split's last block can be shorter. Launching (one process,
torchrun or SLURM) is the translation recipe's (scripts/training/train_options.py).

Golden commands: ``--write-golden tests/golden/lm_commands.txt`` rewrites the table tests/test_lm_recipes.py
compares.
"""

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from scripts.lm.lm_setups import FIELDS, SETUPS, SETUPS_ORDER
from scripts.training.setups import Sourced, exact_worlds, override, split_batch
from scripts.training.train_arguments import (
    Parser,
    attach_save_dirs,
    check_archs_and_processes,
)
from scripts.training.train_options import (
    GUIDANCE_CRITERION,
    LAUNCHERS,
    choose_launcher,
    cuda_devices,
    launcher_prefix,
    optimizer_options,
    placement_options,
    precision_options,
)
from scripts.training.train_run import render, stream
from scripts.training.training_common import (
    PLUGIN_DIR,
    REPO,
    RecipeError,
    exit_text,
    log,
    run_main,
    split_passthrough,
    write_json,
    write_lines,
)

TAG = "train_lm"


def count(name: str, env: str, least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} ({env}) {text!r}: expected an integer >= {least}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{name} ({env}) {value}: must be >= {least}")
        return value

    return parse


def parse_args(argv=None):
    own, extra = split_passthrough(argv)
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
               usage="%(prog)s [options] ARCH[,ARCH...] DATASET [-- fairseq-train options]")  # fmt: skip
    p.add_argument("arch", nargs="?", help="LM architectures, comma-separated, e.g. dca_lm_d6,transformer_preln_lm_d6")
    p.add_argument("dataset", nargs="?", help="data-bin/NAME (e.g. lm1b, lm_multi30k_en) or a directory")
    p.add_argument("--data-bin", type=Path, help="the binarized data directory (DATA_BIN; default data-bin/DATASET)")
    p.add_argument("--save-dir", type=Path, help="checkpoints (SAVE_DIR; default checkpoints/DATASET/ARCH; with "
                                                 "several architectures SAVE_DIR/ARCH)")  # fmt: skip
    p.add_argument("--hparams", default="dca-paper", help=f"the set-up (HPARAMS): {', '.join(SETUPS_ORDER)}")
    p.add_argument("--fp16", default="auto", choices=("auto", "1", "0"),
                   help="FP16: auto (the set-up's precision on GPUs, fp32 on CPU), 1 (half precision) or 0 (fp32)")
    p.add_argument("--gpus", type=count("--gpus", "NUM_GPUS", 0), help="GPUs per node (NUM_GPUS; default all visible; 0 = CPU)")
    p.add_argument("--nodes", type=count("--nodes", "NUM_NODES", 1), default=1, help="nodes (NUM_NODES; default 1)")
    p.add_argument("--cpu-procs", type=count("--cpu-procs", "CPU_PROCS", 1), default=1,
                   help="CPU processes per node with --gpus 0 (CPU_PROCS; default 1; more train with gloo)")
    p.add_argument("--launcher", default="auto", choices=LAUNCHERS,
                   help="LAUNCHER for more than one process: auto (slurm inside a SLURM allocation, else torchrun)")
    p.add_argument("--max-update", type=count("--max-update", "MAX_UPDATE", 0), help="override the set-up's updates")
    p.add_argument("--max-tokens", type=count("--max-tokens", "MAX_TOKENS", 1),
                   help="largest batch per GPU in tokens (MAX_TOKENS; default the set-up's; lowered to split exactly)")
    p.add_argument("--tokens-per-update", type=count("--tokens-per-update", "TOKENS_PER_UPDATE", 1),
                   help="override the set-up's tokens per update (a multiple of the sequence length)")
    p.add_argument("--seed", type=count("--seed", "SEED", 0), help="random seed (SEED; default the set-up's)")
    p.add_argument("--dry-run", action="store_true", help="print the set-up and the command(s) and stop (DRY_RUN=1)")
    p.add_argument("--write-golden", type=Path, metavar="FILE", help="write the golden command table and stop")
    args = p.parse_args(own)
    args.extra = extra
    if args.write_golden is None and (args.arch is None or args.dataset is None):
        raise RecipeError("ARCH and DATASET are required: usage: train_lm.py ARCH[,ARCH...] DATASET")
    if args.hparams not in SETUPS:
        raise RecipeError(f"--hparams {args.hparams!r} (HPARAMS): allowed {', '.join(SETUPS_ORDER)}")
    check_archs_and_processes(args)
    return args


def lm_family(arch: str) -> str:
    """The family of an LM architecture; anything else (a translation arch among them) is refused."""
    from fairseq_plugins.lm import LM_PRESETS

    if arch not in LM_PRESETS:
        raise RecipeError(f"ARCH {arch!r} is not a language-model architecture of the plugin: the names are "
                          "{family}_lm_[gpt_|big_]d{6,12,18,24,30,36,42}, e.g. dca_lm_d6, transformer_preln_lm_d12")  # fmt: skip
    return LM_PRESETS[arch].family


def resolve_data(args, read: bool = True) -> tuple[Path, str, list[str]]:
    """(data directory, its name, assumptions); without data only a dry run goes on."""
    name = args.data_bin.name if args.data_bin else Path(args.dataset).name
    data = args.data_bin or (Path(args.dataset) if "/" in args.dataset else REPO / "data-bin" / args.dataset)
    if read and (data / "dict.txt").is_file():
        return data, name, []
    if args.dry_run or not read:
        return data, name, [f"no LM data at {data}: planned only (prepare it with recipes/prepare_lm.sh)"]
    raise RecipeError(f"{data}: no dict.txt of a language-modeling corpus; prepare it with recipes/prepare_lm.sh "
                      "(or set DATA_BIN)")  # fmt: skip


@dataclass
class Plan:
    arch: str
    family: str
    setup: str
    data: Path
    save_dir: Path
    rows: dict[str, Sourced]
    precision: str
    processes: int
    nodes: int
    gpus: int
    launcher: str
    sequences: int  # blocks per GPU batch (--batch-size)
    update_freq: int
    tokens_per_update: int
    command: list[str]
    assumed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.processes * self.nodes


def criterion_options(family: str, rows) -> list[str]:
    """The options only the architecture's family has: Crossformer-SG trains with its regularizer."""
    if family == "crossformer_sg":
        return ["--criterion", GUIDANCE_CRITERION, "--label-smoothing", "0.0",
                "--guidance-weight", repr(rows["guidance_weight"].value)]  # fmt: skip
    return ["--criterion", "cross_entropy"]


def exact_split(rows, world: int, nodes: int, processes: int, gpus: int) -> tuple[int, int]:
    """(blocks per GPU batch, update_freq) with world x blocks x length x update_freq = tokens per update."""
    length, tokens, cap = (rows[k].value for k in ("tokens_per_sample", "tokens_per_update", "max_tokens"))
    if tokens % length or cap < length:
        raise RecipeError(f"tokens per update {tokens} and the per-GPU batch {cap} must be multiples of (and at least) "
                          f"the sequence length {length}: set TOKENS_PER_UPDATE / MAX_TOKENS accordingly")  # fmt: skip
    split = split_batch(tokens // length, world, cap // length)
    if split is None:
        raise RecipeError(
            f"{tokens // length} sequences of {length} tokens per update ({rows['tokens_per_update'].source}) cannot be "
            f"split exactly over {world} processes ({nodes} node(s) x {processes} "
            f"{'GPU(s)' if gpus else 'CPU process(es)'}): choose NUM_NODES x NUM_GPUS among "
            f"{', '.join(map(str, exact_worlds(tokens // length)))}, or set TOKENS_PER_UPDATE"
        )
    return split


def plan(args, arch: str, setup: str, env=None, visible: int | None = None, read_data: bool = True) -> Plan:
    """Everything a run of ``arch`` needs, and its command; pure (no GPU or data needed in a dry run)."""
    env = {} if env is None else env
    family = lm_family(arch)
    data, name, assumed = resolve_data(args, read_data)
    notes: list[str] = []
    rows = dict(SETUPS[setup])
    for option, fld, value in (("--max-update (MAX_UPDATE)", "max_update", args.max_update),
                               ("--max-tokens (MAX_TOKENS)", "max_tokens", args.max_tokens),
                               ("--tokens-per-update (TOKENS_PER_UPDATE)", "tokens_per_update", args.tokens_per_update),
                               ("--seed (SEED)", "seed", args.seed)):  # fmt: skip
        if value is not None:
            override(rows, fld, value, option)
    gpus = (visible if visible is not None else cuda_devices()) if args.gpus is None else args.gpus
    processes = gpus or args.cpu_procs
    world = processes * args.nodes
    sequences, update_freq = exact_split(rows, world, args.nodes, processes, gpus)
    v = {k: r.value for k, r in rows.items()}
    length = v["tokens_per_sample"]
    if sequences * length < v["max_tokens"]:
        notes.append(f"batch per GPU lowered from {v['max_tokens']} to {sequences * length} tokens so that "
                     f"{world} x {sequences} x {length} x {update_freq} = {v['tokens_per_update']}")  # fmt: skip
    launcher = choose_launcher(args, world, env)
    if gpus and launcher != "slurm" and gpus > (visible if visible is not None else cuda_devices()):
        if not args.dry_run:
            raise RecipeError(f"--gpus {gpus} (NUM_GPUS): not that many CUDA devices visible")
        assumed.append(f"{gpus} GPU(s) per node (planning only)")
    precision = "fp32" if args.fp16 == "0" or (args.fp16 == "auto" and not gpus) else v["precision"]
    if precision == "fp32" and args.fp16 == "1":
        precision = "fp16"
    if precision != v["precision"]:
        notes.append(f"precision {precision}: the set-up's is {v['precision']} ({rows['precision'].source})")

    cmd = [data, "--user-dir", PLUGIN_DIR, "--arch", arch, "--task", "language_modeling",
           "--tokens-per-sample", str(length), "--sample-break-mode", v["sample_break_mode"],
           *optimizer_options(v)]  # fmt: skip
    if v["share_embeddings"]:
        cmd += ["--share-decoder-input-output-embed"]
    cmd += ["--batch-size", str(sequences), "--max-tokens", str(sequences * length),
            "--required-batch-size-multiple", "1", "--update-freq", str(update_freq), "--max-update", str(v["max_update"])]  # fmt: skip
    cmd += precision_options(precision, gpus)
    cmd += ["--no-epoch-checkpoints", "--seed", str(v["seed"]), "--log-format", "simple", "--log-interval", "100"]
    cmd += placement_options(gpus, world, launcher, env)
    cmd += ["--save-dir", args.save_dir_for(arch, name), *criterion_options(family, rows)]
    changed = sorted({a for a in args.extra if a.startswith("--")} & set(map(str, cmd)))
    if changed:
        notes.append(f"pass-through after -- overrides the recipe's {', '.join(changed)}")
    cmd = [str(c) for c in launcher_prefix(launcher, args, processes, env, notes) + cmd + list(args.extra)]
    return Plan(arch, family, setup, data, Path(args.save_dir_for(arch, name)), rows, precision, processes, args.nodes,
                gpus, launcher, sequences, update_freq, world * sequences * length * update_freq, cmd, assumed, notes)  # fmt: skip


def describe(p: Plan) -> list[str]:
    lines = [f"set-up {p.setup} for {p.arch} on {p.data.name}:"]
    lines += [f"  {name:<18} {p.rows[name].value!s:<14} {p.rows[name].source}" for name in FIELDS]
    lines += [f"assumed: {a}" for a in p.assumed] + [f"note: {n}" for n in p.notes]
    unit = "GPU(s)" if p.gpus else "CPU process(es)"
    lines.append(f"tokens per update: {p.nodes} node(s) x {p.processes} {unit} x --batch-size {p.sequences} x "
                 f"{p.rows['tokens_per_sample'].value} tokens x --update-freq {p.update_freq} = {p.tokens_per_update}")  # fmt: skip
    return lines


def train(p: Plan) -> None:
    p.save_dir.mkdir(parents=True, exist_ok=True)
    setup = {k: {"value": r.value, "source": r.source} for k, r in p.rows.items()}
    write_json(p.save_dir / "train_setup.json", {"arch": p.arch, "setup": p.setup, "values": setup, "command": p.command,
                                                 "tokens_per_update": p.tokens_per_update, "notes": p.notes})  # fmt: skip
    start = time.monotonic()
    status, _ = stream(p.command)
    if status != 0:
        raise RecipeError(f"fairseq-train failed ({exit_text(status)}); its output is above")
    log(TAG, f"done in {(time.monotonic() - start) / 60:.1f} min: {p.save_dir}")


def main(argv=None, env=None):
    import os

    args = parse_args(argv)
    attach_save_dirs(args)
    if args.write_golden:
        write_golden(args.write_golden)
        return
    plans = [plan(args, arch, args.hparams, os.environ if env is None else env) for arch in args.archs]
    for p in plans:
        for line in describe(p):
            log(TAG, line)
        print(f"# {p.arch}: {p.tokens_per_update} tokens per update "
              f"({p.world} x {p.sequences} x {p.rows['tokens_per_sample'].value} x {p.update_freq})\n{render(p.command)}",
              flush=True)  # fmt: skip
    if not args.dry_run:
        for p in plans:
            train(p)


# ------------------------------------------------------------------------------------------- golden

GOLDEN_DATA = {"dca-paper": "lm1b", "dca-cpu": "lm_multi30k_en"}
# (GPUs per node, nodes); the CPU set-up's 16 sequences do not split over 32 GPUs (an error, tested)
GOLDEN_WORLDS = {"dca-paper": ((0, 1), (1, 1), (8, 1), (8, 4)), "dca-cpu": ((0, 1), (1, 1), (8, 1))}
GOLDEN_HEADER = [
    "# fairseq-train commands of every (LM set-up, family, GPUs x nodes): tests/test_lm_recipes.py",
    "# a command = its 'SETUP gpus=N nodes=M:' line with {arch} replaced + the tail of its family's line",
    "# regenerate: python -m scripts.lm.train_lm --write-golden tests/golden/lm_commands.txt",
]


def golden_text(cmd: list[str]) -> str:
    import shlex

    return render(cmd).replace(shlex.quote(sys.executable), "python").replace(f"{REPO}/", "")


def golden_lines() -> list[str]:
    """Every command as a template (``{arch}`` for the name) and one tail per family (its arch and criterion):
    a set-up whose command differs between families beyond those stops here."""
    from fairseq_plugins.lm import LM_FAMILIES

    lines = []
    for setup in SETUPS_ORDER:
        for gpus, nodes in GOLDEN_WORLDS[setup]:
            key, template, tails = f"{setup} gpus={gpus} nodes={nodes}", None, []
            for family in sorted(LM_FAMILIES):
                arch = f"{family}_lm_d6"
                args = parse_args([arch, GOLDEN_DATA[setup], "--hparams", setup, "--gpus", str(gpus), "--nodes",
                                   str(nodes), "--dry-run"])  # fmt: skip
                attach_save_dirs(args)
                cmd = plan(args, arch, setup, env={}, visible=0, read_data=False).command
                cut = cmd.index("--criterion")
                text = golden_text(cmd[:cut]).replace(arch, "{arch}")
                if template not in (None, text):
                    raise RecipeError(f"{key}: {arch}'s command differs beyond its own options:\n{template}\n{text}")
                template = text
                tails.append(f"{key} {family}: {arch} {golden_text(cmd[cut:])}")
            lines += [f"{key}: {template}", *tails]
    return lines


def golden_command(lines: list[str], key: str, family: str) -> str:
    template = next(line.split(": ", 1)[1] for line in lines if line.startswith(key + ": "))
    arch, tail = next(line.split(": ", 1)[1] for line in lines if line.startswith(f"{key} {family}: ")).split(" ", 1)
    return template.replace("{arch}", arch) + " " + tail


def write_golden(path: Path) -> None:
    lines = golden_lines()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, GOLDEN_HEADER + lines)
    log(TAG, f"{sum(1 for line in lines if '{arch}' not in line)} commands written to {path}")


if __name__ == "__main__":
    run_main(TAG, main)
