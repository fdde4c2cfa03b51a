"""ReZero (Bachlechner et al., "ReZero is All You Need: Fast Convergence at Large Depth", arXiv:2003.04887,
section 3, equation 1, and its ReZero-Transformer in section 5; authors' code majumderb/rezero
``rezero/transformer/rztx.py`` and ``README.md``, read at e2c94a8).

Each residual branch is scaled by one scalar gate that starts at zero, and the LayerNorms go:

    x_{i+1} = x_i + alpha_i F(x_i),    alpha_i = 0 at initialisation     (eq. 1)

so every layer starts as the identity and the network is exactly its embedding at initialisation. The
ReZero-Transformer (section 5) removes all LayerNorms of the sublayers: F is the bare attention or FFN
(with dropout), not F(LN(x)). The module is the gate only; which norms remain is the norm placement
``rezero`` in ``norm_placement.py`` (no sublayer norms).

The authors' form (the defaults, ``axes/residual_sites.py``):
- one alpha per layer, shared by its sublayers: ``RZTXEncoderLayer`` has one ``resweight`` for self-attention
  and FFN, ``RZTXDecoderLayer`` one for self-attention, cross-attention and FFN ("a single additional learned
  parameter per layer", the abstract). ``--rezero-gate sublayer`` gives every sublayer its own alpha;
- no stack-final LayerNorm: the README builds the stacks with ``nn.TransformerEncoder/Decoder`` and "make sure
  norm argument is left as None". ``--rezero-final-norm`` keeps fairseq's on the encoder output and before the
  output projection. Both were this plugin's defaults before issue 55; a checkpoint saved then is rebuilt so.

Encoder-decoder consequences: with alpha = 0 the decoder ignores the source at initialisation (cross-attention
is gated too); it receives a gradient from the first step (d loss / d alpha = <grad, F(x)> != 0, summed over
the layer's sublayers), so it learns to read it. Without the final norm, the output projection reads the
un-normalised stream: at initialisation the decoder's embedding (fairseq scales it by sqrt(C), so entries of
order 1) plus its positions. Per-position: a scalar gate, no state across time steps, nothing to reorder in
beam search.

Half precision: one multiply by a scalar, nothing to keep in float32.

Interface: ``ReZeroGate()``; ``forward(x, residual) = residual + alpha * x`` (fairseq's
``residual_connection`` argument order); one module serves every site of a layer when shared; ``branch(x) =
alpha * x``, the gated branch alone, for a stream carry's site to join (modules/site_layers.py's ``BranchChange``).
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

    def branch(self, x: Tensor) -> Tensor:
        """alpha * x: the gated branch, joined to the stream by a stream carry's site."""
        return self.alpha.to(x.dtype) * x
