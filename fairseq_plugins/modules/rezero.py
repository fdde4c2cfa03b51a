"""ReZero (Bachlechner et al., "ReZero is All You Need: Fast Convergence at Large Depth", arXiv:2003.04887,
section 3, equation 1, and its ReZero-Transformer in section 5).

Each residual branch gets one scalar gate that starts at zero, and the LayerNorms go:

    x_{i+1} = x_i + alpha_i F(x_i),    alpha_i = 0 at initialisation     (eq. 1)

so every layer starts as the identity and the network is exactly its embedding at initialisation. The
ReZero-Transformer (section 5) removes all LayerNorms of the sublayers: F is the bare attention or FFN
(with dropout), not F(LN(x)). The module is the gate only; which norms remain is the norm placement
``rezero`` in ``norm_placement.py`` (no sublayer norms).

Encoder-decoder decisions (ours; the paper's Transformer experiments are encoder-only/decoder-only LMs):
- one alpha per sublayer, including cross-attention. Consequence: with alpha = 0 on cross-attention the
  decoder ignores the source at initialisation; it receives a gradient from the first step (d loss / d alpha
  = <grad, F(x)> != 0), so it learns to read it. We keep this faithful choice rather than a non-zero gate;
- stack-final norms: the paper does not say. ``norm_placement.REZERO`` keeps none inside the layers and
  leaves the stack-final LayerNorm as the layer loop's option (default: keep it on the encoder output and
  before the output projection, because fairseq's embedding scale sqrt(C) and the untied 1/sqrt(C) output
  init assume a normalised last state; without it the logits at initialisation are embedding-sized);
- per-position: a scalar gate, no state across time steps, nothing to reorder in beam search.

Half precision: one multiply by a scalar, nothing to keep in float32.

Interface: ``ReZeroGate()``; ``forward(x, residual) = residual + alpha * x`` (fairseq's
``residual_connection`` argument order).
"""

import torch
from torch import Tensor, nn


class ReZeroGate(nn.Module):
    """The scalar gate alpha of one residual branch (init 0, or ``init`` to study other starts)."""

    def __init__(self, init: float = 0.0):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(init)))

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + alpha * x."""
        return residual + self.alpha.to(x.dtype) * x
