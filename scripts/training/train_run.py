"""Printing and running planned trainings (scripts/training/train_recipe.py): the set-up with its sources,
the records a run leaves in its save directory (train_setup.json, train_summary.json), fairseq-train's output
streamed, and the checkpoint average a set-up asks for."""

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from scripts.training.setups import FIELDS
from scripts.training.train_options import TAG
from scripts.training.train_plan import Plan
from scripts.training.training_common import (
    REPO,
    RecipeError,
    exit_text,
    log,
    write_json,
)


def render(cmd: list[str]) -> str:
    """The command as a shell line; ``${VAR}`` placeholders stay unquoted so the shell expands them."""
    return " ".join(c if c.startswith("${") else shlex.quote(c) for c in cmd)


def describe(p: Plan) -> list[str]:
    lines = [f"set-up {p.setup} ({p.why}) for {p.arch} on {p.dataset} ({p.direction}):"]
    for name in FIELDS:
        value = p.rows[name].value
        shown = f"{value[0]}->{value[1]}" if isinstance(value, tuple) else str(value)
        lines.append(f"  {name:<20} {shown:<22} {p.rows[name].source}")
    lines += [f"assumed: {a}" for a in p.assumed] + [f"note: {n}" for n in p.notes]
    unit = "GPU(s)" if p.gpus else "CPU process(es)"
    lines.append(f"tokens per update: {p.nodes} node(s) x {p.processes} {unit} x --max-tokens {p.max_tokens} x "
                 f"--update-freq {p.update_freq} = {p.tokens_per_update}")  # fmt: skip
    return lines


def manifest_of(p: Plan, args) -> dict:
    return {
        "arch": p.arch, "model": p.model, "setup": p.setup, "setup_chosen_by": p.why, "dataset": p.dataset,
        "data": str(p.data), "direction": p.direction, "precision": p.precision,
        "values": {k: {"value": list(r.value) if isinstance(r.value, tuple) else r.value, "source": r.source}
                   for k, r in p.rows.items()},
        "nodes": p.nodes, "processes_per_node": p.processes, "gpus_per_node": p.gpus, "launcher": p.launcher,
        "max_tokens": p.max_tokens, "update_freq": p.update_freq, "tokens_per_update": p.tokens_per_update,
        "assumed": p.assumed, "notes": p.notes, "passthrough": list(args.extra), "command": p.command,
    }  # fmt: skip


def stream(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd``, echo its output as it comes, return (exit status, the output)."""
    lines = []
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return proc.returncode, "".join(lines)


def summarize(output: str) -> dict:
    """Facts from fairseq-train's log (simple or json format): parameters, updates, last validation loss."""
    params = re.findall(r"num\. (?:shared )?model params: ([\d,]+)", output)
    updates = re.findall(r"num_updates\"?:? \"?(\d+)", output)
    valid = re.findall(r"valid on 'valid' subset \| loss ([\d.]+)|\"valid_loss\": \"([\d.]+)\"", output)
    valid = ["".join(v) for v in valid]
    return {
        "parameters": int(params[-1].replace(",", "")) if params else None,
        "num_updates": int(updates[-1]) if updates else None,
        "valid_loss": float(valid[-1]) if valid else None,
    }


def average_last(save_dir: Path, n: int) -> str | None:
    """Average the last ``n`` update checkpoints into checkpoint_avgN.pt (scripts/training/average_checkpoints.py)."""
    found = sorted(save_dir.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    if len(found) < n:
        log(TAG, f"only {len(found)} update checkpoints, fewer than {n}: no average")
        return None
    output = save_dir / f"checkpoint_avg{n}.pt"
    cmd = [sys.executable, str(Path(__file__).with_name("average_checkpoints.py")), "--inputs", str(save_dir),
           "--num-update-checkpoints", str(n), "--output", str(output)]  # fmt: skip
    if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
        raise RecipeError("checkpoint averaging failed (output above)")
    return str(output)


def train(p: Plan, args) -> None:
    p.save_dir.mkdir(parents=True, exist_ok=True)
    write_json(p.save_dir / "train_setup.json", manifest_of(p, args))
    start = time.monotonic()
    status, output = stream(p.command)
    seconds = time.monotonic() - start
    if status != 0:
        raise RecipeError(f"fairseq-train failed ({exit_text(status)}); its output is above")
    summary = {"arch": p.arch, "dataset": p.dataset, "data": str(p.data), "command": p.command, "setup": p.setup,
               "hparams": {k: r.value for k, r in p.rows.items()}, "gpus": p.gpus, "nodes": p.nodes,
               "fp16": p.precision != "fp32", "precision": p.precision, "update_freq": p.update_freq,
               "tokens_per_update": p.tokens_per_update, "train_seconds": round(seconds, 1), **summarize(output)}  # fmt: skip
    kind = p.rows["checkpoint"].value
    if kind.startswith("average-"):
        summary["averaged"] = average_last(p.save_dir, int(kind.removeprefix("average-")))
    write_json(p.save_dir / "train_summary.json", summary)
    log(TAG, f"done in {seconds / 60:.1f} min: {p.save_dir}")
