#!/usr/bin/env python
"""How a trained MUDDFormer reads earlier layers (Xiao et al., "MUDDFormer: Breaking Residual Bottlenecks in
Transformers via Multiway Dynamic Dense Connections", arXiv:2502.12170, eq. 5-8): per stack, connection (after
block i; "out" is the last, whose one way R is the stack output) and way (Q, K, V, R; C where a fifth way feeds
cross-attention), on real sentences, the mean weight A_i^c[t, j] on every block output X_0 .. X_i (X_0 the
embedding) and how far the model moved from its initialisation, where every way is X_i (A = 1 on the current
output, 0 elsewhere: the model starts as its Pre-LN transformer).

The weights are unnormalised and may be negative, so beside the mean weight the tool reports, per token:
- ``older_abs``: sum over j < i of |A_j|, the weight on earlier outputs (0 at initialisation);
- ``older_share``: sum over j < i of |A_j| ||X_j|| / sum over all j of |A_j| ||X_j||, the norm-weighted share of
  earlier outputs in the way (0 at initialisation);
- ``token_std``: the standard deviation over tokens of each weight, averaged over the sources: how dynamic the
  weights are (0 at initialisation, where W2 = 0 leaves the static a_i alone).

Every sentence is its own batch (no padding positions enter the statistics). The model is the checkpoint's, in
evaluation mode (no dropout), teacher-forced on the reference.

    python -m scripts.analysis.mudd_weights CKPT --data data-bin/multi30k_de_en --out docs/mudd_weights
"""

import argparse
from pathlib import Path

import torch

from scripts.analysis.analysis_common import (
    add_checkpoint_options,
    measure_checkpoint,
    observe,
    pyplot,
    save_figure,
    with_suffix,
    write_csv,
    write_json,
)

WAY_NAMES = ("Q", "K", "V", "R", "C")
SUMMARY_KEYS = ("current", "embedding", "older_abs", "older_share", "token_std")


class Collector:
    """Wraps ``forward`` of every DenseConnection of every MultiwayDenseConnections module of a model (an
    instance attribute, removed by close): per stack, connection and way, sums over tokens of A, A^2, the weight
    on earlier outputs and their norm-weighted share."""

    def __init__(self, model: torch.nn.Module):
        from fairseq_plugins.modules.muddformer import MultiwayDenseConnections

        self.units = {name.removesuffix(".mudd"): m for name, m in model.named_modules()
                      if isinstance(m, MultiwayDenseConnections)}  # fmt: skip
        self.stats: dict[tuple[str, int], dict] = {}
        for stack, module in self.units.items():
            for connection in module.connections:
                connection.forward = self._wrap(stack, connection)

    def _wrap(self, stack: str, connection):
        forward = type(connection).forward.__get__(connection)

        def wrapped(outputs):
            i = connection.index
            a = type(connection).weights(connection, outputs[-1]).double()  # (seq_len, batch, ways, i + 1)
            a = a.reshape(-1, connection.ways, i + 1)  # (tokens, ways, sources)
            norms = torch.stack([x.reshape(a.shape[0], -1).double().norm(dim=-1) for x in outputs[: i + 1]], -1)
            weighted = a.abs() * norms.unsqueeze(1)  # (tokens, ways, sources)
            older = weighted[..., :i].sum(-1) / weighted.sum(-1).clamp_min(1e-300)
            s = self.stats.setdefault((stack, i), {"sum": torch.zeros(connection.ways, i + 1, dtype=torch.float64),
                                                   "square": torch.zeros(connection.ways, i + 1, dtype=torch.float64),
                                                   "older_abs": torch.zeros(connection.ways, dtype=torch.float64),
                                                   "older_share": torch.zeros(connection.ways, dtype=torch.float64),
                                                   "tokens": 0})  # fmt: skip
            s["sum"] += a.sum(0)
            s["square"] += a.square().sum(0)
            s["older_abs"] += a[..., :i].abs().sum(-1).sum(0)
            s["older_share"] += older.sum(0)
            s["tokens"] += a.shape[0]
            return forward(outputs)

        return wrapped

    def rows(self) -> list[dict]:
        out = []
        for (stack, i), s in self.stats.items():  # the order of the first pass: encoder, then decoder
            n = s["tokens"]
            mean = s["sum"] / n
            std = (s["square"] / n - mean.square()).clamp_min(0).sqrt()
            last = i == self.units[stack].num_layers
            names = ("R",) if last else WAY_NAMES[: mean.shape[0]]
            for c, way in enumerate(names):
                out.append({"stack": stack, "connection": "out" if last else i, "way": way, "sources": i + 1,
                            "current": mean[c, i].item(), "embedding": mean[c, 0].item(),
                            "older_abs": (s["older_abs"][c] / n).item(), "older_share": (s["older_share"][c] / n).item(),
                            "token_std": std[c].mean().item(),
                            "weights": [round(w, 6) for w in mean[c].tolist()],
                            "token_stds": [round(w, 6) for w in std[c].tolist()]})  # fmt: skip
        return out

    def close(self):
        for module in self.units.values():
            for connection in module.connections:
                connection.__dict__.pop("forward", None)


def measure(model: torch.nn.Module, batches) -> list[dict]:
    """Per stack, connection and way of ``model``'s MUDD connections, the statistics over ``batches``."""
    return observe(model, batches, Collector(model), missing="the model has no MUDD connections (a mudd_* architecture)")


def summary(rows: list[dict]) -> dict:
    """Per stack and way, the means over its connections of the current and embedding weights (1 and 0 at
    initialisation), the weight and norm-weighted share of earlier outputs and the weights' spread over tokens
    (all 0 at initialisation)."""
    out = {}
    for stack in dict.fromkeys(r["stack"] for r in rows):
        out[stack] = {}
        for way in dict.fromkeys(r["way"] for r in rows if r["stack"] == stack):
            rs = [r for r in rows if r["stack"] == stack and r["way"] == way]
            out[stack][way] = {"connections": len(rs), **{k: sum(r[k] for r in rs) / len(rs) for k in SUMMARY_KEYS}}
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_options(p, "a MUDDFormer model (arXiv:2502.12170)", "mudd_weights")
    return p


def plot(rows: list[dict], path: Path) -> None:
    """Per stack (rows) and way (columns), a heatmap of the mean weight: connection by source, centred at 0."""
    plt = pyplot()
    stacks = list(dict.fromkeys(r["stack"] for r in rows))
    ways = list(dict.fromkeys(r["way"] for r in rows))
    fig, axes = plt.subplots(len(stacks), len(ways), figsize=(3.6 * len(ways), 3.4 * len(stacks)), squeeze=False)
    for row, stack in zip(axes, stacks, strict=True):
        for ax, way in zip(row, ways, strict=True):
            rs = [r for r in rows if r["stack"] == stack and r["way"] == way]
            if not rs:
                ax.axis("off")
                continue
            width = max(r["sources"] for r in rs)
            grid = torch.full((len(rs), width), float("nan"))
            for k, r in enumerate(rs):
                grid[k, : r["sources"]] = torch.tensor(r["weights"])
            limit = float(grid.nan_to_num(0).abs().max()) or 1.0
            image = ax.imshow(grid.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
            ax.set_yticks(range(len(rs)), [str(r["connection"]) for r in rs], fontsize=6)
            ax.set_title(f"{stack}, way {way}", fontsize=9)
            ax.set_xlabel("source j (0: embedding)", fontsize=8)
            ax.set_ylabel("connection after block i", fontsize=8)
            fig.colorbar(image, ax=ax, fraction=0.046)
    save_figure(fig, path)


def main(argv=None) -> dict:
    args, rows, header = measure_checkpoint(build_parser(), argv, measure)
    result = {**header, "stacks": summary(rows)}
    write_csv(with_suffix(args.out, ".csv"), [{k: v for k, v in r.items() if k not in ("weights", "token_stds")} for r in rows])
    write_json(with_suffix(args.out, ".json"), {**result, "per_connection": rows})
    plot(rows, with_suffix(args.out, ".png"))
    for stack, ways in result["stacks"].items():
        for way, s in ways.items():
            print(f"{stack} {way}: {s['connections']} connections, {result['sentences']} sentences: weight on the current "
                  f"output {s['current']:.3f} (1 at initialisation), on the embedding {s['embedding']:.3f}; on earlier "
                  f"outputs {s['older_abs']:.3f} (norm-weighted share {s['older_share']:.3f}); spread over tokens "
                  f"{s['token_std']:.3f}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
