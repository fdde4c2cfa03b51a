#!/usr/bin/env python
"""Average the parameters of several fairseq checkpoints into one (fairseq's scripts/training/average_checkpoints.py,
which the fairseq wheel does not install).

    python -m scripts.training.average_checkpoints --inputs checkpoints/wmt14_en_de/ARCH --num-update-checkpoints 5 \
        --output checkpoints/wmt14_en_de/ARCH/checkpoint_avg5.pt
    python -m scripts.training.average_checkpoints --inputs a.pt b.pt c.pt --output avg.pt

Checkpoints are read with torch's default weights-only loading: importing ``fairseq_plugins`` first allows
exactly the types fairseq checkpoints hold (fairseq_plugins/checkpoint_safety.py), nothing else. The output
is the newest input with its model parameters replaced by the mean, accumulated in float64 and written back
in the models' own dtype: a model trained with --fp16 saves fp16 parameters and its average stays fp16 (half
the size, what fairseq-generate --fp16 loads), an fp32 model's stays fp32 (fairseq's own script writes fp32
for fp16 inputs). fairseq-generate and resuming read it like any checkpoint. All inputs must hold the same
parameter names, shapes and dtypes.
"""

import argparse
import os
import re
from pathlib import Path

import torch

import fairseq_plugins  # noqa: F401  (allow-lists fairseq's checkpoint types for weights-only loading)


def last_checkpoints(directory: Path, n: int, kind: str, upper_bound: int | None) -> list[Path]:
    """The ``n`` newest checkpointEPOCH.pt (kind "epoch") or checkpoint_EPOCH_UPDATE.pt (kind "update")."""
    pattern = re.compile(r"checkpoint(\d+)\.pt$" if kind == "epoch" else r"checkpoint_\d+_(\d+)\.pt$")
    found = []
    for path in directory.iterdir():
        match = pattern.fullmatch(path.name)
        if match and (upper_bound is None or int(match.group(1)) <= upper_bound):
            found.append((int(match.group(1)), path))
    if len(found) < n:
        raise SystemExit(f"error: --inputs {directory}: {len(found)} {kind} checkpoints found, {n} requested")
    return [path for _, path in sorted(found, reverse=True)[:n]]


def average(paths: list[Path]) -> dict:
    """The first checkpoint's state with the mean of all the checkpoints' model parameters, in their dtype."""
    state, sums, reference = None, {}, None
    for path in paths:
        loaded = torch.load(path, map_location="cpu")  # weights_only stays torch's default (True)
        model = loaded["model"]
        layout = {k: (tuple(v.shape), v.dtype) for k, v in model.items()}
        if reference is None:
            state, reference = loaded, layout
        elif layout != reference:
            differ = sorted(set(layout).symmetric_difference(reference)) or [
                f"{k} {layout[k][0]} {layout[k][1]} vs {reference[k][0]} {reference[k][1]}"
                for k in layout if layout[k] != reference[k]
            ]  # fmt: skip
            raise SystemExit(f"error: {path} does not match {paths[0]}: {', '.join(differ[:5])}")
        for key, value in model.items():
            if value.is_floating_point():
                sums[key] = sums.get(key, 0) + value.to(torch.float64)
    assert state is not None
    state["model"] = {
        key: (sums[key] / len(paths)).to(value.dtype) if value.is_floating_point() else value
        for key, value in state["model"].items()
    }
    return state


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, type=Path,
                   help="checkpoint files, or one directory with --num-epoch/update-checkpoints")
    p.add_argument("--output", required=True, type=Path, help="where to write the averaged checkpoint")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointEPOCH.pt")
    group.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_E_U.pt")
    p.add_argument("--checkpoint-upper-bound", type=int, help="ignore checkpoints after this epoch/update")
    args = p.parse_args(argv)

    count = args.num_epoch_checkpoints or args.num_update_checkpoints
    if count is not None:
        if len(args.inputs) != 1 or not args.inputs[0].is_dir():
            p.error("--num-*-checkpoints needs exactly one directory in --inputs")
        if count < 1:
            p.error(f"--num-*-checkpoints {count}: must be >= 1")
        kind = "epoch" if args.num_epoch_checkpoints else "update"
        paths = last_checkpoints(args.inputs[0], count, kind, args.checkpoint_upper_bound)
    else:
        paths = args.inputs
        missing = [str(q) for q in paths if not q.is_file()]
        if missing:
            p.error(f"--inputs: no such checkpoint: {', '.join(missing)}")
    print(f"[average] {len(paths)} checkpoints: {', '.join(q.name for q in paths)}", flush=True)
    state = average(paths)
    # written under a temporary name first: an interrupted write never leaves a loadable-looking file
    tmp = args.output.with_name(args.output.name + ".tmp")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in state["model"].values() if v.is_floating_point()})
    print(f"[average] wrote {args.output} ({', '.join(dtypes)})", flush=True)


if __name__ == "__main__":
    main()
