#!/usr/bin/env python
"""How far a trained mHC or mHC-lite model's coefficients moved from their start (Xie et al., "mHC:
Manifold-Constrained Hyper-Connections", arXiv:2512.24880, eq. 3 and 7-9; Yang & Gao, mHC-lite,
arXiv:2601.05732): per sublayer unit, on real sentences, the weight H_res puts on other streams and the range
of H_pre and H_post.

H_res is doubly stochastic; the off-diagonal mass of a row i, sum_{j != i} H_res[i, j], is the share of stream
i's next state that comes from the other streams (0 for H_res = I, 1 - 1/n for the uniform matrix). The
plugin's initialisations (fairseq_plugins/modules/mhc.py, ``--mhc-bias-init mhc_lite``, the default since issue 55,
and ``preln``: b_res = 0 on the diagonal and -8 off it, the mhc-lite code's values; ``mixed`` starts at 3 / (e + 3) = 0.525) starts every row at 3 e^-8 / (1 + 3 e^-8) = 1.0e-3 for mHC (n = 4) and 18 e^-8 / (1 + 23 e^-8)
= 6.0e-3 for mHC-lite (the 18 of the 23 other permutations that move a given stream), so a trained model
whose mass stays near these values has left the residual mixing unused and differs from hyper-connections
with H_res = I only in H_pre and H_post.

Every sentence is its own batch (no padding positions enter the statistics). The model is the checkpoint's,
in evaluation mode (no dropout), teacher-forced on the reference (translation) or the text (language models).

    python -m scripts.analysis.mhc_coefficients CKPT --data data-bin/multi30k_de_en --out docs/mhc_coefficients
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


class Collector:
    """Forward pre-hooks on every ManifoldHyperConnection of a model: per unit, the running sum, count and
    maximum of H_res's off-diagonal row mass over tokens, and the extremes of H_pre and H_post."""

    def __init__(self, model: torch.nn.Module):
        from fairseq_plugins.modules.mhc import ManifoldHyperConnection

        self.units = {name: m for name, m in model.named_modules() if isinstance(m, ManifoldHyperConnection)}
        self.stats = {name: {"sum": 0.0, "count": 0, "max": 0.0, "pre": [float("inf"), -float("inf")],
                             "post": [float("inf"), -float("inf")]} for name in self.units}  # fmt: skip
        self.handles = [m.register_forward_pre_hook(self._hook(name)) for name, m in self.units.items()]

    def _hook(self, name: str):
        def hook(module, args):
            # the unit's forward computes these too but keeps them local: computed once more from its input
            pre, post, res = module.coefficients(args[0].detach())
            n = res.shape[-1]
            off = (res.double() * (1 - torch.eye(n, dtype=torch.float64))).sum(-1).flatten()  # per token and row
            s = self.stats[name]
            s["sum"] += off.sum().item()
            s["count"] += off.numel()
            s["max"] = max(s["max"], off.max().item())
            for key, value in (("pre", pre), ("post", post)):
                s[key] = [min(s[key][0], value.min().item()), max(s[key][1], value.max().item())]

        return hook

    def rows(self) -> list[dict]:
        out = []
        for name, s in self.stats.items():
            if s["count"]:
                out.append({"unit": name, "residual": self.units[name].residual, "offdiag_mean": s["sum"] / s["count"],
                            "offdiag_max": s["max"], "pre_min": s["pre"][0], "pre_max": s["pre"][1],
                            "post_min": s["post"][0], "post_max": s["post"][1]})  # fmt: skip
        return out

    def close(self):
        for h in self.handles:
            h.remove()


def measure(model: torch.nn.Module, batches) -> list[dict]:
    """Per mHC unit of ``model``, the statistics over ``batches`` (fairseq samples' ``net_input`` dicts)."""
    return observe(model, batches, Collector(model), missing="the model has no mHC or mHC-lite unit (--depth-aggregation mhc or mhc-lite)")


def summary(rows: list[dict]) -> dict:
    """Over all units: the mean of the units' mean off-diagonal mass, the largest token's, each unit's extremes."""
    return {"units": len(rows), "offdiag_mean_over_units": sum(r["offdiag_mean"] for r in rows) / len(rows),
            "offdiag_max": max(r["offdiag_max"] for r in rows), "offdiag_unit_means": [min(r["offdiag_mean"] for r in rows),
            max(r["offdiag_mean"] for r in rows)], "pre": [min(r["pre_min"] for r in rows), max(r["pre_max"] for r in rows)],
            "post": [min(r["post_min"] for r in rows), max(r["post_max"] for r in rows)]}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_options(p, "an mHC or mHC-lite model (arXiv:2512.24880)", "mhc_coefficients")
    return p


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, len(rows) / 6), 3.2))
    ax.bar(range(len(rows)), [r["offdiag_mean"] for r in rows], color="tab:blue", label="mean over tokens")
    ax.plot(range(len(rows)), [r["offdiag_max"] for r in rows], "k.", label="max")
    ax.set_yscale("log")
    ax.set_xlabel("mHC unit (encoder sublayers, then decoder)")
    ax.set_ylabel("H_res off-diagonal row mass")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> dict:
    args, rows, header = measure_checkpoint(build_parser(), argv, measure)
    result = {**header, **summary(rows)}
    write_csv(with_suffix(args.out, ".csv"), rows)
    write_json(with_suffix(args.out, ".json"), {**result, "per_unit": rows})
    plot(rows, with_suffix(args.out, ".png"))
    print(f"{result['units']} mHC units, {result['sentences']} sentences: H_res off-diagonal row mass {result['offdiag_mean_over_units']:.2e} "
          f"on average (units {result['offdiag_unit_means'][0]:.2e}-{result['offdiag_unit_means'][1]:.2e}), at most "
          f"{result['offdiag_max']:.2e}; H_pre in [{result['pre'][0]:.3f}, {result['pre'][1]:.3f}], H_post in "
          f"[{result['post'][0]:.3f}, {result['post'][1]:.3f}]")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
