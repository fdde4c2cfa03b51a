"""Frac-connections (Zhu et al., ByteDance Seed, "Frac-Connections: Fractional Extension of Hyper-Connections",
arXiv:2503.14125, section 4.1 eq. 6-8, 4.2 eq. 11-14, 4.3 eq. 15 and algorithms 1-2; the equations come
from third-party notes and review, the paper's text was not available here; docs/new_ideas_sources.md).

Instead of n full-width copies (hyper-connections), the single C-dim state is split into m fractions and the
HC-style read/mix/write matrices act across the fraction slots; the residual stays C wide:

    H = Reshape(h, (m, C/m))                                             (eq. 6)
    FC = [[0_{1 x m}, B], [Y, A]],  B in R^{1 x m},  Y, A in R^{m x m}   (eq. 7)
    H_k = B^T T_k(Y^T H_{k-1}) + A^T H_{k-1}                             (eq. 8)

Read literally: the branch input (Y^T H)[i] = sum_j Y[j, i] H[j] (m x C/m) is reshaped to C and fed to the
Pre-LN sublayer T_k = dropout(F(LN(.))); its output is reshaped back to (m, C/m), fraction i is scaled by
beta_i (B acts element-wise per fraction, as in the released pseudocode, not as a sum over fractions), and
the mixed state (A^T H)[i] = sum_j A[j, i] H[j] is added. Mixing only combines slots at the same offset
within a fraction. Dynamic frac-connections (eq. 11-14), with Hbar = LayerNorm over each fraction (C/m):

    B(H) = s_b * tanh(Hbar W_b)^T + B      W_b in R^{C/m}
    Y(H) = s_a * tanh(Hbar W_y) + Y        W_y in R^{(C/m) x m}   (row j from fraction j)
    A(H) = s_a * tanh(Hbar W_a) + A        W_a in R^{(C/m) x m}
    W shared across fractions; s_a, s_b scalars.

Init (eq. 15, algorithm 2): Y = A = I_m, B = 1, W = 0, s_a = s_b = 0.01, so H_k = reshape(h + T(h)): the
layer is exactly Pre-LN at initialisation, for static and dynamic alike. The stack output is the state
reshaped back to C (no collapse), then the final norm. m = 1 is the plain Pre-LN residual (HC x1).

Where the reference code departs: lucidrains' ``HyperConnections(num_residual_streams=1, num_fracs=m)``
(read by the project's notes at 4775103) does not reproduce eq. 15 at init (its branch input is not the identity
reshape, and every fraction receives the sum of all branch-output fractions), so it is not offered.

Encoder-decoder decisions (ours): one unit per sublayer including cross-attention; m must divide C. The paper
never relates fractions to attention heads and none is needed: every sublayer reads the whole C-vector
(reshaped back), so fractions and heads are independent. Per position: each token's coefficients depend on
its own state only; incremental decoding caches nothing new and beam reordering has nothing extra to reorder.
Coefficient maths (LayerNorm, products with W, tanh) runs in float32; the mixing in the input dtype. Static
parts (B, Y, A) and the scales should be excluded from weight decay (the paper says so for the static parts).

Interface: ``FracConnection(embed_dim, fracs, dynamic=True)``; ``forward(x, sublayer)`` with x `(seq_len,
batch, embed_dim)` (the ordinary residual stream) and ``sublayer`` mapping the branch input `(seq_len, batch,
embed_dim)` to dropout(F(LN(.))); returns the new state `(seq_len, batch, embed_dim)`. In the model:
``FracCarry`` (modules/carry.py's interface; modules/carry_stack.py runs it).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attn_res import autocast_off
from .carry import Carry
from .skinny import skinny_matmul

SCALE_INIT = 0.01


class FracConnection(nn.Module):
    """The frac-connection of one sublayer.

    Args:
        embed_dim: C.
        fracs: m, which must divide C.
        dynamic: dynamic frac-connections (eq. 11-14) if True, static (eq. 8) otherwise.
    """

    def __init__(self, embed_dim: int, fracs: int, dynamic: bool = True):
        super().__init__()
        if fracs < 1 or embed_dim % fracs:
            raise ValueError(f"frac-connections: fracs must be >= 1 and divide embed_dim {embed_dim}, got {fracs}")
        self.fracs, self.dynamic = fracs, dynamic
        self.width = embed_dim // fracs
        m = fracs
        self.static_ya = nn.Parameter(torch.cat([torch.eye(m), torch.eye(m)], dim=1))  # [Y | A], (m, 2m)
        self.static_beta = nn.Parameter(torch.ones(m))  # B
        if dynamic:
            self.norm_weight = nn.Parameter(torch.ones(self.width))
            self.norm_bias = nn.Parameter(torch.zeros(self.width))
            self.dynamic_weight = nn.Parameter(torch.zeros(self.width, 2 * m + 1))  # [W_y | W_a | W_b]
            self.alpha_scale = nn.Parameter(torch.tensor(SCALE_INIT))  # s_a
            self.beta_scale = nn.Parameter(torch.tensor(SCALE_INIT))  # s_b

    def coefficients(self, frac: Tensor) -> tuple[Tensor, Tensor]:
        """[Y | A] (tokens, m, 2m) or (m, 2m), and B (tokens, m) or (m,), for frac (tokens, m, C/m)."""
        acc = torch.promote_types(frac.dtype, torch.float32)
        ya, beta = self.static_ya.to(acc), self.static_beta.to(acc)
        if not self.dynamic:
            return ya, beta
        # autocast (the plugin's --autocast-dtype) would run these products in half precision
        with autocast_off(frac.device.type):
            hbar = F.layer_norm(frac.to(acc), (self.width,), self.norm_weight.to(acc), self.norm_bias.to(acc))
            w = self.dynamic_weight.to(acc)
            if torch.is_grad_enabled():
                gates = skinny_matmul(hbar, w)
            else:  # the thin operand first (modules/skinny.py) without its autograd function
                gates = (w.t() @ hbar.reshape(-1, self.width).t()).t().reshape(*hbar.shape[:-1], -1)
            gates = torch.tanh(gates)  # (tokens, m, 2m + 1)
        # fused multiply-adds: each is one operator (decoding runs dozens of these tiny operators per step)
        ya = torch.addcmul(ya, self.alpha_scale.to(acc), gates[..., :-1])
        beta = torch.addcmul(beta, self.beta_scale.to(acc), gates[..., -1])
        return ya, beta

    def _decode(self, x: Tensor, sublayer) -> Tensor:
        """forward without autograd and autocast for float32 dynamic units: the same operators without the
        dtype casts and context switches, which at decoding's 80 tokens cost as much as the arithmetic."""
        m, d = self.fracs, self.width
        frac = x.reshape(-1, m, d)
        hbar = F.layer_norm(frac, (d,), self.norm_weight, self.norm_bias)
        gates = torch.tanh((self.dynamic_weight.t() @ hbar.reshape(-1, d).t()).t()).reshape(-1, m, 2 * m + 1)
        gates_ya, gates_beta = gates.split(2 * m, -1)
        ya = torch.addcmul(self.static_ya, self.alpha_scale, gates_ya)
        beta = torch.addcmul(self.static_beta.unsqueeze(-1), self.beta_scale, gates_beta)  # (tokens, m, 1)
        branch, mixed = torch.bmm(ya.transpose(1, 2), frac).split(m, 1)
        out = sublayer(branch.reshape(x.shape)).reshape(-1, m, d)
        return torch.addcmul(mixed, beta, out).reshape(x.shape)

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if (not torch.is_grad_enabled() and self.dynamic and x.dtype == torch.float32
                and self.dynamic_weight.dtype == torch.float32 and not torch.is_autocast_enabled(x.device.type)):
            return self._decode(x, sublayer)
        m = self.fracs
        frac = x.reshape(-1, m, self.width)  # (tokens, m, C/m)
        ya, beta = (c.to(x.dtype) for c in self.coefficients(frac))
        # A^T H is the residual path: under autocast it keeps the state's dtype (float32, as the plugin's
        # residual stream does by promotion) instead of being rounded to half at every sublayer
        with autocast_off(x.device.type):
            if ya.dim() == 2:  # static: the same matrices for every token
                mixed = torch.einsum("ji,tjd->tid", ya, frac)
            else:
                mixed = torch.bmm(ya.transpose(1, 2), frac)  # (tokens, 2m, C/m): [Y^T H ; A^T H]
        # split, not two slices: backward joins the two gradients with one cat instead of two zero-filled blocks
        branch, mixed = mixed.split(m, 1)
        out = sublayer(branch.reshape(x.shape)).reshape(-1, m, self.width)
        return torch.addcmul(mixed, beta.unsqueeze(-1), out.to(x.dtype)).reshape(x.shape)


class FracCarry(Carry):
    """Frac-connections' carry (modules/carry.py): the ordinary C-wide stream, no streams to expand or collapse,
    each layer's output the state itself; every site a ``FracConnection`` with m fractions."""

    def __init__(self, fracs: int, dynamic: bool):
        self.fracs, self.dynamic = fracs, dynamic

    def site(self, embed_dim: int, index: int) -> nn.Module:
        return FracConnection(embed_dim, self.fracs, self.dynamic)
