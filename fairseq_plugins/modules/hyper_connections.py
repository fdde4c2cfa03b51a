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
keys and values. Both are our reading for an encoder-decoder; the paper's models are decoder-only. In the model:
one ``HyperConnection`` per site, carried by mhc.py's ``StreamCarry`` (modules/carry.py's interface;
modules/carry_stack.py runs it).

Speed: for float32 CPU streams the same maths runs through fused C kernels shared with mHC (docs/kernels.md):
the width and depth connections as mHC's mixing and depth kernels, the dynamic coefficients as kernels/hc_coef.c
(forward and backward); the PyTorch code below runs everywhere else (CUDA, float64, half precision,
``FAIRSEQ_PLUGINS_MHC_KERNEL=0``) and is what the tests' float64 equations check.
"""

import torch
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..kernels import hc_kernel, mhc_kernel, mhc_ops
from .mhc import depth_connection
from .parameter_cache import DerivedFromParameters
from .skinny import post_add, skinny_matmul

MODES = ("static", "dynamic")


def _tracing() -> bool:
    return torch.jit.is_tracing() or torch.compiler.is_compiling()
DYNAMIC_SCALE_INIT = 0.01


class HyperConnection(DerivedFromParameters):
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
            # the fused kernels' coefficient order (_forward_kernels): W's columns [W_m | W_b | W_r], and which of
            # s_a (0), s_b (1) scales each; derived from n, not state
            order = torch.tensor([0, rate + 1, *range(1, rate + 1)])
            self.register_buffer("kernel_order", order, persistent=False)
            self.register_buffer("kernel_scale_index", torch.tensor([0, 1] + [0] * rate), persistent=False)

    def forward(self, streams: Tensor, sublayer) -> Tensor:
        """H_new for H = streams `(seq_len, batch, n, embed_dim)`; ``sublayer`` maps h_in `(seq_len, batch,
        embed_dim)` to T(h_in). Streams sit next to the feature dimension, so that each token's n x d block is one
        small matrix: the width connection is one (n + 1) x n product per token, without copies."""
        *lead, n, dim = streams.shape
        flat = streams.reshape(-1, n, dim)  # (tokens, n, d)
        # the fused kernels in training, and for the dynamic coefficients in decoding; static decoding keeps the
        # bmm (measured faster at a decoding step's 80 tokens: the coefficients are the same for every token)
        if (self.dynamic or torch.is_grad_enabled()) and mhc_kernel.usable_mix(flat, self.rate):  # rate: an int
            return self._forward_kernels(flat, lead, sublayer).view(*lead, n, dim)
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

    def _forward_kernels(self, flat: Tensor, lead: list[int], sublayer) -> Tensor:
        """The same maths through mHC's fused kernels (float32 CPU streams): the width connection as mHC's mixing
        (kernels/mhc_mix.c), the depth connection as its depth connection (mhc_post.c) and, dynamic, the
        coefficients by kernels/hc_coef.c (forward and backward), for the coefficients
        laid out as mHC's, tokens last: (K, tokens), K = 2n + n^2, rows [A_m; B; A_r^T], A_r^T's entry (i, j) =
        A_r[j, i] at row 2n + i n + j. In PyTorch each is a bmm of one tiny matrix per token (forward and two
        backward), whose time is the per-matrix overhead, not the arithmetic."""
        tokens, n, dim = flat.size(0), self.rate, flat.size(2)
        norm = self.norm if self.dynamic else None
        # decoding: LayerNorm, product, tanh and scales in one call (kernels/hc_coef.c); the norm axis may have
        # replaced the LayerNorm (RMSNorm, DyT, ...): those take the PyTorch code, as tracing does (the direct
        # kernel calls are no operators a trace could record)
        if type(norm) is nn.LayerNorm and norm.bias is not None and not torch.is_grad_enabled() and not _tracing():
            static, scales, w = self._decoding_parameters(flat.dtype)
            if hc_kernel.usable_hc_coefficients(flat, norm.weight, norm.bias, w, static, scales, n):
                # each argument checked once: here, and flat by forward's usable_mix (coef is the kernel's own)
                coef = hc_kernel.hc_coefficients(flat, norm.weight, norm.bias, w, static, scales, n, norm.eps,
                                                 checked=True)  # fmt: skip
                h_in, mixed = mhc_kernel.mix_forward_checked(flat, coef, n)
                out = sublayer(h_in.view(*lead, dim))
                return depth_connection(mixed, coef[n : 2 * n], out.reshape(tokens, dim), n)
        static = self._static_coefficients(flat.dtype).unsqueeze(-1)  # (n + 2, n, 1)
        if self.dynamic:
            w = self.dynamic_weight.to(flat.dtype)[:, self.kernel_order]  # (d, n + 2)
            scales = torch.stack([self.alpha_scale, self.beta_scale]).to(flat.dtype)[self.kernel_scale_index]
            scale_rows = scales.repeat_interleave(n)
            if type(norm) is nn.LayerNorm and norm.bias is not None and hc_kernel.usable_hc_coefficients(
                    flat, norm.weight, norm.bias, w.t(), static.view(-1), scale_rows, n):  # fmt: skip
                # training: LayerNorm, product, tanh and scales and all their gradients in two fused calls
                # (kernels/hc_coef.c): autograd's chain of them was about 4 ms of a 1000-token unit's 7
                coef = mhc_ops.hc_coefficients(flat, norm.weight, norm.bias, w.t().contiguous(), static.view(-1),
                                               scale_rows, n, norm.eps)  # fmt: skip
            else:
                z = skinny_matmul(self.norm(flat), w)  # (tokens, n, n + 2)
                coef = torch.addcmul(static, scales.view(-1, 1, 1), torch.tanh(z).permute(2, 1, 0))
        else:
            coef = static.expand(n + 2, n, tokens)
        coef = coef.reshape(n * (n + 2), tokens).contiguous()
        h_in, mixed = mhc_ops.mix(flat, coef, n)
        out = sublayer(h_in.view(*lead, dim))
        return depth_connection(mixed, coef[n : 2 * n], out.reshape(tokens, dim), n)

    def _static_coefficients(self, dtype: torch.dtype) -> Tensor:
        """(n + 2, n): row o = coefficient kind o (A_m, B, A_r's columns) of each stream j, the kernels' order."""
        static = torch.cat([self.static_alpha[:, :1], self.static_beta.unsqueeze(-1), self.static_alpha[:, 1:]], 1)
        return static.t().to(dtype).contiguous()

    def _decoding_parameters(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """static (K), scales (K) and the dynamic weight's rows (n + 2, d) in the kernels' order, without autograd;
        kept while the parameters are unchanged (modules/parameter_cache.py), since a decoding step's dozen small
        operators to derive them cost about as much as the step's coefficient maths."""
        def derive():
            n = self.rate
            scales = torch.stack([self.alpha_scale, self.beta_scale]).to(dtype)[self.kernel_scale_index]
            return (self._static_coefficients(dtype).view(-1), scales.repeat_interleave(n),
                    self.dynamic_weight.to(dtype)[:, self.kernel_order].t().contiguous())  # fmt: skip

        params = (self.static_alpha, self.static_beta, self.dynamic_weight, self.alpha_scale, self.beta_scale)
        return self.parameter_cache.get(params, derive, dtype)
