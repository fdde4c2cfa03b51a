"""Derf, Dynamic erf (Chen et al., "Stronger Normalization-Free Transformers", arXiv:2512.10938, the Derf
equation (eq. 10 per third-party notes, not checked); authors' code zlab-princeton/Derf ``DiT/dynamic_erf.py``,
read at 6e1d81c, and its language-model patches, read at 8dd9ea3).

An element-wise replacement for every LayerNorm, like DyT with erf and a learned shift inside:

    Derf(x) = gamma * erf(alpha x + s) + beta     alpha, s learned scalars, gamma, beta in R^C

Init (authors' code): alpha = 0.5, s = 0, gamma = 1, beta = 0; alpha and s are one scalar each per norm (the
code's ``torch.ones(1)``). alpha_0 depends on the task in the authors' code (zlab-princeton/Derf@8dd9ea3): 0.5
(``ALPHA_INIT``, the module default) for ViT, DiT, wav2vec 2.0 and the DNA model; 1.0 in the GPT-2 language
model (``language model/model_derf.patch``: ``attn_alpha_init_value``, ``ffn_alpha_init_value`` and
``dec_alpha_init_value`` default to 1.0, and ``train_derf.patch`` sets all three to 1.0). The model's choice
(``--derf-alpha-init``, axes/norm.py) follows it: 1.0 for the plugin's language models, 0.5 for translation.

Interface, encoder-decoder decisions and half precision: as ``dyt.DynamicTanh`` (LayerNorm's constructor
and call; replace every LayerNorm including cross-attention's and the stack-final ones; stateless and
per-position; erf is bounded by 1 in float16 too).
"""

import torch
from torch import Tensor

from .pointwise_norm import PointwiseNorm

ALPHA_INIT = 0.5
SHIFT_INIT = 0.0


class DynamicErf(PointwiseNorm):
    """gamma * erf(alpha x + s) + beta over the trailing ``normalized_shape`` dimensions."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, export: bool = False, alpha_init: float = ALPHA_INIT,
                 shift_init: float = SHIFT_INIT):  # fmt: skip
        del eps, export  # LayerNorm's signature; Derf divides by nothing and has no fused kernel to export
        super().__init__(normalized_shape, elementwise_affine, bias, device, dtype, alpha=alpha_init, shift=shift_init)

    def squash(self, x: Tensor) -> Tensor:
        return torch.erf(self.alpha.to(x.dtype) * x + self.shift.to(x.dtype))
