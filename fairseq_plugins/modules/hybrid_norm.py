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
``attach_qkv_norms(attn)`` puts them into a fairseq ``MultiheadAttention`` (self- or cross-attention):
q_proj/k_proj/v_proj become ``NormedProjection``s that keep the Linear's ``weight``/``bias`` Parameters
under the same state_dict names (plus ``norm.weight``), so q is normalised before fairseq multiplies it by
``scaling`` and K/V before they are cached; fairseq's fused full-sequence path, which reads the projection
weights directly and would skip the norms, is switched off for that attention.
"""

import torch
import torch.nn.functional as F
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


class NormedProjection(nn.Module):
    """HeadNorm(x W^T + b) in place of a q/k/v ``nn.Linear``, owning that Linear's Parameters."""

    def __init__(self, linear: nn.Linear, num_heads: int, eps: float = EPS):
        super().__init__()
        if linear.out_features % num_heads:
            raise ValueError(f"projection width {linear.out_features} is not divisible by {num_heads} heads")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.norm = HeadNorm(num_heads, linear.out_features // num_heads, eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(F.linear(x, self.weight, self.bias))


def attach_qkv_norms(attn: nn.Module, eps: float = EPS) -> None:
    """HybridNorm's N_q, N_k, N_v inside a fairseq MultiheadAttention (see the module docstring)."""
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(attn, name, NormedProjection(getattr(attn, name), attn.num_heads, eps))
    attn._set_skip_embed_dim_check()  # the fused path would read q/k/v_proj.weight and skip the norms
