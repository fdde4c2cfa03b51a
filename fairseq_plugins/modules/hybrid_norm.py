"""HybridNorm's per-head Q/K/V norms (Zhuo et al., "HybridNorm: Towards Stable and Efficient Transformer
Training via Hybrid Normalization", arXiv:2503.04598, section 3; authors' code BryceZhuo/HybridNorm
``dense_model/olmo/model.py`` L433-466 and ``attention``, read at f0dd605).

HybridNorm's attention sublayer has no input norm; instead each head's query, key and value are normalised
after the projections (the layer placement is ``norm_placement.sublayer_norms("hybrid", ...)``):

    Q = N_q(X W_q),  K = N_k(X W_k),  V = N_v(X W_v),   N = RMSNorm over the head width d_h, per head
    Y = X + Attn(Q, K, V)

Constants (authors' 1.2B config): RMSNorm with a learnable gain of size d_h shared by all heads
(``attention_layer_norm_with_affine: true``, no bias), eps 1e-5. In the code the norms act after the split
into heads and before rotary embeddings and before the new K/V are concatenated to ``layer_past``.

Encoder-decoder decisions (ours): the same three norms in every attention, cross-attention included (N_q on
the decoder query, N_k/N_v on the encoder projections). In fairseq's MultiheadAttention they must act on
q/k/v right after q_proj/k_proj/v_proj and *before* q is multiplied by ``scaling`` (1/sqrt(d_h)) and before
K/V are appended to ``saved_state``, so the incremental cache (and the static cross-attention cache) holds
normalised keys and values; beam reordering then needs nothing extra.

Half precision: the mean square is accumulated in float32 (at least) and the result cast back.

Interface: ``HeadNorm(num_heads, head_dim, eps)``; ``forward(z)`` for z `(seq_len, batch, num_heads *
head_dim)` (fairseq's projection output) returns the same shape, each head's d_h slice RMS-normalised.
"""

import torch
from torch import Tensor, nn

EPS = 1e-5


class HeadNorm(nn.Module):
    """RMSNorm over each head's slice of a projected Q, K or V, with one gain vector of size d_h."""

    def __init__(self, num_heads: int, head_dim: int, eps: float = EPS):
        super().__init__()
        self.num_heads, self.head_dim, self.eps = num_heads, head_dim, eps
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, z: Tensor) -> Tensor:
        heads = z.reshape(*z.shape[:-1], self.num_heads, self.head_dim)
        acc = heads.to(torch.promote_types(z.dtype, torch.float32))
        normed = acc * torch.rsqrt(acc.square().mean(-1, keepdim=True) + self.eps)
        return (normed.to(z.dtype) * self.weight.to(z.dtype)).reshape(z.shape)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, eps={self.eps}"
