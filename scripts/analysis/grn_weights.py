#!/usr/bin/env python
"""DeepCrossAttention appendix H, figure 10 (Heddes et al., "DeepCrossAttention: Supercharging Transformer
Residual Connections", arXiv:2502.06785): the distribution of the learned GRN biases b per layer and stack
position, from a trained ``dca_transformer`` checkpoint.

Figure 10 shows, for each GRN-v3 instance of a 30-layer model, the median over the d dimensions of the bias
b[:, j] of every stack position j (solid line) and a 90% band (shaded); the paper reads it as "the layers tend to
weight the inputs and the last few layers the most and frequently assign a negative bias for the intermediate
layers". Here: one panel per layer (and one for the output GRN y = GRN(G_{T+1})) of each stack, one line per GRN
output (DCA's three GRNs give queries, keys and values: q, k, v; the GRN-vX modes have one, "in").

Stack positions (fairseq_plugins/modules/depth_stack.py): 0 is the embedding and j >= 1 the output of layer j;
with k-DCA (``--dca-k K``) a layer reads [embedding, sum of the middle outputs, the last K outputs], labelled
0, "mid" and the layer numbers. GRN-v1 has one scalar per position (its band is a point). The input-dependent
part of GRN-v3, relu(wᵀĝ), is not a bias and is not shown, as in the paper.

The checkpoint is read with ``torch.load`` after ``import fairseq_plugins`` (fairseq's checkpoint types are on
the weights-only allow-list; weights-only loading stays on). It may be a fairseq checkpoint (a dict with
"model") or a bare state dict. The summary checks the paper's reading per GRN: is the median bias of the
embedding or of the newest output above the mean median of the intermediate positions, and how many
intermediate medians are negative.

    python -m scripts.analysis.grn_weights checkpoints/dca_iwslt_e6d6/checkpoint_best.pt --out docs/grn_weights
"""

import argparse
import re
from pathlib import Path

import torch

from scripts.analysis.analysis_common import (
    float_option,
    pyplot,
    save_figure,
    with_suffix,
    write_csv,
    write_json,
)

GRN_BIAS = re.compile(r"^(?:.*\.)?(encoder|decoder)\.(?:layers\.(\d+)\.grn|output_grn)\.b$")
OUTPUT_NAMES = {1: ["in"], 3: ["q", "k", "v"]}


def load_state_dict(path: Path) -> tuple[dict, object]:
    """(state dict, model config or None) of a fairseq checkpoint or a bare state dict."""
    import fairseq_plugins  # noqa: F401  (allows fairseq's checkpoint types under weights-only loading)

    state = torch.load(path, map_location="cpu")
    if not isinstance(state, dict):
        raise SystemExit(f"{path}: not a checkpoint or state dict (got {type(state).__name__})")
    if "model" in state:
        cfg = state.get("cfg")
        model_cfg = cfg.get("model") if isinstance(cfg, dict) or hasattr(cfg, "get") else None
        return state["model"], model_cfg if model_cfg is not None else state.get("args")
    return state, None


def dca_k(model_cfg, entries_by_layer: dict[int, int]) -> int:
    """k of k-DCA: from the checkpoint's configuration, else from the stack sizes (k = 0 keeps every output)."""
    k = getattr(model_cfg, "dca_k", None) if model_cfg is not None else None
    if k is not None:
        return int(k)
    if all(n == t + 1 for t, n in entries_by_layer.items()):
        return 0
    return max(entries_by_layer.values()) - 2


def position_labels(t: int, entries: int, k: int) -> list[str]:
    """Labels of the stack a GRN reads before 0-based layer ``t`` (t = number of layers: the output GRN).

    The stack holds the embedding (0) and the outputs of layers 1..t; with k-DCA, once t > k, the embedding,
    the sum of the older outputs ('mid') and layers t-k+1..t (depth_stack.DepthStack.chunks).
    """
    if k == 0 or t <= k:
        return [str(j) for j in range(entries)]
    return ["0", "mid", *[str(layer) for layer in range(t - k + 1, t + 1)]]


def bias_rows(state: dict, model_cfg, band: float) -> list[dict]:
    """One row per (stack, GRN, output, stack position): median and band of b over the d dimensions."""
    found: dict[tuple[str, int | None], torch.Tensor] = {}
    for name, tensor in state.items():
        match = GRN_BIAS.match(name)
        if match:
            layer = int(match[2]) if match[2] is not None else None
            found[(match[1], layer)] = tensor.detach().float()
    if not found:
        raise SystemExit("no GRN biases (`*.layers.N.grn.b`, `*.output_grn.b`) in this checkpoint: "
                         "is it a dca_transformer checkpoint?")
    rows = []
    low_q, high_q = (1 - band) / 2, (1 + band) / 2
    for side in ("encoder", "decoder"):
        layers = {t: b.size(1) for (s, t), b in found.items() if s == side and t is not None}
        if not layers:
            continue
        k = dca_k(model_cfg, layers)
        num_layers = max(layers) + 1
        for t in [*sorted(layers), None]:
            b = found.get((side, t))
            if b is None:
                continue
            b = b.unsqueeze(-1) if b.dim() == 2 else b  # GRN-v1: (outputs, entries) -> one "dimension"
            labels = position_labels(t if t is not None else num_layers, b.size(1), k)
            names = OUTPUT_NAMES.get(b.size(0), [str(o) for o in range(b.size(0))])
            quantiles = torch.quantile(b, torch.tensor([low_q, 0.5, high_q]), dim=-1)  # (3, outputs, entries)
            for o, out_name in enumerate(names):
                for j, label in enumerate(labels):
                    rows.append({"side": side, "grn": "output" if t is None else t + 1, "output": out_name,
                                 "position": j, "position_label": label, "median": quantiles[1, o, j].item(),
                                 "band_low": quantiles[0, o, j].item(), "band_high": quantiles[2, o, j].item(),
                                 "mean": b[o, j].mean().item()})
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per stack: how often the embedding or newest output has a larger median bias than the intermediate
    positions, and how many intermediate medians are negative (appendix H's reading)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["side"], r["grn"], r["output"]), []).append(r)
    summary: dict = {}
    for (side, _grn, _out), rs in groups.items():
        s = summary.setdefault(side, {"grns": 0, "with_intermediate": 0, "ends_above_intermediate": 0,
                                      "intermediate_positions": 0, "negative_intermediate": 0,
                                      "median_embedding": [], "median_newest": [], "median_intermediate": []})
        s["grns"] += 1
        ends, middle = [rs[0]["median"], rs[-1]["median"]], [r["median"] for r in rs[1:-1]]
        s["median_embedding"].append(ends[0])
        s["median_newest"].append(ends[1])
        if middle:
            s["with_intermediate"] += 1
            s["ends_above_intermediate"] += max(ends) > sum(middle) / len(middle)
            s["intermediate_positions"] += len(middle)
            s["negative_intermediate"] += sum(m < 0 for m in middle)
            s["median_intermediate"].extend(middle)
    for s in summary.values():
        for key in ("median_embedding", "median_newest", "median_intermediate"):
            values = s.pop(key)
            s["mean_" + key] = sum(values) / len(values) if values else None
    return summary


def plot(rows: list[dict], band: float, path: Path) -> None:
    plt = pyplot()
    panels = list(dict.fromkeys((r["side"], r["grn"]) for r in rows))
    cols = min(8, max(sum(1 for p in panels if p[0] == side) for side in ("encoder", "decoder")))
    sides = list(dict.fromkeys(p[0] for p in panels))
    per_side = [[p for p in panels if p[0] == side] for side in sides]
    n_rows = sum(-(-len(ps) // cols) for ps in per_side)
    fig, axes = plt.subplots(n_rows, cols, figsize=(2.3 * cols, 2.0 * n_rows), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    row = 0
    for ps in per_side:
        for i, (side, grn) in enumerate(ps):
            ax = axes[row + i // cols][i % cols]
            ax.set_visible(True)
            lowest = float("inf")
            for c, out in enumerate(dict.fromkeys(r["output"] for r in rows)):
                rs = [r for r in rows if (r["side"], r["grn"], r["output"]) == (side, grn, out)]
                if not rs:  # the output GRN has one output, the layers' DCA GRNs three
                    continue
                x = [r["position"] for r in rs]
                # markers: the first layer's GRN reads a single entry, a line alone would not show it
                ax.plot(x, [r["median"] for r in rs], color=f"C{c}", linewidth=1, marker="o", markersize=2,
                        label=out)
                ax.fill_between(x, [r["band_low"] for r in rs], [r["band_high"] for r in rs], color=f"C{c}",
                                alpha=0.2, linewidth=0)
                ax.set_xticks(x, [r["position_label"] for r in rs], fontsize=5)
                lowest = min(lowest, *(r["band_low"] for r in rs))
            if lowest <= 0:  # the paper's reading: negative biases switch a position off through the ReLU
                ax.axhline(0, color="gray", linewidth=0.5)
            ax.set_title(f"{side} {'output GRN' if grn == 'output' else f'layer {grn}'}", fontsize=7)
            ax.tick_params(labelsize=6)
            if i == 0:
                ax.legend(fontsize=6)
                ax.set_ylabel(f"bias b (median, {band:.0%} band)", fontsize=6)
        row += -(-len(ps) // cols)
    fig.supxlabel("stack position (0 = embedding, j = output of layer j)", fontsize=8)
    save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="a dca_transformer checkpoint (fairseq's .pt) or state dict")
    p.add_argument("--band", type=float_option("band", 0.0, 1.0, True), default=0.9,
                   help="central fraction of the d dimensions the band covers, in (0, 1] (default 0.9)")
    p.add_argument("--side", choices=["encoder", "decoder", "both"], default="both",
                   help="which stack to show (default both)")
    p.add_argument("--out", type=Path, default=Path("grn_weights"),
                   help="output prefix: PREFIX.csv, PREFIX.json, PREFIX.png (default ./grn_weights)")
    return p


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        parser.error(f"checkpoint {args.checkpoint} does not exist")
    state, model_cfg = load_state_dict(args.checkpoint)
    rows = [r for r in bias_rows(state, model_cfg, args.band) if args.side in ("both", r["side"])]
    summary = summarize(rows)
    write_csv(with_suffix(args.out, ".csv"), rows)
    write_json(with_suffix(args.out, ".json"), {"checkpoint": str(args.checkpoint), "band": args.band,
                                                 "summary": summary})
    plot(rows, args.band, with_suffix(args.out, ".png"))
    for side, s in summary.items():
        print(f"{side}: {s['grns']} GRN outputs; embedding or newest output above the intermediate mean in "
              f"{s['ends_above_intermediate']}/{s['with_intermediate']}; negative intermediate medians "
              f"{s['negative_intermediate']}/{s['intermediate_positions']}; mean median bias: embedding "
              f"{s['mean_median_embedding']:.3f}, newest {s['mean_median_newest']:.3f}, intermediate "
              f"{s['mean_median_intermediate'] if s['mean_median_intermediate'] is not None else float('nan'):.3f}")
    return summary


if __name__ == "__main__":
    main()
