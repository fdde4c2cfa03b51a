#!/usr/bin/env python
"""Turn a Pre-LN transformer checkpoint into a DeepCrossAttention one that translates identically.

    python -m scripts.training.retrofit_dca IN.pt OUT.pt --dca-k 2
    fairseq-train DATA --user-dir fairseq_plugins --arch dca_k2_e6d6 --restore-file OUT.pt --reset-optimizer ...

DCA's GRNs start as the plain sum of the stack (b = 1, w = 0), which is exactly what a Pre-LN transformer's
residual stream is, so adding them to a trained Pre-LN model does not change its function (the paper's table 4,
"retrofitting"). IN.pt must be a checkpoint of fairseq's ``transformer`` with --encoder-normalize-before and
--decoder-normalize-before (the plugin's ``transformer_preln_*`` archs); a Post-LN checkpoint is refused, since
its layers normalise the residual stream itself and no GRN initialisation reproduces it.

OUT.pt keeps every weight of IN.pt under the same name, adds the GRNs, and records ``dca_transformer`` (the
``dca_*`` preset of the same shape where one exists) with --dca-mode/--dca-k in its model config, so that
fairseq-generate builds the DCA model from it. The optimizer state is dropped (its shapes no longer match);
continue training with --reset-optimizer. IN.pt is read with torch's weights-only loading (importing the plugin
allows fairseq's checkpoint types) and OUT.pt is written to a temporary file and then moved into place.
"""

import argparse
import copy
import os
import pickle
import sys
import tempfile
from pathlib import Path

import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel

from fairseq_plugins.axes.aggregation import DCA
from fairseq_plugins.models.baselines import AutocastTransformerModel
from fairseq_plugins.models.presets import PRESETS
from fairseq_plugins.modules.dca import initial_dca_state
from fairseq_plugins.modules.depth_stack import DCA_MODES
from fairseq_plugins.validation import (
    PluginOptionError,
    argparse_type,
    check_choice,
    check_int,
)


class RetrofitError(Exception):
    """IN.pt cannot be retrofitted; the message says why."""


def model_args(state: dict) -> argparse.Namespace:
    """The model's argparse options from a fairseq checkpoint (argparse-trained: cfg["model"] or args)."""
    args = state.get("args")
    cfg_model = (state.get("cfg") or {}).get("model")
    for candidate in (cfg_model, args):
        if isinstance(candidate, argparse.Namespace):
            return candidate
    raise RetrofitError("no argparse model config (cfg['model'] or args) found; is this a fairseq-train checkpoint?")


def matching_arch(args: argparse.Namespace, dca_k: int) -> str:
    """The dca_* preset with the shape of ``args`` (``dca_k2_*`` for k = 2), else the plain dca_transformer."""
    family = "dca_k2" if dca_k == 2 else "dca"
    for preset in PRESETS.values():
        width = preset.width
        if preset.family == family and (preset.encoder_layers, preset.decoder_layers, width.embed_dim,
                                        width.ffn_dim, width.heads) == (
            args.encoder_layers, args.decoder_layers, args.encoder_embed_dim,
            args.encoder_ffn_embed_dim, args.encoder_attention_heads,
        ):  # fmt: skip
            return preset.arch
    return "dca_transformer"


def retrofit(state: dict, dca_mode: str = "dca", dca_k: int = 0) -> dict:
    """A new checkpoint dict: ``state`` with GRNs added at their initial values and a DCA model config."""
    args = model_args(state)
    arch = getattr(args, "_name", None) or getattr(args, "arch", None)
    if ARCH_MODEL_REGISTRY.get(arch) not in (TransformerModel, AutocastTransformerModel):
        raise RetrofitError(
            f"the checkpoint's model is --arch {arch}, not fairseq's transformer; only a Pre-LN transformer "
            "(transformer_preln_*) can be retrofitted"
        )
    post_ln = [side for side in ("encoder", "decoder") if not getattr(args, f"{side}_normalize_before", False)]
    if post_ln:
        raise RetrofitError(
            f"the checkpoint is a Post-LN transformer (--{post_ln[0]}-normalize-before is off): DCA starts as a "
            "Pre-LN residual network, so only a Pre-LN checkpoint (transformer_preln_*) keeps its translations"
        )
    new_args = copy.deepcopy(args)
    new_args.dca_mode, new_args.dca_k = dca_mode, dca_k
    try:
        DCA.check(new_args)
    except PluginOptionError as err:
        raise RetrofitError(str(err)) from None
    new_args.arch = new_args._name = matching_arch(new_args, dca_k)

    added = initial_dca_state(new_args)
    clash = sorted(set(added) & set(state["model"]))
    if clash:
        raise RetrofitError(f"the checkpoint already has DCA parameters ({clash[0]}, ...)")
    reference = state["model"]["encoder.embed_tokens.weight"]
    out = dict(state)
    out["model"] = {**state["model"], **{k: v.to(reference.dtype) for k, v in added.items()}}
    if isinstance((state.get("cfg") or {}).get("model"), argparse.Namespace):
        out["cfg"] = {**state["cfg"], "model": new_args}
    if isinstance(state.get("args"), argparse.Namespace):
        out["args"] = new_args
    out["last_optimizer_state"] = None  # Adam's state has no entries for the GRNs: --reset-optimizer
    return out


def save_atomically(state: dict, path: Path) -> None:
    """Write to a temporary file next to ``path``, then move it into place (no half-written OUT.pt)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", type=Path, metavar="IN.pt", help="checkpoint of a Pre-LN transformer")
    parser.add_argument("output", type=Path, metavar="OUT.pt", help="where to write the DCA checkpoint")
    parser.add_argument("--dca-k", type=argparse_type(check_int, "dca_k", 0, 10_000), default=0, metavar="K",
                        help="k-DCA's k: 0 (default) keeps every layer output; at most the number of layers")  # fmt: skip
    parser.add_argument("--dca-mode", type=argparse_type(check_choice, "dca_mode", tuple(DCA_MODES)), default="dca",
                        metavar="MODE", help=f"one of {', '.join(DCA_MODES)} (default dca)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.input.resolve() == args.output.resolve():
        parser.error("OUT.pt must differ from IN.pt")
    try:
        try:
            state = torch.load(args.input, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            reason = next((line.strip() for line in str(err).splitlines() if "Unsupported global" in line), err)
            raise RetrofitError(
                f"weights-only loading refused it (only tensors and fairseq's checkpoint types are allowed): {reason}"
            ) from None
        new = retrofit(state, args.dca_mode, args.dca_k)
    except (RetrofitError, OSError) as err:
        print(f"retrofit_dca.py: cannot retrofit {args.input}: {err}", file=sys.stderr)
        return 2
    save_atomically(new, args.output)
    model = model_args(new)
    shape = ""
    if model.arch == "dca_transformer":  # no preset of this shape: name it on the command line
        shape = " " + " ".join(
            f"--{name.replace('_', '-')} {getattr(model, name)}"
            for name in ("encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim",
                         "encoder_ffn_embed_dim", "decoder_ffn_embed_dim", "encoder_attention_heads",
                         "decoder_attention_heads")
        )  # fmt: skip
    print(
        f"wrote {args.output} (--arch {model.arch} --dca-mode {args.dca_mode} --dca-k {args.dca_k}); continue "
        f"training with: fairseq-train DATA --user-dir fairseq_plugins --arch {model.arch}{shape} "
        f"--dca-mode {args.dca_mode} --dca-k {args.dca_k} --restore-file {args.output} --reset-optimizer ..."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
