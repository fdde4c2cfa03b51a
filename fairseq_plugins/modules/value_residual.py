"""Value residual learning, ResFormer (Zhou et al., "Value Residual Learning", arXiv:2410.17897 v5, ACL 2025;
authors' code Zcchill/Value-Residual-Learning ``src/modeling/modeling_llama_resformer.py``, read at 55ae7be).

Every attention layer n >= 2 mixes the first layer's value vectors into its own before attending; the
attention weights and the residual stream are unchanged:

    V_n  = H_{n-1} W_n^V                 (the layer's projected values, per position)
    V'_n = lambda_1 V_1 + lambda_2 V_n
    U_n  = A_n V'_n,   A_n = softmax(Q_n K_n^T / sqrt(d_h))

Modes (``MODES``):
- ``identity`` (default): lambda_1 = lambda_2 = 0.5, fixed. The paper's ResFormer and the only setting of the
  authors' code (``value_states = 0.5*V_1 + 0.5*value_states`` right after v_proj, before the KV-cache update).
- ``constant``: fixed lambda_1, lambda_2 of the caller's choice (the paper's Constant-ResFormer, e.g. 2 and 1;
  SVFormer's U_n = A_n V_1 is lambda = (1, 0), without its saving of the v_proj, which the layer would skip).
- ``learnable``: lambda_1, lambda_2 trainable scalars per layer, init 0.5 (the paper's Learnable-ResFormer).
- ``token``: x-transformers' per-token, per-head gate, not in the paper: mix = sigmoid(x W + b) with
  W in R^{C x h} from the attention's input x, V'_n = (1 - mix) V_1 + mix V_n per head, nn.Linear's default
  init (mix starts near 0.5 on average but not exactly).
V_1 is layer 1's raw projected values (unmixed), with the gradient flowing into layer 1's v_proj (the
authors' code does not detach it). Sparse-ResFormer (V_1 only in late layers) is the layer loop's choice of
which layers own a ``ValueResidual``.

Encoder-decoder decisions (ours; the paper is decoder self-attention only):
- encoder self-attention: V_1 = encoder layer 1's values (padding positions are masked out of A_n anyway);
- decoder self-attention: V_1 = decoder layer 1's values of the same target position. Mix *before* the new
  position's values are appended to fairseq's ``saved_state["prev_value"]``, as the authors' code mixes before
  ``past_key_value.update``: the cache then holds V'_n and nothing new is cached across time steps; V_1 of the
  current step lives only while the step's layers run. Beam reordering touches the cache only, so nothing
  extra is reordered;
- cross-attention: off by default (faithful: the paper has none). As an option (``cross_attention=True`` on
  the stack), V'_n^c = mix(V_1^c, V_n^c) on the encoder-side projections of decoder layer n, V_1^c = decoder
  layer 1's cross-attention values; computed once per sentence and cached by fairseq's ``static_kv`` like
  ordinary cross-attention values. ``token`` mode is refused there: its gate is indexed by target position
  while the values are indexed by source position;
- every layer needs the same number of heads and head width (V_1 and V_n are added elementwise).

Half precision: the mix is elementwise; the ``token`` gate's sigmoid is computed in float32 and cast back.

Interface: ``ValueResidual(mode, embed_dim=None, num_heads=None, lambdas=(0.5, 0.5))``;
``forward(v, v_first, x=None) -> V'_n`` with v, v_first `(seq_len, batch, embed_dim)` (fairseq's v_proj output
before the head split) and x the attention's input (``token`` mode only). ``ValueResidualStack`` owns one
per layer >= 2 and carries V_1: ``stack(layer_idx, v, state, x)``, for a layer loop that projects values
itself. For fairseq's ``MultiheadAttention``, ``attach_value_residual(attentions, ...)`` replaces each
attention's v_proj by a ``ValueResidualProjection`` (same ``weight``/``bias`` state_dict names, plus the mix's
parameters): layer 1's stores its output in a dict shared by the stack's projections, the others mix it in.
Every place fairseq calls v_proj (full sequence, a new decoding position, the once-per-sentence encoder-side
values of cross-attention) then mixes before the cache. fairseq's fused full-sequence path reads
v_proj.weight directly and is switched off for these attentions. The layer loop should ``store.clear()``
after each forward pass so the last batch's V_1 is not kept alive.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .hybrid_norm import check_plain_linear

MODES = ("identity", "constant", "learnable", "token")


class ValueResidual(nn.Module):
    """V'_n = lambda_1 V_1 + lambda_2 V_n for one attention layer n >= 2 (see the module docstring)."""

    def __init__(self, mode: str = "identity", embed_dim: int | None = None, num_heads: int | None = None,
                 lambdas: tuple[float, float] = (0.5, 0.5)):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"value residual mode must be one of {MODES}, got {mode!r}")
        given = lambdas
        try:
            lambdas = tuple(float(v) for v in lambdas)
        except (TypeError, ValueError):
            lambdas = ()
        if len(lambdas) != 2:
            raise ValueError(f"value residual lambdas must be two numbers (lambda_1 on V_1, lambda_2 on V_n), "
                             f"got {given!r}")
        if mode == "identity" and lambdas != (0.5, 0.5):
            raise ValueError("value residual mode 'identity' fixes lambdas = (0.5, 0.5); use 'constant'")
        self.mode = mode
        if mode == "learnable":
            self.lambdas = nn.Parameter(torch.tensor([float(v) for v in lambdas]))
        else:
            self.register_buffer("lambdas", torch.tensor([float(v) for v in lambdas]), persistent=False)
        if mode == "token":
            if not embed_dim or not num_heads or embed_dim % num_heads:
                raise ValueError("value residual mode 'token' needs embed_dim divisible by num_heads")
            self.num_heads = num_heads
            self.gate = nn.Linear(embed_dim, num_heads)

    def forward(self, v: Tensor, v_first: Tensor, x: Tensor | None = None) -> Tensor:
        if self.mode != "token":
            lam = self.lambdas.to(v.dtype)
            return lam[0] * v_first + lam[1] * v
        if x is None:
            raise ValueError("value residual mode 'token' needs the attention input x")
        acc = torch.promote_types(v.dtype, torch.float32)
        mix = torch.sigmoid(self.gate(x).to(acc)).to(v.dtype).unsqueeze(-1)  # (seq_len, batch, h, 1)
        heads = v.shape[:-1] + (self.num_heads, -1)
        first = v_first.reshape(heads)
        return torch.lerp(first, v.reshape(heads), mix).reshape(v.shape)  # (1 - mix) V_1 + mix V_n


class ValueResidualStack(nn.Module):
    """One ``ValueResidual`` per attention layer 2..L of one stack (encoder self-attention, decoder
    self-attention, or the optional decoder cross-attention), and the carry of V_1.

    Args:
        num_layers: L.
        mode, embed_dim, num_heads, lambdas: as ``ValueResidual``.
        cross_attention: the stack serves cross-attention (refuses ``token``, see the module docstring).
    """

    def __init__(self, num_layers: int, mode: str = "identity", embed_dim: int | None = None,
                 num_heads: int | None = None, lambdas: tuple[float, float] = (0.5, 0.5),
                 cross_attention: bool = False):
        super().__init__()
        if cross_attention and mode == "token":
            raise ValueError("value residual mode 'token' is undefined for cross-attention (target-indexed "
                             "gate, source-indexed values); use identity, constant or learnable")
        self.mixes = nn.ModuleList(ValueResidual(mode, embed_dim, num_heads, lambdas) for _ in range(num_layers - 1))

    def forward(self, layer_idx: int, v: Tensor, state: dict, x: Tensor | None = None) -> Tensor:
        """V'_n for 0-based ``layer_idx``; layer 0 stores its raw v as V_1 in ``state`` (a dict that lives for
        one forward pass or one decoding step) and returns it unchanged."""
        if layer_idx == 0:
            state["v_first"] = v
            return v
        return self.mixes[layer_idx - 1](v, state["v_first"], x)


class ValueResidualProjection(nn.Module):
    """v_proj of one attention layer with the value residual: layer 1 (``mix`` None) stores V_1 in ``store``,
    later layers return mix(V_n, V_1, x); the last one (``last``) takes V_1 out of the store, so nothing outlives
    the pass, also where fairseq calls a stack's forward directly (beam search) and no hook runs. Owns the
    replaced Linear's Parameters under the same names."""

    def __init__(self, linear: nn.Linear, mix: ValueResidual | None, store: dict, key: str, last: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.mix, self.store, self.key, self.last = mix, store, key, last

    def forward(self, x: Tensor) -> Tensor:
        v = F.linear(x, self.weight, self.bias)
        if self.mix is None:
            self.store[self.key] = v
            return v
        return self.mix(v, self.store.pop(self.key) if self.last else self.store[self.key], x)


def attach_value_residual(attentions: list, mode: str = "identity", lambdas: tuple[float, float] = (0.5, 0.5),
                          cross_attention: bool = False, store: dict | None = None) -> dict:
    """Value residual in a stack of fairseq MultiheadAttentions (layer order); returns the shared store."""
    if cross_attention and mode == "token":
        raise ValueError("value residual mode 'token' is undefined for cross-attention (target-indexed "
                         "gate, source-indexed values); use identity, constant or learnable")
    for attn in attentions:
        check_plain_linear(attn.v_proj, "v_proj")
    store = {} if store is None else store
    key = "v_first_cross" if cross_attention else "v_first"
    for n, attn in enumerate(attentions):
        weight = attn.v_proj.weight  # the attention may already be converted (dtype, device): follow it
        mix = None if n == 0 else ValueResidual(mode, attn.embed_dim, attn.num_heads, lambdas).to(weight)
        attn.v_proj = ValueResidualProjection(attn.v_proj, mix, store, key, last=n == len(attentions) - 1)
        attn._set_skip_embed_dim_check()  # the fused path would read v_proj.weight and skip the mix
    return store
