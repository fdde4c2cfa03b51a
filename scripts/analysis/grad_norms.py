#!/usr/bin/env python
"""ResiDual figure 2 (Xie et al., "ResiDual: Transformer with Dual Residual Connections", arXiv:2304.14802,
section 3.3 and appendix E): per-layer gradient norms and layer-to-layer input differences at initialisation.

Appendix E: "Transformer networks with 36 layers [...] Pre-LN, Post-LN, and ResiDual. The embedding dimension,
FFN dimension, and the number of attention heads were set to 256, 1024, and 4 [...] fairseq [...] without
modifying any initialization settings. [...] a dummy mini-batch with 16 sentences and 20 tokens per sentence.
[...] a forward and backward process to collect the gradient norm and x_k^in of each layer."

What the paper's figure shows, and this tool measures for any registered ``--arch``:
  (a) ||dL/dw_k||_F, the gradient norm of all parameters of layer k: Post-LN's vanishes towards the input
      (Theorem 3.1: O((1/2)^((N-k)/2) e^sqrt(N-k))), Pre-LN's and ResiDual's do not;
  (b) |x_{k+1} - x_k|, the mean absolute per-coordinate change of the layer input from one layer to the next
      (Corollary 3.4 is stated per coordinate): Pre-LN's decays like 1/sqrt(k) (representation collapse),
      Post-LN's and ResiDual's stay level (Theorem 3.6).

Interpretations (the paper leaves them open):
- "36 layers" is read as 36 layers in *each* stack (E36D36: ``--encoder-layers 36 --decoder-layers 36``, the
  defaults, applied to the ``*_iwslt_e36d6`` presets, which give the paper's 256/1024/4-head IWSLT width).
  fairseq counts layers per stack, and only this reading reproduces the figure: measured here, Post-LN's
  gradient vanishes along the 36-layer *decoder* (by 10^3 from layer 36 to layer 1) but not along the encoder.
  At initialisation attention is nearly uniform, so every decoder layer's cross-attention hands every encoder
  position the same gradient, which passes each encoder self-attention undamped; the decoder's per-position
  gradients of the loss do not. The encoder's depth matters too: after many Post-LN layers its token
  representations are nearly alike, so each decoder cross-attention adds a full-norm vector that its
  LayerNorm then scales down (the theory's norm-preserving f); measured on a 16-layer Post-LN decoder, the
  first/last gradient ratio is 0.05 behind a 36-layer encoder but 0.3 behind a 1-layer one.
  ``--encoder-layers 0 --decoder-layers 0`` keeps a preset's own depths (E36D6). Both stacks are measured
  and plotted, one row each.
- x_k is what layer k's first sub-block reads, the paper's x_k^ln: the query input of its self-attention, which
  is the layer input for Post-LN and ResiDual and LN(layer input) for Pre-LN (Theorem 3.3 is about the
  normalized input; the raw Pre-LN stream x^a only grows). ``--inputs raw`` measures the raw layer inputs
  (for a DCA layer, which reads the stack of earlier outputs, their plain sum G_t 1).
- Per layer by default (appendix E: "of each layer"); ``--granularity sublayer`` gives one point per
  self-attention / cross-attention / FFN block (the paper's "block" k), grouping each block's LayerNorm with it.
- The loss is the mean token cross-entropy of the decoder's predictions against random targets (fairseq's
  criterion sums and its trainer divides by the token count: the gradient of a first update, without label
  smoothing). Dropout is off by default (``--dropout``) so the figure does not depend on dropout masks.

Everything is measured with forward pre-hooks on the layers' sub-modules: no model code changes.

    python -m scripts.analysis.grad_norms --out docs/grad_norms
    python -m scripts.analysis.grad_norms --arch transformer_postln_iwslt_e36d6 --arch residual_iwslt_e36d6 \
        --encoder-layers 0 --decoder-layers 0 --out /tmp/e36d6
"""

import argparse
import itertools
from pathlib import Path

import torch
import torch.nn.functional as F

from scripts.analysis.analysis_common import (
    build_arch,
    check_arch,
    float_option,
    int_option,
    pyplot,
    save_figure,
    with_suffix,
    write_csv,
    write_json,
)

DEFAULT_ARCHS = ["transformer_postln_iwslt_e36d6", "transformer_preln_iwslt_e36d6", "residual_iwslt_e36d6"]

# parameter-name prefix inside a layer -> the sub-block it belongs to (a block's LayerNorm goes with it)
SUBLAYER_OF_PARAM = {
    "self_attn": "self_attn",
    "self_attn_layer_norm": "self_attn",
    "encoder_attn": "encoder_attn",
    "encoder_attn_layer_norm": "encoder_attn",
    "fc1": "ffn",
    "fc2": "ffn",
    "final_layer_norm": "ffn",
}
# the sub-module whose input is a sub-block's x^ln, in the order the blocks run
INPUT_MODULE_OF_SUBLAYER = {"self_attn": "self_attn", "encoder_attn": "encoder_attn", "ffn": "fc1"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", action="append",
                   help=f"registered architecture, repeatable (default: {' '.join(DEFAULT_ARCHS)})")
    p.add_argument("--encoder-layers", type=int_option("encoder_layers", 0, 512), default=36,
                   help="encoder depth, 0-512; 0 keeps the preset's (default 36: appendix E, see above)")
    p.add_argument("--decoder-layers", type=int_option("decoder_layers", 0, 512), default=36,
                   help="decoder depth, 0-512; 0 keeps the preset's (default 36: appendix E, see above)")
    p.add_argument("--batch-size", type=int_option("batch_size", 1, 4096), default=16,
                   help="sentences in the dummy batch, 1-4096 (default 16, appendix E)")
    p.add_argument("--tokens", type=int_option("tokens", 2, 1024), default=20,
                   help="tokens per source and target sentence, 2-1024 (default 20, appendix E)")
    p.add_argument("--vocab-size", type=int_option("vocab_size", 8, 1_000_000), default=10000,
                   help="dictionary size, 8-1e6 (default 10000, about IWSLT'14's BPE vocabulary)")
    p.add_argument("--granularity", choices=["layer", "sublayer"], default="layer",
                   help="one point per layer (default, appendix E) or per self-attn/cross-attn/FFN block")
    p.add_argument("--inputs", choices=["normalized", "raw"], default="normalized",
                   help="x_k: what the first sub-block reads (normalized, the paper's x^ln; default) or the "
                   "raw tensor each layer receives (raw; only with --granularity layer)")
    p.add_argument("--dropout", type=float_option("dropout", 0.0, 0.99), default=0.0,
                   help="dropout during the forward pass, 0-0.99 (default 0: deterministic)")
    p.add_argument("--seed", type=int_option("seed", 0, 2**31 - 1), default=1,
                   help="seed for the initialisation and the dummy batch (default 1)")
    p.add_argument("--out", type=Path, default=Path("grad_norms"),
                   help="output prefix: writes PREFIX.csv, PREFIX.json and PREFIX.png (default ./grad_norms)")
    return p


def dummy_batch(vocab_size: int, batch: int, tokens: int, nspecial: int, seed: int):
    """Random source, decoder input and target tokens, no padding (every sentence has ``tokens`` tokens)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(nspecial, vocab_size, (batch, tokens), generator=g)
    tgt = torch.randint(nspecial, vocab_size, (batch, tokens), generator=g)
    prev = torch.cat([torch.full((batch, 1), 2), tgt[:, :-1]], dim=1)  # eos (2) starts the decoder input
    lengths = torch.full((batch,), tokens, dtype=torch.long)
    return src, lengths, prev, tgt


def sublayers(layer, granularity: str) -> list[str]:
    if granularity == "layer":
        return ["layer"]
    return [name for name, module in INPUT_MODULE_OF_SUBLAYER.items() if getattr(layer, module, None) is not None]


def _first_input(args, kwargs):
    if args and args[0].dim() == 4:
        # a DCA layer reads the stack of earlier outputs as chunks (entries, seq, batch, dim): its raw input
        # is the plain sum of the stack, G_t 1, what a residual network would feed it
        return sum(chunk.sum(0) for chunk in args if chunk.dim() == 4)
    if args:
        return args[0]
    return kwargs["query"] if "query" in kwargs else kwargs["x"]


def attach_input_hooks(stack, granularity: str, inputs: str) -> tuple[list, list[tuple[int, str]], list]:
    """Record, in run order, the input of every layer (or sub-block) of ``stack`` on the next forward.

    Returns (recorded tensors, (layer index, sub-block) per slot, hook handles).
    """
    slots, modules = [], []
    for idx, layer in enumerate(stack.layers):
        if inputs == "raw":
            slots.append((idx, "layer"))
            modules.append(layer)
            continue
        for name in sublayers(layer, granularity):
            module_name = "self_attn" if name == "layer" else INPUT_MODULE_OF_SUBLAYER[name]
            module = getattr(layer, module_name, None)
            if module is None:
                raise SystemExit(f"layer {idx} of {type(stack).__name__} has no `{module_name}`: "
                                 "use --inputs raw for this architecture")
            slots.append((idx, name))
            modules.append(module)
    recorded: list = [None] * len(slots)
    handles = []
    for i, module in enumerate(modules):
        def hook(_module, args, kwargs, i=i):
            recorded[i] = _first_input(args, kwargs).detach()

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return recorded, slots, handles


def grad_norms(stack, slots: list[tuple[int, str]]) -> list[float]:
    """||dL/dw||_F over the parameters of each (layer, sub-block) slot."""
    sums = {slot: 0.0 for slot in slots}
    for idx, layer in enumerate(stack.layers):
        for name, p in layer.named_parameters():
            if p.grad is None:
                continue
            sub = "layer" if (idx, "layer") in sums else SUBLAYER_OF_PARAM.get(name.split(".")[0])
            if (idx, sub) in sums:
                sums[(idx, sub)] += p.grad.double().pow(2).sum().item()
    return [sums[slot] ** 0.5 for slot in slots]


def input_differences(recorded: list) -> list[float | None]:
    """mean |x_{k+1} - x_k| per coordinate for consecutive slots; None for the last slot."""
    diffs: list[float | None] = [(b - a).abs().mean().item() for a, b in itertools.pairwise(recorded)]
    return diffs + [None]


def measure(arch: str, args) -> list[dict]:
    """One forward and backward pass of ``arch`` on the dummy batch; one row per layer (or sub-block)."""
    extra = ["--dropout", str(args.dropout)]
    for side in ("encoder", "decoder"):
        layers = getattr(args, f"{side}_layers")
        if layers:
            extra += [f"--{side}-layers", str(layers)]
    torch.manual_seed(args.seed)
    model = build_arch(arch, args.vocab_size, extra).train()
    nspecial = model.encoder.dictionary.nspecial
    src, lengths, prev, tgt = dummy_batch(args.vocab_size, args.batch_size, args.tokens, nspecial, args.seed)

    hooks = {side: attach_input_hooks(getattr(model, side), args.granularity, args.inputs)
             for side in ("encoder", "decoder")}
    logits, _ = model(src, lengths, prev)
    F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1)).backward()

    rows = []
    for side, (recorded, slots, handles) in hooks.items():
        for h in handles:
            h.remove()
        norms = grad_norms(getattr(model, side), slots)
        for k, ((idx, sub), norm, diff) in enumerate(zip(slots, norms, input_differences(recorded)), start=1):
            rows.append({"arch": arch, "encoder_layers": len(model.encoder.layers),
                         "decoder_layers": len(model.decoder.layers), "side": side, "k": k,
                         "layer": idx + 1, "sublayer": sub, "grad_norm": norm, "input_diff": diff})
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per arch and side: first/last gradient norms and input differences, and their ratios."""
    out: dict = {}
    for r in rows:
        out.setdefault(r["arch"], {}).setdefault(r["side"], []).append(r)
    summary: dict = {}
    for arch, sides in out.items():
        for side, rs in sides.items():
            diffs = [r["input_diff"] for r in rs if r["input_diff"] is not None]
            g_first, g_last = rs[0]["grad_norm"], rs[-1]["grad_norm"]
            summary.setdefault(arch, {})[side] = {
                "points": len(rs),
                "grad_norm_first": g_first,
                "grad_norm_last": g_last,
                "grad_norm_min": min(r["grad_norm"] for r in rs),
                "grad_ratio_first_to_last": g_first / g_last if g_last else None,
                "input_diff_first": diffs[0] if diffs else None,
                "input_diff_last": diffs[-1] if diffs else None,
                "diff_ratio_last_to_first": diffs[-1] / diffs[0] if diffs and diffs[0] else None,
            }
    return summary


def print_summary(summary: dict) -> None:
    print(f"{'arch':34} {'stack':8} {'grad k=1':>9} {'grad k=N':>9} {'1/N':>7} "
          f"{'dx k=1':>7} {'dx k=N-1':>8} {'(N-1)/1':>7}")
    for arch, sides in summary.items():
        for side, s in sides.items():
            print(f"{arch:34} {side:8} {s['grad_norm_first']:9.3g} {s['grad_norm_last']:9.3g} "
                  f"{s['grad_ratio_first_to_last']:7.3g} {s['input_diff_first'] or float('nan'):7.3f} "
                  f"{s['input_diff_last'] or float('nan'):8.3f} {s['diff_ratio_last_to_first'] or float('nan'):7.3f}")


def plot(rows: list[dict], granularity: str, path: Path) -> None:
    """One row of panels per stack: (a) gradient norm per layer, (b) change of the layer input."""
    plt = pyplot()
    sides = list(dict.fromkeys(r["side"] for r in rows))
    fig, axes = plt.subplots(len(sides), 2, figsize=(11, 3.8 * len(sides)), squeeze=False)
    unit = "layer" if granularity == "layer" else "sub-block"
    # Post-LN and ResiDual share the Post-LN stream, so their input curves coincide: vary the line style
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "v")]
    for (ax_g, ax_d), side in zip(axes, sides):
        for i, arch in enumerate(dict.fromkeys(r["arch"] for r in rows)):
            rs = [r for r in rows if r["arch"] == arch and r["side"] == side]
            line, marker = styles[i % len(styles)]
            style = {"linestyle": line, "marker": marker, "markersize": 3,
                     "label": f"{arch} (E{rs[0]['encoder_layers']}D{rs[0]['decoder_layers']})"}
            ax_g.plot([r["k"] for r in rs], [r["grad_norm"] for r in rs], **style)
            rd = [r for r in rs if r["input_diff"] is not None]
            ax_d.plot([r["k"] for r in rd], [r["input_diff"] for r in rd], **style)
        ax_g.set(yscale="log", xlabel=f"{side} {unit} k", ylabel="||dL/dw_k||_F",
                 title=f"(a) {side}: gradient norm of each {unit}")
        ax_d.set(xlabel=f"{side} {unit} k", ylabel="mean |x_{k+1} - x_k|",
                 title=f"(b) {side}: change of the {unit} input")
        ax_g.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    archs = args.arch or DEFAULT_ARCHS
    check_arch(parser, archs)
    if args.inputs == "raw" and args.granularity != "layer":
        parser.error("--inputs raw needs --granularity layer (a sub-block's raw input is not one tensor "
                     "passed between layers)")
    rows = [row for arch in archs for row in measure(arch, args)]
    summary = summarize(rows)
    write_csv(with_suffix(args.out, ".csv"), rows)
    write_json(with_suffix(args.out, ".json"), {"settings": {k: str(v) for k, v in vars(args).items()},
                                                "archs": archs, "summary": summary})
    plot(rows, args.granularity, with_suffix(args.out, ".png"))
    print_summary(summary)
    return summary


if __name__ == "__main__":
    main()
