"""DyT, Dynamic Tanh (Zhu, Chen, He, LeCun, Liu, "Transformers without Normalization", arXiv:2503.10622,
CVPR 2025, section 3 and algorithm 1; authors' code jiachenzhu/DyT ``dynamic_tanh.py``).

An element-wise replacement for every LayerNorm:

    DyT(x) = gamma * tanh(alpha x) + beta        alpha a learned scalar, gamma, beta in R^C

Init: alpha = alpha_0 = 0.5 (the paper's default for non-LLM models), gamma = 1, beta = 0. The paper's LLaMA
runs set alpha_0 per position (``LLAMA_ALPHA_INIT``: the attention-input, FFN-input and final DyT of
LLaMA 7B-70B, from the authors' LLaMA README) and drop beta there; ``bias=False`` gives that variant.
No values exist for translation (none of the papers has an encoder-decoder), so 0.5 everywhere is the
default and a factory may pass a per-site alpha_0 (our reading of section 7's "alpha_0 depends on width").

Interface: the constructor and call of ``torch.nn.LayerNorm`` (normalized_shape, eps, elementwise_affine,
bias, device, dtype; eps is accepted and unused, DyT has no variance) plus fairseq's ``export`` keyword
(ignored) and ``alpha_init``; ``forward(x)`` acts on the last dimension(s). So a ``--norm`` factory can build
it wherever fairseq builds a LayerNorm: the sublayers' ``self_attn_layer_norm``, ``encoder_attn_layer_norm``
(cross-attention), ``final_layer_norm``, the stacks' ``layer_norm`` and ``layernorm_embedding``.

Encoder-decoder decisions (ours): replace every LayerNorm, encoder and decoder, cross-attention included, as
the paper replaces every norm; fairseq already multiplies embeddings by sqrt(C) (the LLaMA code's learned
embedding scale is not part of DyT and is not added). Per-position and stateless: incremental decoding and
beam reordering are unaffected.

Half precision: tanh of a float16 input is finite for every input (it saturates at +-1), and alpha is one
scalar, so nothing is upcast; the output is bounded by |gamma| + |beta| whatever the depth.
"""

import torch
from torch import Tensor

from .pointwise_norm import PointwiseNorm

ALPHA_INIT = 0.5
# authors' LLaMA README: alpha_0 of the attention-input / FFN-input / final DyT per model size
LLAMA_ALPHA_INIT = {
    "7B": (0.8, 0.2, 0.2),
    "13B": (0.6, 0.15, 0.15),
    "34B": (0.2, 0.05, 0.05),
    "70B": (0.2, 0.05, 0.05),
}


class DynamicTanh(PointwiseNorm):
    """gamma * tanh(alpha x) + beta over the trailing ``normalized_shape`` dimensions."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, export: bool = False, alpha_init: float = ALPHA_INIT):  # fmt: skip
        del eps, export  # LayerNorm's signature; DyT divides by nothing and has no fused kernel to export
        super().__init__(normalized_shape, elementwise_affine, bias, device, dtype, alpha=alpha_init)

    def squash(self, x: Tensor) -> Tensor:
        return torch.tanh(self.alpha.to(x.dtype) * x)
