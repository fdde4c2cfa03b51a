"""Hyper-connections, static (SHC) and dynamic (DHC) (Zhu et al., "Hyper-Connections", arXiv:2409.19606,
sections 2.1-2.3 and the reference code of its appendix).

A token carries n streams, H in R^{n x d} (n the expansion rate); H^0 = n copies of the embedding output. Every
residual site k (each attention and each FFN: the paper calls each of them a layer T) replaces x + T(x) by

    h_in  = A_m^T H                   width connection: the sublayer's input, A_m in R^n
    H'    = A_r^T H                   width connection among the streams, A_r in R^{n x n}
    H_new = B^T T(h_in) + H'          depth connection, B in R^{1 x n}: H_new[j] = B_j T(h_in) + H'[j]

with T(h) = dropout(F(LN(h))), the Pre-LN sublayer. Read-out: the sum of the n streams, then the final LN.
Static: A_m, A_r, B are learned parameters. Dynamic (section 2.3), with Hbar = LN(H) row by row:

    B(H)   = s_b * tanh(Hbar W_b)^T + B          W_b in R^d
    A_m(H) = s_a * tanh(Hbar W_m) + A_m          W_m in R^d
    A_r(H) = s_a * tanh(Hbar W_r) + A_r          W_r in R^{d x n}

Initialisation (paper): B = 1, A_m = e_{k mod n}, A_r = I_n, W = 0, s_a = s_b = 0.01, all learned. At
initialisation every stream therefore equals the Pre-LN stream h (h_in = h, H_new[j] = h + T(h)), the read-out
is n h, and the final LayerNorm gives the Pre-LN output up to its epsilon.

Choices: each site has its own LayerNorm for Hbar (weight 1, bias 0); W_m, W_r and W_b are stored as one
(d, n + 2) matrix (one product per site), A_m and A_r as one n x (n + 1) matrix (column 0 = A_m), as in the
paper's code. The site
index k counts sublayers through the stack (encoder: 2 per layer; decoder: 3, self-attention, cross-attention,
FFN); the decoder's cross-attention reads the encoder output (the sum of its streams after the final LN) as
keys and values. Both are our reading for an encoder-decoder; the paper's models are decoder-only.
"""

import torch
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from .skinny import post_add, skinny_matmul

MODES = ("static", "dynamic")
DYNAMIC_SCALE_INIT = 0.01


class HyperConnection(nn.Module):
    """The hyper-connection of one residual site.

    Args:
        embed_dim: d.
        rate: n, the number of streams.
        site: k, the site's index in its stack (A_m starts as e_{k mod n}).
        dynamic: DHC if True, else SHC.
    """

    def __init__(self, embed_dim: int, rate: int, site: int, dynamic: bool, export: bool = False):
        super().__init__()
        self.rate, self.dynamic = rate, dynamic
        alpha = torch.zeros(rate, rate + 1)
        alpha[site % rate, 0] = 1.0  # A_m = e_{k mod n}
        alpha[:, 1:] = torch.eye(rate)  # A_r = I_n
        self.static_alpha = nn.Parameter(alpha)
        self.static_beta = nn.Parameter(torch.ones(rate))  # B
        if dynamic:
            self.norm = LayerNorm(embed_dim, export=export)
            self.dynamic_weight = nn.Parameter(torch.zeros(embed_dim, rate + 2))  # [W_m | W_r | W_b]
            self.alpha_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE_INIT))  # s_a
            self.beta_scale = nn.Parameter(torch.tensor(DYNAMIC_SCALE_INIT))  # s_b

    def forward(self, streams: Tensor, sublayer) -> Tensor:
        """H_new for H = streams `(seq_len, batch, n, embed_dim)`; ``sublayer`` maps h_in `(seq_len, batch,
        embed_dim)` to T(h_in). Streams sit next to the feature dimension, so that each token's n x d block is one
        small matrix: the width connection is one (n + 1) x n product per token, without copies."""
        *lead, n, dim = streams.shape
        flat = streams.reshape(-1, n, dim)  # (tokens, n, d)
        alpha = self.static_alpha.to(streams.dtype)  # (n, n + 1): [A_m | A_r]
        beta = self.static_beta.to(streams.dtype).unsqueeze(-1)  # (n, 1): B
        if self.dynamic:
            gates = torch.tanh(skinny_matmul(self.norm(flat), self.dynamic_weight.to(streams.dtype)))  # (tokens, n, n + 2)
            alpha = torch.addcmul(alpha, self.alpha_scale.to(streams.dtype), gates[..., :-1])
            beta = torch.addcmul(beta, self.beta_scale.to(streams.dtype), gates[..., -1:])
        # (tokens, n + 1, d): h_in, then H'. One small product per token (bmm, a static alpha expanded to every
        # token): measured 2x faster on CPU than matmul's fold of the static case into one skinny GEMM
        # split, not two slices: backward joins the two gradients with one cat instead of zero-filling the
        # (n + 1) x d block twice (measured: the zero fills cost hc_dynamic 3% of its training step)
        h_in, mixed = torch.bmm(alpha.transpose(-1, -2).expand(flat.size(0), n + 1, n), flat).split([1, n], 1)
        out = sublayer(h_in.view(*lead, dim))
        return post_add(mixed, beta.expand(flat.size(0), n, 1), out.reshape(-1, 1, dim)).view(*lead, n, dim)
