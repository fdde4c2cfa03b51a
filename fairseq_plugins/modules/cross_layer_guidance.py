"""Crossformer's cross-layer guidance: which projection of layer t is guided by which one of layer t+1,
the soft guidance regularizer and the hard guidance tying ("Crossformer: Transformer with Alternated
Cross-Layer Guidance", sections 2.1 and 2.2).

Layers are numbered t = 1 .. T as in the paper (index t - 1 in a ``ModuleList``). A guidance pair
(A(t), B(t+1)) names one projection of layer t and one of layer t+1:

    key-query (eq. 3)  K(t) = Q(t+1)                  t = 1 .. T-1            self_attn.k_proj <- q_proj
    ffn       (eq. 5)  W2(t) = W2(t+1)                t = 1, 3, 5, ...        fc2 <- fc2
                       W1(t) = W1(t+1)                t = 2, 4, 6, ...        fc1 <- fc1
    value     (eq. 6)  W_F(t) = W_F(t+1)              t = 1, 3, 5, ...        self_attn.out_proj <- out_proj
                       W_V(t) = W_V(t+1)              t = 2, 4, 6, ...        self_attn.v_proj <- v_proj

Soft guidance (eq. 1):  L_reg = sum over pairs of  || A(t) - sg(B(t+1)) ||_n,  n = 1 or 2.
Hard guidance:          A(t) is B(t+1): one parameter, owned by the upper layer t+1.

Interpretations (the paper leaves these open):
- The guided or shared states are the projections' *weights*, not their activations. Read literally,
  eq. 3's K(t) = Q(t+1) = H(t+1) W_Q(t+1) would make layer t depend on layer t+1, which is computed from
  layer t; only K(t) = H(t) W_Q(t+1) is computable, i.e. W_K(t) = W_Q(t+1). Eq. 5 and 6 tie weights
  explicitly; eq. 1 is read the same way.
- A state is the whole affine projection: a pair ties (or regularizes) the bias together with the weight,
  so hard guidance drives L_reg to exactly 0, as section 1 says it does. In the regularizer one pair's
  weight and bias differences form one vector: L2 = sqrt(|dW|^2 + |db|^2), L1 = sum |dW| + sum |db|.
- "n-norm" is the norm itself (L1: sum of absolute differences; L2: Euclidean/Frobenius norm, not squared),
  summed over pairs, computed in float32 at least, whatever the parameters' precision.
- Eq. 5 and 6 list t up to T-2 / T-1 for an even T; for any T the rule is the parity of t <= T-1, so every
  projection is in at most one pair, no tie chains across three layers, and a projection without a
  partner (e.g. W1 of layer 1, or W_K of the top layer, as eq. 3 says) keeps its own weights.
- Only self-attention is guided. The decoder's cross-attention (eq. 8) keeps its own projections: its keys
  and values project the encoder output, not the decoder state that layer t+1's queries see, and the
  paper's per-block accounting (12 d_m^2 = attention, fusion, FFN) has no cross-attention term.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BLOCKS = ("key-query", "ffn", "value")
NORMS = ("l1", "l2")


@dataclass(frozen=True)
class GuidancePair:
    """One guided pair: projection ``lower`` of layer t (A) and ``upper`` of layer t+1 (B).

    ``t`` is 1-based, as in the paper; ``lower`` and ``upper`` are module paths inside a layer.
    """

    block: str
    t: int
    lower: str
    upper: str


def guidance_pairs(num_layers: int, blocks: Iterable[str]) -> list[GuidancePair]:
    """The pairs of eq. 3, 5 and 6 for a stack of ``num_layers`` layers and the chosen ``blocks``."""
    blocks = set(blocks)
    unknown = blocks - set(BLOCKS)
    if unknown:
        raise ValueError(f"unknown guidance blocks {sorted(unknown)}; choose from {', '.join(BLOCKS)}")
    pairs = []
    for t in range(1, num_layers):
        odd = t % 2 == 1
        if "key-query" in blocks:
            pairs.append(GuidancePair("key-query", t, "self_attn.k_proj", "self_attn.q_proj"))
        if "ffn" in blocks:
            name = "fc2" if odd else "fc1"
            pairs.append(GuidancePair("ffn", t, name, name))
        if "value" in blocks:
            name = "self_attn.out_proj" if odd else "self_attn.v_proj"
            pairs.append(GuidancePair("value", t, name, name))
    return pairs


def projections(layers: Sequence[nn.Module], pair: GuidancePair) -> tuple[nn.Module, nn.Module]:
    """The two projections (A in layer t, B in layer t+1) that ``pair`` names."""
    return layers[pair.t - 1].get_submodule(pair.lower), layers[pair.t].get_submodule(pair.upper)


def _state(linear: nn.Module, detach: bool = False) -> Tensor:
    """A projection's weight and bias as one vector, in float32 at least (half precision is upcast)."""
    parts = [linear.weight] + ([linear.bias] if linear.bias is not None else [])
    flat = torch.cat([p.reshape(-1) for p in parts])
    flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
    return flat.detach() if detach else flat


def guidance_loss(layers: Sequence[nn.Module], pairs: Iterable[GuidancePair], norm: str) -> Tensor:
    """L_reg of eq. 1 over one layer stack: sum of || A(t) - sg(B(t+1)) ||_norm; a scalar, float32 or wider.

    The stop gradient on B means only the lower layer of each pair receives a gradient from L_reg.
    """
    order = {"l1": 1, "l2": 2}[norm]
    norms = []
    for pair in pairs:
        lower, upper = projections(layers, pair)
        norms.append(torch.linalg.vector_norm(_state(lower) - _state(upper, detach=True), ord=order))
    if not norms:  # a one-layer stack: a 0-dim CPU zero adds to a loss on any device
        return torch.zeros(())
    return torch.stack(norms).sum()


class TiedLinear(nn.Module):
    """A linear projection that computes with another layer's ``nn.Linear`` parameters (hard guidance).

    It owns no parameters: the owner (the projection of layer t+1) is held outside nn.Module's registry,
    so the shared weight and bias are one Parameter that appears once in ``parameters()``, the optimizer
    and ``state_dict()``, under the owner's name; loading a state dict therefore keeps the tie, and
    ``.half()``/``.to()`` convert it once, through the owner. Only the ``nn.Linear`` is shared, never the
    attention module, whose incremental-decoding cache is keyed per module.
    ``weight``/``bias`` are exposed because fairseq's attention passes them to
    ``F.multi_head_attention_forward`` directly.
    """

    def __init__(self, owner: nn.Linear):
        super().__init__()
        self._owner = (owner,)  # a tuple, so nn.Module does not register it as a submodule

    @property
    def owner(self) -> nn.Linear:
        return self._owner[0]

    @property
    def weight(self) -> Tensor:
        return self.owner.weight

    @property
    def bias(self) -> Tensor | None:
        return self.owner.bias

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        return f"in_features={in_features}, out_features={out_features}, tied"


def tie_pairs(layers: Sequence[nn.Module], pairs: Iterable[GuidancePair]) -> None:
    """Hard guidance: replace each pair's lower projection by a ``TiedLinear`` of the upper one.

    The lower layer's own initial weights are discarded; the shared ones start from layer t+1's.
    """
    for pair in pairs:
        lower, upper = projections(layers, pair)
        if lower.weight.shape != upper.weight.shape:
            raise ValueError(f"cannot tie {pair}: shapes {tuple(lower.weight.shape)}, {tuple(upper.weight.shape)}")
        parent_path, _, name = pair.lower.rpartition(".")
        parent = layers[pair.t - 1].get_submodule(parent_path) if parent_path else layers[pair.t - 1]
        setattr(parent, name, TiedLinear(upper))


def tied_parameter_count(pairs: Iterable[GuidancePair], embed_dim: int, ffn_dim: int, bias: bool = True) -> int:
    """Parameters that tying ``pairs`` removes from one stack of width embed_dim and FFN width ffn_dim.

    Each pair removes its lower projection: key-query, W_V and W_F d^2 (+ d bias), W1 d*d_ffn (+ d_ffn),
    W2 d_ffn*d (+ d).
    """
    out_features = {"fc1": ffn_dim}
    in_features = {"fc2": ffn_dim}
    count = 0
    for pair in pairs:
        name = pair.lower.rpartition(".")[2]
        out_dim = out_features.get(name, embed_dim)
        count += out_dim * in_features.get(name, embed_dim) + (out_dim if bias else 0)
    return count
