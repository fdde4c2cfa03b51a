#!/usr/bin/env python
"""Depth-to-width guidance of Levine et al., "Limits to Depth-Efficiencies of Self-Attention" (NeurIPS 2020),
section 5.2-5.3, eq. 9-10, table 1 and figures 3-4.

At the transition between the depth-efficient and depth-inefficient regimes the width is exponential in the
depth, log(d_x) = a + b L, and with the paper's size measure N = 12 L d_x^2 the transition (= optimal) size of
a depth-L network is

    N_transition(L) = 12 L e^{2a} e^{2bL}                                            (eq. 9)

A network with N > N_transition(L) is too shallow for its size (deepen it), one with N < N_transition(L) too
deep (widen it). Given a budget N, the optimal depth solves N_transition(L) = N, the width is sqrt(N / 12L).

Recovering (a, b): the fitted values of eq. 10 are missing from our copy of the paper. Table 1 lists the optimal
(depth, width) the fit gives for nine sizes (GPT-3 Small ... 175B, and 1T); every row lies on the line
log(d_x) = a + b L up to the rounding of the depth to an integer. So (a, b) is the least-squares line of
log(width) against depth over table 1's nine rows. The tool checks the recovered law against the same table
(a budget of 12 L d^2 of each trained GPT-3 model must give the table's optimal depth and width) and against the
numbers in the text: N_transition(96) = 1.17e12 and N_transition(80) = 1.65e11.

What N counts: the paper uses Kaplan et al.'s non-embedding size 12 L d_x^2 (per layer 4 d^2 attention and
8 d^2 feed-forward with d_ff = 4 d; biases, LayerNorms, token and position embeddings left out), so table 1's
sizes are 12 L d^2 of the GPT-3 models (85M for "125M" GPT-3 Small). For a named architecture of this plugin,
N is counted from the built model: every parameter except token and position embeddings and the output
projection (so biases, LayerNorms and the decoder's cross-attention, 4 d^2 per decoder layer, are included).
Its depth L is encoder + decoder layers (the longest chain of attention layers from source to output; the law
was fitted on single self-attention stacks, so this is an interpretation) and its width the model dimension.
"Near optimal" means within --tolerance of the optimal depth (a convention of this tool, not the paper's).

    python -m scripts.analysis.depth_width --out docs/depth_width              # fit, table-1 check, plot
    python -m scripts.analysis.depth_width --budget 85M --budget 1.3B          # suggested depth and width
    python -m scripts.analysis.depth_width --arch residual_iwslt_e6d6 --arch transformer_preln_e18d18
    python -m scripts.analysis.depth_width --family transformer_preln --out docs/depth_width
"""

import argparse
import math
import re
from pathlib import Path

import numpy as np

from scripts.analysis.analysis_common import (
    build_arch,
    check_arch,
    float_option,
    pyplot,
    save_figure,
    with_suffix,
    write_csv,
    write_json,
)

# Table 1 of the paper: (model, depth and width of the trained GPT-3 model, optimal depth and width by the fit).
# The 1T row has no trained model.
TABLE_1 = [
    ("GPT-3 Small", 12, 768, 23, 555),
    ("GPT-3 Medium", 24, 1024, 32, 886),
    ("GPT-3 Large", 24, 1536, 38, 1220),
    ("GPT-3 XL", 24, 2048, 42, 1550),
    ("GPT-3 2.7B", 32, 2560, 47, 2110),
    ("GPT-3 6.7B", 32, 4096, 54, 3150),
    ("GPT-3 13B", 40, 5140, 60, 4200),
    ("GPT-3 175B", 96, 12288, 80, 13500),
    ("1-Trillion", None, None, 95, 30100),
]
# section 5.3: N_transition(96) = 1.17 +- 0.23 e12 and N_transition(80) = 1.65 +- 0.25 e11
TEXT_CHECKS = [(96, 1.17e12, 0.23e12), (80, 1.65e11, 0.25e11)]
MIN_DEPTH, MAX_DEPTH = 1.0, 200.0
NON_EMBEDDING_EXCLUDED = ("embed_tokens", "embed_positions", "output_projection")
SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def fit_table_1() -> dict:
    """Least squares of log(width) against depth over table 1's optimal (depth, width) rows."""
    depth = np.array([row[3] for row in TABLE_1], dtype=float)
    log_width = np.log([row[4] for row in TABLE_1])
    design = np.stack([np.ones_like(depth), depth], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, log_width, rcond=None)
    residuals = log_width - (a + b * depth)
    dof = len(depth) - 2
    covariance = residuals @ residuals / dof * np.linalg.inv(design.T @ design)
    r2 = 1 - residuals @ residuals / ((log_width - log_width.mean()) ** 2).sum()
    return {"a": float(a), "b": float(b), "sigma_a": float(math.sqrt(covariance[0, 0])),
            "sigma_b": float(math.sqrt(covariance[1, 1])), "r2": float(r2),
            "max_abs_width_residual": float(np.abs(np.expm1(residuals)).max())}


def transition_size(depth: float, a: float, b: float) -> float:
    """N_transition(L) = 12 L e^{2a} e^{2bL} (eq. 9)."""
    return 12 * depth * math.exp(2 * a + 2 * b * depth)


def optimal_depth(size: float, a: float, b: float) -> float:
    """The depth L with N_transition(L) = size (N_transition increases with L, so bisection)."""
    low, high = MIN_DEPTH, MAX_DEPTH
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if transition_size(mid, a, b) < size else (low, mid)
    return 0.5 * (low + high)


def suggest(size: float, fit: dict) -> dict:
    depth = optimal_depth(size, fit["a"], fit["b"])
    rounded = max(1, round(depth))
    return {"size": size, "optimal_depth": depth, "suggested_depth": rounded,
            "suggested_width": math.sqrt(size / (12 * rounded))}


def verdict(depth: float, optimal: float, tolerance: float) -> str:
    if depth > optimal * (1 + tolerance):
        return "too deep (widen it)"
    if depth < optimal * (1 - tolerance):
        return "too shallow (deepen it)"
    return "near optimal"


def check_table_1(fit: dict) -> list[dict]:
    """For each trained GPT-3 model of table 1: the recovered law's optimal depth/width vs the table's."""
    rows = []
    for name, depth, width, table_depth, table_width in TABLE_1:
        fitted_width = math.exp(fit["a"] + fit["b"] * table_depth)
        row = {"model": name, "table_depth": table_depth, "table_width": table_width,
               "fit_width_at_table_depth": fitted_width, "fit_width_error": fitted_width / table_width - 1}
        if depth is not None:
            s = suggest(12 * depth * width**2, fit)
            row.update(size=s["size"], optimal_depth=s["optimal_depth"], suggested_depth=s["suggested_depth"],
                       suggested_width=s["suggested_width"],
                       suggested_width_error=s["suggested_width"] / table_width - 1)
        rows.append(row)
    return rows


def non_embedding_parameters(arch: str) -> dict:
    """Non-embedding parameters, depth (encoder + decoder layers) and width of a registered architecture."""
    model = build_arch(arch, vocab_size=100, meta=True)  # embeddings are not counted: any vocabulary will do
    size = sum(p.numel() for n, p in model.named_parameters()
               if not any(part in n for part in NON_EMBEDDING_EXCLUDED))
    encoder, decoder = len(model.encoder.layers), len(model.decoder.layers)
    width = model.encoder.embed_tokens.embedding_dim
    return {"arch": arch, "encoder_layers": encoder, "decoder_layers": decoder, "depth": encoder + decoder,
            "width": width, "size": size, "size_12Ld2": 12 * (encoder + decoder) * width**2}


def judge_arch(arch: str, fit: dict, tolerance: float) -> dict:
    info = non_embedding_parameters(arch)
    s = suggest(info["size"], fit)
    return {**info, "optimal_depth": s["optimal_depth"], "suggested_depth": s["suggested_depth"],
            "suggested_width": s["suggested_width"],
            "transition_size_at_depth": transition_size(info["depth"], fit["a"], fit["b"]),
            "verdict": verdict(info["depth"], s["optimal_depth"], tolerance)}


def parse_size(text: str) -> float:
    """'85e6', '85M', '1.3B', '1T' -> parameters."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([KMBGT]?)\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(
            f"--budget must be a number of parameters such as 85e6, 85M, 1.3B or 1T; got {text!r}")
    size = float(match.group(1)) * SUFFIXES[match.group(2).upper()]
    return size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=parse_size, action="append", default=[],
                   help="non-embedding parameter budget (85e6, 85M, 1.3B, 1T), repeatable: prints the "
                   "suggested depth and width")
    p.add_argument("--arch", action="append", default=[],
                   help="registered architecture, repeatable: says whether it is too deep, too shallow or "
                   "near optimal for its non-embedding size")
    p.add_argument("--family", action="append", default=[],
                   help="every named architecture of this preset family (e.g. transformer_preln), repeatable")
    p.add_argument("--tolerance", type=float_option("tolerance", 0.0, 1.0, True), default=0.25,
                   help="a depth within this fraction of the optimal depth is 'near optimal', in (0, 1] "
                   "(default 0.25)")
    p.add_argument("--out", type=Path,
                   help="output prefix: writes PREFIX.csv (table-1 check), PREFIX.json (fit, table check, "
                   "budgets, archs) and PREFIX.png (figures 3a/3b with table 1); default: print only")
    return p


def print_report(fit: dict, table: list[dict], budgets: list[dict], archs: list[dict]) -> None:
    print(f"recovered fit (least squares over table 1): log(d_x) = a + b L, a = {fit['a']:.4f} "
          f"+- {fit['sigma_a']:.4f}, b = {fit['b']:.5f} +- {fit['sigma_b']:.5f}, R^2 = {fit['r2']:.4f}")
    for depth, value, err in TEXT_CHECKS:
        print(f"  N_transition({depth}) = {transition_size(depth, fit['a'], fit['b']):.3g} "
              f"(paper: {value:.3g} +- {err:.2g})")
    print("\ntable 1: optimal depth/width for 12 L d^2 of each trained model, recovered law vs paper")
    print(f"{'model':14} {'N':>9} {'L fit':>6} {'L tab':>5} {'d fit':>7} {'d tab':>6} {'err':>6}")
    for r in table:
        if "size" in r:
            print(f"{r['model']:14} {r['size']:9.3g} {r['optimal_depth']:6.1f} {r['table_depth']:5d} "
                  f"{r['suggested_width']:7.0f} {r['table_width']:6d} {100 * r['suggested_width_error']:5.1f}%")
    for s in budgets:
        print(f"\nbudget {s['size']:.3g} non-embedding parameters: depth {s['suggested_depth']} "
              f"(optimum {s['optimal_depth']:.1f}), width {s['suggested_width']:.0f}")
    if archs:
        print(f"\n{'arch':32} {'L':>3} {'d':>5} {'N':>9} {'L opt':>6} {'d opt':>6}  verdict")
    for r in archs:
        print(f"{r['arch']:32} {r['depth']:3d} {r['width']:5d} {r['size']:9.3g} {r['optimal_depth']:6.1f} "
              f"{r['suggested_width']:6.0f}  {r['verdict']}")


VERDICT_COLORS = {"too deep (widen it)": "C3", "too shallow (deepen it)": "C0", "near optimal": "C2"}


def plot(fit: dict, archs: list[dict], budgets: list[dict], path: Path) -> None:
    """(a) figure 3a: log width against depth; (b) figures 3b/4: N_transition(L) with table 1, the archs and
    budgets; (c) the same, zoomed on the archs, each labelled E{enc}D{dec}/width and coloured by verdict."""
    plt = pyplot()
    panels = 3 if archs else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    ax_w, ax_n = axes[0], axes[1]
    depths = np.linspace(1, 100, 200)
    ax_w.plot(depths, fit["a"] + fit["b"] * depths, label=f"fit: {fit['a']:.3f} + {fit['b']:.4f} L")
    ax_w.scatter([r[3] for r in TABLE_1], np.log([r[4] for r in TABLE_1]), color="k", s=14,
                 label="table 1 optimal (L, d_x)", zorder=3)
    ax_w.set(xlabel="depth L", ylabel="log d_x", title="(a) width at the transition (fig. 3a)")
    ax_w.legend(fontsize=8)

    ax_n.scatter([r[3] for r in TABLE_1], [12 * r[3] * r[4] ** 2 for r in TABLE_1], color="k", s=14,
                 label="table 1 optimal", zorder=3)
    trained = [r for r in TABLE_1 if r[1] is not None]
    ax_n.scatter([r[1] for r in trained], [12 * r[1] * r[2] ** 2 for r in trained], marker="x", color="gray",
                 label="GPT-3 as trained", zorder=3)
    for ax in axes[1:]:
        ax.plot(depths, [transition_size(L, fit["a"], fit["b"]) for L in depths], label="N_transition(L)")
        for verdict_name, color in VERDICT_COLORS.items():
            rs = [r for r in archs if r["verdict"] == verdict_name]
            if rs:
                ax.scatter([r["depth"] for r in rs], [r["size"] for r in rs], marker="D", s=18, color=color,
                           label=f"arch: {verdict_name}", zorder=4)
        for i, s in enumerate(budgets):
            ax.scatter(s["optimal_depth"], s["size"], marker="*", s=60, color="C1", zorder=4,
                       label="budget at its optimal depth" if i == 0 else None)
        ax.set(yscale="log", xlabel="depth L (encoder + decoder layers)", ylabel="non-embedding parameters N")
    ax_n.set_title("(b) optimal size per depth (figs. 3b, 4):\nabove = too shallow, below = too deep", fontsize=9)
    ax_n.legend(fontsize=7)
    if archs:
        ax_z = axes[2]
        for r in archs:
            ax_z.annotate(f"E{r['encoder_layers']}D{r['decoder_layers']}/{r['width']}", (r["depth"], r["size"]),
                          fontsize=6, xytext=(3, 2), textcoords="offset points")
        sizes = [r["size"] for r in archs]
        ax_z.set(xlim=(0, max(r["depth"] for r in archs) * 1.15), ylim=(min(sizes) / 2, max(sizes) * 2))
        ax_z.set_title("(c) the named architectures (E{enc}D{dec}/width)", fontsize=9)
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arch(parser, args.arch)
    if args.family:
        from fairseq_plugins.models.presets import PRESETS

        families = sorted({p.family for p in PRESETS.values()})
        unknown = [f for f in args.family if f not in families]
        if unknown:
            parser.error(f"--family {', '.join(unknown)} is not a preset family; choose from {', '.join(families)}")
        args.arch += [a for a, p in PRESETS.items() if p.family in args.family and a not in args.arch]
    fit = fit_table_1()
    low, high = transition_size(MIN_DEPTH, fit["a"], fit["b"]), transition_size(MAX_DEPTH, fit["a"], fit["b"])
    for size in args.budget:
        if not low <= size <= high:
            parser.error(f"--budget must be between {low:.3g} and {high:.3g} parameters (depths "
                         f"{MIN_DEPTH:g}-{MAX_DEPTH:g} under the law); got {size:.3g}")
    table = check_table_1(fit)
    budgets = [suggest(size, fit) for size in args.budget]
    archs = [judge_arch(arch, fit, args.tolerance) for arch in args.arch]
    print_report(fit, table, budgets, archs)
    result = {"fit": fit, "text_checks": [{"depth": d, "paper": v, "paper_error": e,
                                           "recovered": transition_size(d, fit["a"], fit["b"])}
                                          for d, v, e in TEXT_CHECKS],
              "table_1": table, "budgets": budgets, "archs": archs, "tolerance": args.tolerance}
    if args.out:
        columns = dict.fromkeys(k for r in table for k in r)  # the 1T row has no trained model: blanks
        write_csv(with_suffix(args.out, ".csv"), [{k: r.get(k) for k in columns} for r in table])
        write_json(with_suffix(args.out, ".json"), result)
        plot(fit, archs, budgets, with_suffix(args.out, ".png"))
    return result


if __name__ == "__main__":
    main()
