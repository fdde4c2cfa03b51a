"""The layout version the layer-stack families (DenseFormer, DLCL, LAuReL, Hyper-Connections) record for their
added weights, read by ``upgrade_state_dict_named`` should that layout ever change."""

import torch
from torch import nn

FORMAT_VERSION = 1.0


def add_format_version(stack: nn.Module, family: str) -> None:
    """Record the layout version of the family's weights in the encoder's or decoder's state dict."""
    stack.register_buffer(f"{family}_version", torch.tensor([FORMAT_VERSION]))
