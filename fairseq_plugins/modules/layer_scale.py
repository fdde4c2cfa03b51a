"""LayerScale (Touvron et al., "Going deeper with Image Transformers" (CaiT), arXiv:2103.17239, section 2,
equation for "LayerScale" and its figure 1(d)).

A learned per-channel scale on every residual branch of a Pre-LN stack, started small so that a deep stack
begins close to the identity:

    x' = x + diag(lambda) SA(eta(x))            eta = the sublayer's pre-norm, lambda in R^C
    x'' = x' + diag(lambda') FFN(eta(x'))

Init (paper, section 2): lambda = eps * 1, eps = 0.1 for depth <= 18, 1e-5 for depth 24, 1e-6 for deeper
networks (``cait_eps``). The paper's models are ViTs with one stack; "depth" here is the number of layers of
the stack the sublayer lives in (the encoder and the decoder each use their own depth), our reading for an
encoder-decoder. x-transformers' ``use_layerscale`` defaults to lambda = 0 (ReZero-like), not the paper.

Encoder-decoder decisions (ours, the paper has no decoder):
- one lambda per sublayer, including the decoder's cross-attention: it is a residual branch like the others;
  with eps = 0.1 the decoder still reads the source at initialisation (ReZero's zero gate would not);
- dropout applies to the branch output before lambda (fairseq: ``residual + dropout(F(x))``); the two commute;
- per-position: the scale is elementwise, so incremental decoding needs no state (nothing cached);
- beam reordering: nothing to reorder;
- weight decay: the paper excludes nothing explicitly; we recommend excluding lambda, as for every scale here
  (that is the optimiser's business, not this module's).

Half precision: lambda is a parameter of the module's dtype; the product is elementwise (no reduction), so
nothing needs float32. eps = 1e-6 is a float16 subnormal (relative error ~5%), stored exactly in the
float32 master weights fairseq keeps, so the training value is unaffected.

Interface: ``LayerScale(embed_dim, init)``; ``forward(x, residual) = residual + lambda * x`` with fairseq's
``residual_connection(x, residual)`` argument order (x the dropped-out branch output); ``branch(x) = lambda * x``,
the changed branch alone, for a stream carry's site to join (modules/site_layers.py's ``BranchChange``).
"""

import torch
from torch import Tensor, nn


def cait_eps(depth: int) -> float:
    """CaiT's initial lambda for a stack of ``depth`` layers (section 2: 0.1 up to 18, 1e-5 at 24, 1e-6 deeper;
    depths 19-24 take 1e-5, the paper's value for the nearest depth it names)."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    return 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6


class LayerScale(nn.Module):
    """diag(lambda) on one residual branch.

    Args:
        embed_dim: C.
        init: the initial value eps of every lambda_c (``cait_eps(depth)`` for the paper's rule).
    """

    def __init__(self, embed_dim: int, init: float = 0.1):
        super().__init__()
        self.scale = nn.Parameter(torch.full((embed_dim,), float(init)))

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + lambda * x, both `(seq_len, batch, embed_dim)` (or any shape ending in embed_dim)."""
        return torch.addcmul(residual, self.scale.to(x.dtype), x)

    def branch(self, x: Tensor) -> Tensor:
        """lambda * x: the scaled branch, joined to the stream by a stream carry's site."""
        return self.scale.to(x.dtype) * x
