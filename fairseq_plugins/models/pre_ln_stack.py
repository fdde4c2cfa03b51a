"""What the depth-aggregation baselines (DenseFormer, DLCL, LAuReL, Hyper-Connections) share: a Pre-LN
transformer whose layer loop (layer_stack.py) carries a per-layer history, with option defaults and checks."""

import torch
from fairseq.models.transformer import base_architecture
from torch import nn

from ..validation import PluginOptionError

PRE_LN = {"encoder_normalize_before": True, "decoder_normalize_before": True}
FORMAT_VERSION = 1.0  # of the added weights' layout, for upgrade_state_dict_named should it ever change


def add_format_version(stack: nn.Module, family: str) -> None:
    """Record the layout version of the family's weights in the encoder's or decoder's state dict."""
    stack.register_buffer(f"{family}_version", torch.tensor([FORMAT_VERSION]))


def set_defaults(args, defaults: dict[str, object]) -> None:
    """Fill the family's defaults (and Pre-LN) where neither the command line nor a preset set them."""
    for name, value in {**defaults, **PRE_LN}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    base_architecture(args)


def check_pre_ln_stack(args, model: str) -> None:
    """Reject what a Pre-LN stack with per-layer weights cannot run, naming the option."""
    for side in ("encoder", "decoder"):
        if not getattr(args, f"{side}_normalize_before", False):
            raise PluginOptionError(
                f"{model} needs --{side}-normalize-before: the method is built on Pre-LN layers"
            )
        if getattr(args, f"{side}_layerdrop", 0) > 0 or getattr(args, f"{side}_layers_to_keep", None):
            raise PluginOptionError(
                f"--{side}-layerdrop and --{side}-layers-to-keep cannot be used with {model}: its weights "
                "are sized and indexed by each layer's position in the stack"
            )
    if getattr(args, "cross_self_attention", False):
        raise PluginOptionError(f"--cross-self-attention cannot be used with {model}")
