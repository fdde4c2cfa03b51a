#!/usr/bin/env python
"""DeepCrossAttention figure 1 (Heddes et al., "DeepCrossAttention: Supercharging Transformer Residual
Connections", arXiv:2502.06785, section 1 and section 4.1): low-rank linear networks learning (a) the identity
and (b) a random affine map, as a residual network (ResNet) and as generalized residual networks (GRN-v1/2/3).

"Each model consists of 10 linear layers, each of rank 3, and is trained using mini-batch SGD", x is a
100-dimensional i.i.d. normal input, (a) minimises ||f(x) - x||^2 and (b) ||f(x) - y||^2 with y = Ax + b, A and b
i.i.d. standard normal. The paper's claim: after 10^3 batches (10^5 examples) the ResNet still cannot reconstruct
its input, while GRN-v1 reaches extremely small losses with 100x fewer examples ("information dilution").

The models (section 3.1, with the stack G_t = [x, f_1, ..., f_{t-1}] of the input and earlier layer outputs):
    ResNet   g_t = G_t 1                      layer t: f_t(g_t) = V_t U_t g_t + c_t, U_t: r x d, V_t: d x r
    GRN-vX   g_t = GRN_t(G_t)                 output y = G_{T+1} 1 (ResNet) or GRN_{T+1}(G_{T+1})
The GRNs are the plugin's own modules (fairseq_plugins/modules/grn.py: GRNv1, GRNv2, GRNv3; b starts at ones,
w at zeros, so every GRN network starts as the ResNet with the same layer weights).

Choices the paper leaves open:
- layer weights get PyTorch's default nn.Linear initialisation (the residual branches are not zero at the
  start, so the identity is not given for free) and each layer has a bias c_t (``--no-bias`` drops it), so
  the affine target's b is reachable;
- the loss is the mean squared error per coordinate (the paper's ||.||^2 divided by d: only the learning-rate
  scale changes), measured on each fresh training batch, so it is also a test loss;
- plain SGD, batch 100 (10^3 batches = 10^5 examples), one learning rate per model and task: the one of the
  ``--lr`` grid with the lowest final loss (mean of the last 10% of steps); a run whose loss becomes
  non-finite or grows 1e6-fold counts as diverged. The same seed gives every model the same layer weights
  and the same batches.

    python -m scripts.analysis.low_rank_residual --out docs/low_rank_residual
    python -m scripts.analysis.low_rank_residual --dim 20 --layers 4 --rank 1 --steps 200 --lr 0.03 --out /tmp/small
"""

import argparse
import math
from pathlib import Path

import torch
from torch import Tensor, nn

from fairseq_plugins.modules.grn import GRN_CLASSES
from scripts.analysis.analysis_common import (
    float_option,
    int_option,
    pyplot,
    save_figure,
    with_suffix,
    write_csv,
    write_json,
)

MODELS = ["resnet", "grn-v1", "grn-v2", "grn-v3"]
TASKS = {"identity": "(a) learning the identity", "affine": "(b) learning y = Ax + b"}
DIVERGED = 1e6  # a loss this many times the initial one counts as diverged


class LowRankNet(nn.Module):
    """T low-rank linear layers joined by a residual sum (``grn=None``) or by GRNs.

    Args:
        dim: d, the width of the input, output and every layer output.
        layers: T.
        rank: r, the rank of every layer V_t U_t.
        grn: a version in GRN_CLASSES (grn-v1/v2/v3) or None for the ResNet.
        bias: give each layer a bias c_t.
    """

    def __init__(self, dim: int, layers: int, rank: int, grn: str | None, bias: bool = True):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(dim, rank, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(rank, dim, bias=bias) for _ in range(layers))
        # GRN t reads the stack of t + 1 entries before layer t; the last one gives the output
        self.grns = None if grn is None else nn.ModuleList(
            GRN_CLASSES[grn](dim, t + 1) for t in range(layers + 1)
        )

    def mix(self, t: int, stack: list[Tensor]) -> Tensor:
        """g_t from the stack [x, f_1, ..., f_{t-1}] of tensors (batch, d)."""
        if self.grns is None:
            return torch.stack(stack).sum(0)
        return self.grns[t]([torch.stack(stack)])[0]  # a GRN takes chunks (entries, *, d), returns (1, *, d)

    def forward(self, x: Tensor) -> Tensor:
        stack = [x]
        for t, (down, up) in enumerate(zip(self.down, self.up, strict=True)):
            stack.append(up(down(self.mix(t, stack))))
        return self.mix(len(self.down), stack)


def make_task(task: str, dim: int, seed: int):
    """The target map x -> y: the identity, or y = Ax + b with A, b i.i.d. standard normal."""
    if task == "identity":
        return lambda x: x
    g = torch.Generator().manual_seed(seed + 1)
    matrix, offset = torch.randn(dim, dim, generator=g), torch.randn(dim, generator=g)
    return lambda x: x @ matrix.T + offset


def train(model_name: str, task: str, lr: float, args) -> list[float]:
    """SGD on fresh batches; the per-step MSE (stops early, padded with inf, if the run diverges)."""
    torch.manual_seed(args.seed)  # same layer weights for every model
    grn = None if model_name == "resnet" else model_name
    model = LowRankNet(args.dim, args.layers, args.rank, grn, bias=args.bias)
    target = make_task(task, args.dim, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = torch.Generator().manual_seed(args.seed + 2)  # same batches for every model
    losses: list[float] = []
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.dim, generator=batches)
        loss = (model(x) - target(x)).pow(2).mean()
        value = loss.item()
        if not math.isfinite(value) or (losses and value > DIVERGED * losses[0]):
            return losses + [math.inf] * (args.steps - len(losses))
        losses.append(value)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return losses


def final_loss(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10):]
    return sum(tail) / len(tail)


def run_all(args) -> tuple[list[dict], dict]:
    """Every model on every task at every learning rate; returns (per-run rows, best run per model/task)."""
    rows, curves = [], {}
    for task in args.task:
        for model_name in args.model:
            for lr in args.lr:
                losses = train(model_name, task, lr, args)
                final = final_loss(losses)
                rows.append({"task": task, "model": model_name, "lr": lr, "initial_mse": losses[0],
                             "final_mse": final, "diverged": not math.isfinite(final)})
                best = curves.get((task, model_name))
                if math.isfinite(final) and (best is None or final < best["final_mse"]):
                    curves[(task, model_name)] = {"lr": lr, "final_mse": final, "losses": losses}
    return rows, curves


def plot(curves: dict, tasks: list[str], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for (t, model_name), c in curves.items():
            if t == task:
                ax.plot(range(1, len(c["losses"]) + 1), c["losses"], linewidth=1,
                        label=f"{model_name} (lr {c['lr']:g}): {c['final_mse']:.2g}")
        ax.set(yscale="log", xlabel="SGD steps (batches)", ylabel="MSE (log scale)", title=TASKS[task])
        ax.legend(fontsize=8)
    save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int_option("dim", 2, 4096), default=100, help="d, 2-4096 (default 100)")
    p.add_argument("--layers", type=int_option("layers", 1, 256), default=10,
                   help="T, linear layers, 1-256 (default 10)")
    p.add_argument("--rank", type=int_option("rank", 1, 4096), default=3,
                   help="rank of every layer, 1 <= rank < dim (default 3)")
    p.add_argument("--steps", type=int_option("steps", 1, 10**7), default=1000,
                   help="SGD steps (batches), 1-1e7 (default 1000: the paper's 10^3 batches)")
    p.add_argument("--batch-size", type=int_option("batch_size", 1, 10**6), default=100,
                   help="examples per batch, 1-1e6 (default 100: 10^3 batches = 10^5 examples)")
    p.add_argument("--lr", type=float_option("lr", 0.0, 100.0, True), action="append",
                   help="SGD learning rate in (0, 100], repeatable: each model uses the best of the grid "
                   "(default 0.003 0.01 0.02 0.05 0.1)")
    p.add_argument("--model", choices=MODELS, action="append",
                   help=f"models to compare, repeatable (default: {' '.join(MODELS)})")
    p.add_argument("--task", choices=list(TASKS), action="append",
                   help="tasks, repeatable (default: identity affine)")
    p.add_argument("--no-bias", dest="bias", action="store_false", help="layers without a bias")
    p.add_argument("--seed", type=int_option("seed", 0, 2**31 - 1), default=0, help="seed (default 0)")
    p.add_argument("--out", type=Path, default=Path("low_rank_residual"),
                   help="output prefix: PREFIX.csv (every run), PREFIX.json (best runs with their curves), "
                   "PREFIX.png (default ./low_rank_residual)")
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rank >= args.dim:
        parser.error(f"--rank must be smaller than --dim ({args.dim}); got {args.rank}")
    args.lr = args.lr or [0.003, 0.01, 0.02, 0.05, 0.1]
    args.model = list(dict.fromkeys(args.model or MODELS))
    args.task = list(dict.fromkeys(args.task or TASKS))
    rows, curves = run_all(args)
    best = {f"{task}/{model}": {"lr": c["lr"], "final_mse": c["final_mse"]} for (task, model), c in curves.items()}
    write_csv(with_suffix(args.out, ".csv"), rows)
    write_json(with_suffix(args.out, ".json"), {
        "settings": {k: v for k, v in vars(args).items() if k != "out"}, "best": best,
        "curves": {f"{task}/{model}": c["losses"] for (task, model), c in curves.items()},
    })  # fmt: skip
    plot(curves, args.task, with_suffix(args.out, ".png"))
    print(f"{'task':9} {'model':7} {'best lr':>8} {'initial MSE':>12} {'final MSE':>11}")
    for (task, model), c in curves.items():
        print(f"{task:9} {model:7} {c['lr']:8g} {c['losses'][0]:12.4g} {c['final_mse']:11.4g}")
    for task in args.task:
        for model in args.model:
            if (task, model) not in curves:
                print(f"{task:9} {model:7} diverged at every learning rate of the grid")
    return best


if __name__ == "__main__":
    main()
