#!/usr/bin/env python
"""Which earlier sublayers a trained Attention Residuals model reads (Kimi Team, "Attention Residuals",
arXiv:2603.15031, eq. 2-6): per stack and query (each sublayer's input, then the stack output), on real
sentences, the mean weight alpha_{i->l} on every source, how far it is from the uniform average the paper's
zero-initialised pseudo-queries start from, and the weight on the embedding and on the newest source.

The sources of query l (0-based) are those it reads (fairseq_plugins/modules/attn_res.py): Full AttnRes
(block size 1) the embedding and the l earlier sublayer outputs; Block AttnRes (S) the embedding b_0, the
completed blocks and, inside a block, the partial sum of its outputs so far. The entropy ratio H(alpha) / log n
is 1 for the uniform average (every query at initialisation) and 0 for a weight of 1 on one source; "newest" is
the last source (the previous sublayer's output in Full AttnRes; the partial sum or the last completed block in
Block AttnRes). A model whose ratios stay near 1 trained its sublayers on a plain depth average and left the
learned depth attention unused.

alpha mixes sources of different sizes (the values are the raw outputs and block sums; only the keys are
RMS-normalised), so a weight is not a contribution: beside alpha the tool reports each source's share
alpha_i ||v_i|| / sum_j alpha_j ||v_j|| per token (the norm-weighted share), which at initialisation is each
source's norm over their sum.

Every sentence is its own batch (no padding positions enter the statistics). The model is the checkpoint's, in
evaluation mode (no dropout), teacher-forced on the reference (translation) or the text (language models).

    python -m scripts.analysis.attnres_weights CKPT --data data-bin/multi30k_de_en --out docs/attnres_weights
"""

import argparse
import math
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


class Collector:
    """Wraps ``read`` of every AttentionResiduals module of a model (an instance attribute, removed by close):
    per stack and query, the sum over tokens of alpha on each source, of its norm-weighted share and of the
    entropy ratio."""

    def __init__(self, model: torch.nn.Module):
        from fairseq_plugins.modules.attn_res import AttentionResiduals

        self.units = {name.removesuffix(".attn_res"): m for name, m in model.named_modules()
                      if isinstance(m, AttentionResiduals)}  # fmt: skip
        self.stats: dict[tuple[str, int], dict] = {}
        for stack, module in self.units.items():
            module.read = self._wrap(stack, module)

    def _wrap(self, stack: str, module):
        read = type(module).read.__get__(module)

        def wrapped(index, state):
            alpha = module.weights(index, state).double()  # (tokens, sources)
            n = alpha.shape[-1]
            values = [*state.blocks, *([] if state.partial is None else [state.partial])]
            norms = torch.stack([v.reshape(alpha.shape[0], -1).double().norm(dim=-1) for v in values], -1)
            weighted = alpha * norms
            share = weighted / weighted.sum(-1, keepdim=True).clamp_min(1e-300)
            entropy = -(alpha * alpha.clamp_min(1e-300).log()).sum(-1)
            s = self.stats.setdefault((stack, index), {"sum": torch.zeros(n, dtype=torch.float64), "tokens": 0,
                                                       "share": torch.zeros(n, dtype=torch.float64),
                                                       "entropy": 0.0, "block": module.block_size})  # fmt: skip
            s["sum"] += alpha.sum(0)
            s["share"] += share.sum(0)
            s["tokens"] += alpha.shape[0]
            s["entropy"] += (entropy / math.log(n)).sum().item() if n > 1 else float(alpha.shape[0])
            return read(index, state)

        return wrapped

    def rows(self) -> list[dict]:
        out = []
        for (stack, index), s in self.stats.items():  # the order of the first pass: encoder, then decoder
            mean, share = s["sum"] / s["tokens"], s["share"] / s["tokens"]
            last = index == self.units[stack].num_sublayers
            out.append({"stack": stack, "query": "out" if last else index + 1, "block_size": s["block"],
                        "sources": len(mean), "uniform": 1 / len(mean), "embedding": mean[0].item(),
                        "newest": mean[-1].item(), "entropy_ratio": s["entropy"] / s["tokens"],
                        "embedding_share": share[0].item(), "newest_share": share[-1].item(),
                        "weights": [round(w, 6) for w in mean.tolist()],
                        "shares": [round(w, 6) for w in share.tolist()]})  # fmt: skip
        return out

    def close(self):
        for module in self.units.values():
            module.__dict__.pop("read", None)


def measure(model: torch.nn.Module, batches) -> list[dict]:
    """Per stack and query of ``model``'s AttnRes, the statistics over ``batches`` (``net_input`` dicts)."""
    return observe(model, batches, Collector(model), missing="the model has no Attention Residuals (--depth-aggregation attnres or attnres-block)")


def summary(rows: list[dict]) -> dict:
    """Per stack, over its queries with more than one source: the mean entropy ratio, and the mean weight and
    norm-weighted share of the embedding and of the newest source beside the uniform weight they started at."""
    out = {}
    for stack in dict.fromkeys(r["stack"] for r in rows):
        rs = [r for r in rows if r["stack"] == stack and r["sources"] > 1]
        out[stack] = {"queries": len(rs), **{key: sum(r[key] for r in rs) / len(rs)
                      for key in ("entropy_ratio", "embedding", "newest", "embedding_share", "newest_share",
                                  "uniform")}}  # fmt: skip
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_options(p, "a Full or Block AttnRes model (arXiv:2603.15031)", "attnres_weights")
    return p


def plot(rows: list[dict], path: Path) -> None:
    """One heatmap per stack: query (rows) by source (columns), the mean weight over tokens."""
    plt = pyplot()
    stacks = list(dict.fromkeys(r["stack"] for r in rows))
    fig, axes = plt.subplots(1, len(stacks), figsize=(5.5 * len(stacks), 4.6), squeeze=False)
    for ax, stack in zip(axes[0], stacks, strict=True):
        rs = [r for r in rows if r["stack"] == stack]
        width = max(r["sources"] for r in rs)
        grid = torch.full((len(rs), width), float("nan"))
        for i, r in enumerate(rs):
            grid[i, : r["sources"]] = torch.tensor(r["weights"])
        image = ax.imshow(grid.numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
        ax.set_title(f"{stack} (block size {rs[0]['block_size']})", fontsize=9)
        ax.set_xlabel("source (0: embedding; Block: blocks, then the partial sum)")
        ax.set_ylabel("query (sublayer input; last: stack output)")
        fig.colorbar(image, ax=ax, fraction=0.046)
    save_figure(fig, path)


def main(argv=None) -> dict:
    args, rows, header = measure_checkpoint(build_parser(), argv, measure)
    result = {**header, "stacks": summary(rows)}
    write_csv(with_suffix(args.out, ".csv"), [{k: v for k, v in r.items() if k not in ("weights", "shares")} for r in rows])
    write_json(with_suffix(args.out, ".json"), {**result, "per_query": rows})
    plot(rows, with_suffix(args.out, ".png"))
    for stack, s in result["stacks"].items():
        print(f"{stack}: {s['queries']} queries, {result['sentences']} sentences: entropy ratio {s['entropy_ratio']:.3f} "
              f"(1 = uniform), mean weight on the embedding {s['embedding']:.3f} and on the newest source "
              f"{s['newest']:.3f} (uniform {s['uniform']:.3f}); norm-weighted shares {s['embedding_share']:.3f} and "
              f"{s['newest_share']:.3f}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
