"""LIMe, Layer-Integrated Memory (Gerasimov, Aksenov, Balagansky, Sinii, Gavrilov, "You Do Not Fully Utilize
Transformer's Representation Capacity", arXiv:2502.09245 v2; authors' code corl-team/lime, ``src/lm/lime.py``
at 4242812, cited as L:line, ``config.py`` as C:line). Design note: /work/coord/lime.md (issue 54 item 6b).

Every self-attention layer l >= 1 attends over keys and values routed from the keys and values of the same
position in every layer 0..l of its stack; queries, the attention and the residual stream are unchanged:

    K_j = x_j W_j^K + b_j^K,  V_j = x_j W_j^V + b_j^V      (layer j's own projections, split into H heads)
    K'_{l,h} = sum_{j=0..l} sum_{r=1..H} W_l[h, jH + r] K_{j,r}
    V'_{l,h} = sum_{j=0..l} sum_{r=1..H} W_l[h, jH + r] V_{j,r}          (one W_l for keys and values)

W_l in R^{H x (l+1)H} is a plain learned matrix per layer (no softmax, no normalisation; L:44-46, 128); layer 0
uses its own K_0, V_0 (FirstLayerRouter, L:52-58). The mix happens right after the projections, before fairseq
splits heads, scales and caches (the authors route before RoPE and the KV-cache update, L:137-147): the cache
holds K', V', so incremental decoding needs only the current position's raw K_j, V_j of the earlier layers.

Init (``uniform``, StaticRouter L:36-42): every entry U(-sqrt(3 / ((l+1)H)), +sqrt(3 / ((l+1)H))), then the
layer's own block (the last H columns) set to I_H. ``identity`` (ours): the earlier layers' blocks 0, so the
model starts as the same model without LIMe (and draws no random numbers: a seed builds the same other weights).

Router learning rate (C:35-37, 59-60: router_lr 1e-2 against lr 1e-3, weight decay off for the router): fairseq
has one lr for every parameter, so the stored parameter is P = W / c and the forward uses W = c P, with
c = ``scale`` (``--lime-router-lr-scale``, default 10): under Adam the update of W is c times the base-lr update
(c^2 under SGD). Departures: the router's gradient enters ``--clip-norm`` c times larger, and ``--weight-decay``
applies to P.

In (v2, the authors' current code): the static per-layer routes over all heads of all earlier layers, in every
self-attention of the encoder and the decoder (each stack routes over its own layers; the paper is decoder-only),
both inits, the lr reparametrisation. Out, and why:
- v1 of the method (Static/Dynamic LIMe over hidden states with softmax routes, top-p pruning, ``start_lime``):
  a different method that re-projects every earlier hidden state per layer instead of reusing the K/V buffers;
- cross-attention: every decoder layer's K/V there are projections of the same encoder output e, so a route
  over them is e (sum_j W_l[., j] W_j^K), one more linear projection of e: no capacity added;
- fairseq's k/v biases stay (the authors' kv_proj has none, L:67): a mix of constants is a constant;
- per-group optimizers (the authors' AdamW groups): replaced by the reparametrisation above.

Implementation: ``attach_lime(attentions, init, scale)`` replaces each attention's k_proj and v_proj by a
``LimeProjection`` (an ``nn.Linear`` subclass holding the replaced Linear's ``weight`` and ``bias`` under the same
names, so the residual choices' inits treat it as the Linear it is). The routes P_l are registered once on the
attention (``self_attn.lime_routes``, layer >= 1); the two projections hold an unregistered reference (inside
v_proj, DeepNet's torchscale init would divide it, and B2T rescales names containing "weight"). One store per
stack (a dict of two lists, never in a state_dict): each projection appends its raw output; layer 0's empties the
list first and the last layer's empties it after use, so nothing outlives a pass (an exception inside a pass
leaves it to the next pass's layer 0). The store keeps each source heads-first, (H, positions * d_h), and the mix
is a sum of per-source-layer (H x H) GEMMs (``route``), not one product over the concatenated sources, whose copy
autograd would keep for every layer (O(L^2) memory); heads-first GEMMs ran ~4x faster than a matmul broadcast
over positions, and the concatenated product slowest (CPU, E12 width 512, 8 heads).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INITS = ("uniform", "identity")


def lime_routes_init(layer_index: int, heads: int, init: str = "uniform", scale: float = 1.0) -> Tensor:
    """The stored routes P_l = W_l / scale of layer ``layer_index`` >= 1, shape (H, (l+1)H) (module docstring)."""
    if init not in INITS:
        raise ValueError(f"LIMe init must be one of {INITS}, got {init!r}")
    if layer_index < 1 or heads < 1 or not scale > 0:
        raise ValueError(f"LIMe routes need layer_index >= 1, heads >= 1 and scale > 0, got {layer_index}, {heads}, "
                         f"{scale}")  # fmt: skip
    fan_in = (layer_index + 1) * heads
    routes = torch.zeros(heads, fan_in)
    if init == "uniform":
        bound = math.sqrt(3.0 / fan_in)
        routes.uniform_(-bound, bound)
    routes[:, layer_index * heads :] = torch.eye(heads)
    return routes / scale


def heads_first(y: Tensor, heads: int) -> Tensor:
    """(..., H * d_h) -> (H, N * d_h), N the positions: each head's rows one contiguous block, so a route over the
    heads of one source is one plain (H x H) GEMM (about 4x faster on CPU than a matmul broadcast over positions)."""
    return y.reshape(-1, heads, y.shape[-1] // heads).transpose(0, 1).reshape(heads, -1)


def route(sources: list, weights: Tensor, heads: int, shape: torch.Size) -> Tensor:
    """sum_j W[:, jH:(j+1)H] applied over the heads of sources[j] (each ``heads_first``); W (H, len(sources) H);
    the result in ``shape`` (..., H * d_h)."""
    out = weights[:, :heads] @ sources[0]
    for j in range(1, len(sources)):
        out = torch.addmm(out, weights[:, j * heads : (j + 1) * heads], sources[j])
    return out.reshape(heads, -1, shape[-1] // heads).transpose(0, 1).reshape(shape)


class LimeProjection(nn.Linear):
    """k_proj or v_proj of self-attention layer ``index`` of a stack with LIMe: appends its raw output to the
    stack's ``store[kind]`` and returns the route over the store (layer 0: its raw output)."""

    def __init__(self, linear: nn.Linear, kind: str, store: dict, index: int, last: bool, heads: int,
                 routes: nn.Parameter | None, scale: float):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a new weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.kind, self.store, self.index, self.last, self.heads, self.scale = kind, store, index, last, heads, scale
        object.__setattr__(self, "routes", routes)  # a reference: the attention registers it (module docstring)

    def effective_routes(self) -> Tensor | None:
        """W_l = c P_l (None for layer 0)."""
        return None if self.routes is None else self.scale * self.routes

    def forward(self, x: Tensor) -> Tensor:
        raw = F.linear(x, self.weight, self.bias)
        sources = self.store[self.kind]
        if self.index == 0:
            sources.clear()  # a pass that stopped early (an exception) left its sources: start afresh
        sources.append(heads_first(raw, self.heads))
        if len(sources) != self.index + 1:
            raise RuntimeError(f"LIMe: layer {self.index}'s {self.kind} projection ran with {len(sources) - 1} earlier "
                               "layers' sources; every layer of the stack must run once, in order, per pass")  # fmt: skip
        out = raw if self.index == 0 else route(sources, self.effective_routes().to(raw.dtype), self.heads, raw.shape)
        if self.last:
            sources.clear()
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lime={self.kind}, layer={self.index}, scale={self.scale:g}"


def attach_lime(attentions: list, init: str = "uniform", scale: float = 10.0) -> dict:
    """LIMe in a stack of fairseq self-attention MultiheadAttentions (layer order); returns the shared store."""
    if not attentions:
        raise ValueError("LIMe needs at least one attention layer")
    for attn in attentions:
        for name in ("k_proj", "v_proj"):
            proj = getattr(attn, name)
            if type(proj) is not nn.Linear or proj._forward_pre_hooks or proj._forward_hooks:
                raise ValueError(f"LIMe needs {name} to be a plain nn.Linear, got {type(proj).__name__} (another "
                                 "choice replaced it, or quant noise hooks it)")  # fmt: skip
    heads = attentions[0].num_heads
    if any(a.num_heads != heads or a.kdim != a.embed_dim or a.vdim != a.embed_dim for a in attentions):
        raise ValueError("LIMe needs the same heads and widths in every layer of a stack")
    store: dict = {"k": [], "v": []}
    last = len(attentions) - 1
    for l, attn in enumerate(attentions):
        weight = attn.k_proj.weight  # the attention may already be converted (dtype, device): follow it
        routes = None
        if l > 0:
            attn.lime_routes = nn.Parameter(lime_routes_init(l, heads, init, scale).to(weight))
            routes = attn.lime_routes
        attn.k_proj = LimeProjection(attn.k_proj, "k", store, l, l == last, heads, routes, scale)
        attn.v_proj = LimeProjection(attn.v_proj, "v", store, l, l == last, heads, routes, scale)
        attn._set_skip_embed_dim_check()  # the fused path would read k/v_proj.weight and skip the routes
    return store
