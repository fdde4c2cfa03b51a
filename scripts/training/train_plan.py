"""One run's plan (scripts/training/train_recipe.py): the set-up's values with the user's overrides, the
processes and exact batches, the precision and the fairseq-train command, checked before anything runs and
pure (a dry run needs no GPU and no data)."""

import os
from dataclasses import dataclass, field
from pathlib import Path

from scripts.training.setups import (
    MULTILINGUAL,
    Sourced,
    exact_worlds,
    override,
    setup_rows,
    split_batch,
)
from scripts.training.train_options import (
    PREPARE,
    arch_options,
    arch_width,
    check_architecture,
    check_direction,
    checkpoint_options,
    choose_launcher,
    cuda_devices,
    embedding_options,
    last_value,
    launcher_prefix,
    multilingual_options,
    optimizer_options,
    parse_dataset_name,
    placement_options,
    precision_options,
    resolve_data,
)
from scripts.training.training_common import PLUGIN_DIR, RecipeError


@dataclass
class Plan:
    arch: str
    model: str
    setup: str
    why: str
    dataset: str
    data: Path
    save_dir: Path
    rows: dict[str, Sourced]
    direction: str
    precision: str
    processes: int  # per node
    nodes: int
    gpus: int
    launcher: str  # single | torchrun | slurm
    max_tokens: int
    update_freq: int
    tokens_per_update: int  # of the final command, pass-through included
    command: list[str]
    assumed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.processes * self.nodes


def plan(args, arch: str, setup: str, why: str, env=None, visible: int | None = None, read_data: bool = True) -> Plan:
    """Everything a run of ``arch`` needs, and its command; pure (no GPU or data needed in a dry run)."""
    env = os.environ if env is None else env
    model = check_architecture(arch)
    data, manifest, name = resolve_data(args, read_data)
    assumed: list[str] = []
    notes: list[str] = []
    assumed_manifest = manifest is None
    name_direction = None
    if assumed_manifest:
        dataset, name_direction = parse_dataset_name(name)
        manifest = {"dataset": dataset}
        assumed.append(f"no data at {data}: planned as {dataset} prepared by recipes/{PREPARE[dataset]}")
    rows = setup_rows(setup, manifest["dataset"])

    # the user's overrides replace the set-up's values, and say so
    for option, fld, value in (("--max-update (MAX_UPDATE)", "max_update", args.max_update),
                               ("--max-tokens (MAX_TOKENS)", "max_tokens", args.max_tokens),
                               ("--tokens-per-update (TOKENS_PER_UPDATE)", "tokens_per_update", args.tokens_per_update),
                               ("--seed (SEED)", "seed", args.seed),
                               ("--average-last (AVERAGE_LAST)", "checkpoint",
                                f"average-{args.average_last}" if args.average_last else None)):  # fmt: skip
        if value is not None:
            override(rows, fld, value, option)

    # processes and exact batches
    gpus = (visible if visible is not None else cuda_devices()) if args.gpus is None else args.gpus
    processes = gpus or args.cpu_procs
    world = processes * args.nodes
    tokens = rows["tokens_per_update"].value
    split = split_batch(tokens, world, rows["max_tokens"].value)
    if split is None:
        raise RecipeError(
            f"{tokens} tokens per update ({rows['tokens_per_update'].source}) cannot be split exactly over "
            f"{world} processes ({args.nodes} node(s) x {processes} {'GPU(s)' if gpus else 'CPU process(es)'}) with at "
            f"most {rows['max_tokens'].value} tokens per GPU batch: processes x --max-tokens x --update-freq must "
            f"equal {tokens}, and lowering --max-tokens (MAX_TOKENS) cannot help when the process count does not "
            f"divide it. Choose NUM_NODES x NUM_GPUS (--nodes x --gpus; CPU_PROCS on CPU) among "
            f"{', '.join(map(str, exact_worlds(tokens)))}, or set TOKENS_PER_UPDATE (--tokens-per-update)"
        )
    max_tokens, update_freq = split
    if max_tokens < rows["max_tokens"].value:
        notes.append(f"--max-tokens lowered from {rows['max_tokens'].value} to {max_tokens} per GPU so that "
                     f"{world} x {max_tokens} x {update_freq} = {tokens}")  # fmt: skip
    launcher = choose_launcher(args, world, env)
    if launcher == "slurm" and world > 1 and processes == 1:
        raise RecipeError("LAUNCHER=slurm with one process per node: fairseq's SLURM detection then counts the node's "
                          "GPUs itself (and the batch would change); use NUM_GPUS >= 2 per node or LAUNCHER=torchrun")  # fmt: skip
    if launcher == "slurm" and env.get("SLURM_NNODES") and int(env["SLURM_NNODES"]) != args.nodes:
        raise RecipeError(f"NUM_NODES={args.nodes} (--nodes) but the SLURM allocation has SLURM_NNODES={env['SLURM_NNODES']}")
    if gpus and launcher != "slurm":
        available = visible if visible is not None else cuda_devices()
        if gpus > available:
            if not args.dry_run:
                raise RecipeError(f"--gpus {gpus} (NUM_GPUS): only {available} CUDA device(s) visible")
            assumed.append(f"{gpus} GPU(s) per node (this machine has {available}: planning only)")

    # precision
    want = rows["precision"].value
    if args.fp16 == "0":
        precision = "fp32"
    elif args.fp16 == "1":
        precision = want if want in ("fp16", "memory-efficient-fp16") else "fp16"
    else:
        precision = want if gpus else "fp32"
    if precision != want:
        why_not = "FP16=" + args.fp16 if args.fp16 != "auto" else "on CPU (FP16=1 trains in half precision there too)"
        notes.append(f"precision {precision}: the set-up's is {want} ({rows['precision'].source}); {why_not}")

    # the command
    if rows["direction"].value == MULTILINGUAL:
        direction = MULTILINGUAL
        task = multilingual_options(manifest, assumed_manifest, assumed)
    else:
        src, tgt = check_direction(rows, manifest, assumed_manifest, name_direction, args, assumed, notes)
        direction = f"{src}->{tgt}"
        task = ["--task", "translation", "--source-lang", src, "--target-lang", tgt]
    width = arch_width(arch)
    if rows["width"].value != "any" and width and width != rows["width"].value:
        notes.append(f"{arch} has width {width}; the set-up was run at {rows['width'].value} ({rows['width'].source})")
    v = {k: r.value for k, r in rows.items()}
    cmd = [data, "--user-dir", PLUGIN_DIR, "--arch", arch, *task,
           *optimizer_options(v), "--activation-dropout", repr(v["activation_dropout"]),
           "--label-smoothing", repr(v["label_smoothing"]),
           *embedding_options(rows, manifest, assumed_manifest, assumed, notes)]  # fmt: skip
    if v["max_positions"]:
        cmd += ["--max-source-positions", str(v["max_positions"]), "--max-target-positions", str(v["max_positions"])]
    cmd += ["--max-tokens", str(max_tokens), "--update-freq", str(update_freq), "--max-update", str(v["max_update"])]
    cmd += precision_options(precision, gpus)
    if v["fp16_init_scale"] and precision != "fp32":
        cmd += ["--fp16-init-scale", str(v["fp16_init_scale"])]
    cmd += checkpoint_options(v["checkpoint"], manifest.get("segmentation", "bpe"))
    if v["patience"]:
        cmd += ["--patience", str(v["patience"])]
    cmd += ["--seed", str(v["seed"]), "--log-format", "simple", "--log-interval", "100"]
    cmd += placement_options(gpus, world, launcher, env)
    cmd += ["--save-dir", args.save_dir_for(arch, name), *arch_options(model, rows, precision)]
    extra_flags = {a for a in args.extra if a.startswith("--")}
    # pass-through options replace the recipe's (argparse keeps the last); the arch-bound ones are then dropped
    bound = arch_options(model, rows, precision)
    if "--dual-residual-scale" in extra_flags and "--dual-residual-scale" in bound:
        i = cmd.index("--dual-residual-scale")
        del cmd[i : i + 2]
    changed = sorted(f for f in extra_flags if f in cmd)
    if changed:
        notes.append(f"pass-through after -- overrides the recipe's {', '.join(changed)}")
    cmd = [str(c) for c in launcher_prefix(launcher, args, processes, env, notes) + cmd + list(args.extra)]
    given = [last_value(cmd, o) or "1" for o in ("--max-tokens", "--update-freq", "--distributed-world-size")]
    final = tokens
    if not all(g.isdigit() for g in given):  # e.g. a per-epoch --update-freq list
        notes.append(f"DEVIATION: pass-through batch options {' '.join(given)}: tokens per update not checked")
    elif (final := int(given[0]) * int(given[1]) * int(given[2])) != tokens:
        notes.append(f"DEVIATION: the pass-through options give {final} tokens per update; the set-up's is {tokens}")
    return Plan(arch, model, setup, why, manifest["dataset"], data, Path(args.save_dir_for(arch, name)), rows,
                direction, precision, processes, args.nodes, gpus, launcher, max_tokens, update_freq, final, cmd,
                assumed, notes)  # fmt: skip
