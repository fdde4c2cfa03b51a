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
- Layer pruning (fairseq's ``--encoder-layers-to-keep``, LayerDrop's inference-time pruning; not in the
  paper): a pruned model keeps, for every kept layer, exactly the weights it was trained with. Two kept
  layers stay paired (tied, or regularized) only if they were adjacent before pruning, with the pair's
  projections chosen by the parity of the original t; a lower projection whose partner was pruned becomes
  the layer's own projection, holding the shared weights it was trained with.

The models: ``crossformer_sg`` (soft guidance) is fairseq's Pre-LN transformer, unchanged, exposing L_reg through
``guidance_loss()``, which the criterion ``label_smoothed_cross_entropy_with_guidance`` adds as
L = L_nll + alpha * L_reg (eq. 2); ``crossformer_hg`` (hard guidance) ties the pairs (``--tying``). Presets
(models/families.py): ``crossformer_sg_*`` and ``crossformer_hg_*`` with ``key-query`` (the paper's proof of
concept and its deep-model setting, table 3), ``crossformer_hg_ffn_*`` and ``crossformer_hg_value_*`` (table 1's
other hard-guidance rows), and ``crossformer_all_e16d6``, the paper's parameter-matched Crossformer-All (table 2:
all three blocks hard-guided, base width, "16" layers). "16" is read as 16 encoder and 6 decoder layers, like
table 3's "36" (36 encoder, 6 decoder), the only reading that matches the 6+6 Transformer-base: 60,546,560 vs
60,524,544 parameters for a 32K joint vocabulary (the paper's 60M vs 61M comes from its per-block count, which
drops biases and LayerNorms and counts a partner for the top layer); 16+16 would have 87M, 8+8 53M.
"""

import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..validation import PluginOptionError, check_choice_list

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


def guidance_pairs(
    num_layers: int, blocks: Iterable[str], layer_ids: Sequence[int] | None = None
) -> list[GuidancePair]:
    """The pairs of eq. 3, 5 and 6 for a stack of ``num_layers`` layers and the chosen ``blocks``.

    ``layer_ids`` (0-based, increasing) names the layer of the original stack that each layer is, after
    layer pruning (``--encoder-layers-to-keep``); default: the stack is not pruned, ``0 .. num_layers-1``.
    A pair joins two kept layers only if they were adjacent in the original stack, and eq. 5 and 6 pick
    its projections by the parity of the *original* t; ``GuidancePair.t`` is the position in this stack.
    """
    blocks = set(blocks)
    unknown = blocks - set(BLOCKS)
    if unknown:
        raise ValueError(f"unknown guidance blocks {sorted(unknown)}; choose from {', '.join(BLOCKS)}")
    ids = list(range(num_layers)) if layer_ids is None else list(layer_ids)
    if len(ids) != num_layers or any(b <= a for a, b in itertools.pairwise(ids)):
        raise ValueError(f"layer_ids must be {num_layers} increasing layer numbers, got {ids}")
    pairs = []
    for t in range(1, num_layers):
        if ids[t] != ids[t - 1] + 1:  # a pruned layer lay between them: no pair
            continue
        odd = (ids[t - 1] + 1) % 2 == 1
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

    Its ``weight`` and ``bias`` are the owner's (the projection of layer t+1) ``nn.Parameter`` objects,
    registered under both modules, as fairseq ties its output projection to the embedding: one Parameter,
    once in ``parameters()`` (which removes duplicates), hence once in the optimizer, fp16 flat buffers and
    DDP's reduction; its gradient is the sum of both layers' (autograd accumulates both uses in place).
    ``.half()``/``.to()`` convert it in place, so the tie survives. A plain registered Parameter (no Python
    property) is what TorchScript can compile. Only the ``nn.Linear`` is shared, never the attention
    module, whose incremental-decoding cache is keyed per module.

    In ``state_dict()`` the shared values appear once, under the owner's name: this module saves nothing.
    Loading ignores its own name unless the checkpoint holds a value there that differs from the owner's
    (the checkpoint trained the two separately): that is an error (``tie_pairs``' load hook), never a
    silent choice of one of them.
    """

    def __init__(self, owner: nn.Linear):
        super().__init__()
        self.weight = owner.weight
        self.register_parameter("bias", owner.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        return f"in_features={in_features}, out_features={out_features}, tied"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        pass  # saved once, by the owner

    def _load_from_state_dict(self, state_dict, prefix, *args):
        # loaded once, through the owner; an entry of its own was checked against the owner's by the layer
        # stack (``tie_pairs``' hook), which sees both
        for name in ("weight", "bias"):
            state_dict.pop(prefix + name, None)


def _check_tied_entries(pairs: list[GuidancePair], state_dict, prefix, local_metadata, strict, missing_keys,
                        unexpected_keys, error_msgs) -> None:  # fmt: skip
    """Load pre-hook of a tied layer stack: an entry saved under a tied lower projection (a re-materialised or
    a pruned checkpoint's) must equal its owner's; it is then dropped, since the owner loads the value."""
    for pair in pairs:
        for name in ("weight", "bias"):
            own = f"{prefix}{pair.t - 1}.{pair.lower}.{name}"
            owner = f"{prefix}{pair.t}.{pair.upper}.{name}"
            value = state_dict.pop(own, None)
            if value is not None and owner in state_dict and not torch.equal(value, state_dict[owner]):
                error_msgs.append(
                    f"{own} is tied to {owner} in this model (hard guidance), but the checkpoint holds two "
                    "different values: it was trained with other ties, e.g. saved from a pruned model "
                    "(--encoder/decoder-layers-to-keep) whose record of kept layers "
                    "(guidance_encoder/decoder_layer_ids in its args) is missing here"
                )


# lower projection -> its partner in the layer above, for every pair eq. 3, 5 and 6 can form
PARTNERS = {
    "key-query": {"self_attn.k_proj": "self_attn.q_proj"},
    "ffn": {"fc1": "fc1", "fc2": "fc2"},
    "value": {"self_attn.v_proj": "self_attn.v_proj", "self_attn.out_proj": "self_attn.out_proj"},
}


def materialise_tied_projections(state_dict: dict, stack_prefix: str, blocks: Iterable[str]) -> None:
    """Give every tied lower projection of a hard-guided checkpoint its own entries, in place.

    A ``crossformer_hg`` checkpoint saves each shared Parameter once, under the owner (layer t+1); the lower
    layer t has no entry. Layer pruning renumbers and drops layers by their keys (fairseq's
    ``prune_state_dict``), so a kept layer whose partner is dropped would lose the weights it was trained
    with. Before pruning, each missing ``{stack_prefix}.layers.{i}.{lower}`` therefore becomes an alias of
    ``...layers.{i+1}.{upper}``. No layer structure is needed: a projection is in at most one pair, and a
    lower projection's only possible partner is the same projection (W_Q for W_K) of the layer just above,
    so a missing lower entry with a present partner can only mean that tie. Tensors are shared, not copied.
    """
    pattern = re.compile(rf"{re.escape(stack_prefix)}\.layers\.(\d+)\.")
    layers = sorted({int(m.group(1)) for key in state_dict if (m := pattern.match(key))})
    for block in blocks:
        for lower, upper in PARTNERS[block].items():
            for i in layers:
                for name in ("weight", "bias"):
                    own = f"{stack_prefix}.layers.{i}.{lower}.{name}"
                    partner = f"{stack_prefix}.layers.{i + 1}.{upper}.{name}"
                    if own not in state_dict and partner in state_dict:
                        state_dict[own] = state_dict[partner]


def tie_pairs(layers: nn.ModuleList, pairs: Iterable[GuidancePair]) -> None:
    """Hard guidance: replace each pair's lower projection by a ``TiedLinear`` of the upper one.

    The lower layer's own initial weights are discarded; the shared ones start from layer t+1's.
    """
    pairs = list(pairs)
    for pair in pairs:
        lower, upper = projections(layers, pair)
        if lower.weight.shape != upper.weight.shape:
            raise ValueError(f"cannot tie {pair}: shapes {tuple(lower.weight.shape)}, {tuple(upper.weight.shape)}")
        parent_path, _, name = pair.lower.rpartition(".")
        parent = layers[pair.t - 1].get_submodule(parent_path) if parent_path else layers[pair.t - 1]
        setattr(parent, name, TiedLinear(upper))
    # on the stack, not the TiedLinear: torch hands each module only the state entries under its own prefix
    layers._register_load_state_dict_pre_hook(functools.partial(_check_tied_entries, pairs))


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


# ------------------------------------------------------------------ the blocks --guidance and --tying name

ALL_BLOCKS = "all"


def check_guidance(name: str, value) -> str:
    """``all`` or a comma-separated list of distinct blocks from BLOCKS; returned as a canonical string."""
    items = check_choice_list(name, value, (*BLOCKS, ALL_BLOCKS))
    if ALL_BLOCKS in items and len(items) > 1:
        flag = "--" + name.replace("_", "-")
        raise PluginOptionError(f"{flag}: 'all' stands alone (it means {','.join(BLOCKS)}); got {value!r}")
    return ",".join(items)


def guided_blocks(guidance: str) -> tuple[str, ...]:
    return BLOCKS if guidance == ALL_BLOCKS else tuple(guidance.split(","))


def expected_tied_parameter_saving(args) -> int:
    """Parameters a ``crossformer_hg`` model has fewer than fairseq's transformer of the same shape.

    Each tied pair removes its lower projection (weight and bias): key-query, W_V and W_F pairs
    d_model^2 + d_model each, W1 pairs d_model*d_ffn + d_ffn, W2 pairs d_ffn*d_model + d_model. A stack of
    T layers has T-1 pairs per guided block, so with d_ffn = 4 d_model its weights shrink by (T-1) times
    the paper's per-block saving (section 2.2, "Model proprieties": 1 d_m^2 key-query, 4 d_m^2 FFN,
    1 d_m^2 value, 6 d_m^2 all); the paper's count of T blocks ignores that the top layer has no partner.
    Returns 0 for a model that ties nothing (``--tying none``, e.g. ``crossformer_sg``). ``args`` as parsed for
    ``--arch``.
    """
    tying = getattr(args, "tying", None)
    if tying in (None, "none"):
        return 0
    blocks = guided_blocks(check_guidance("tying", tying))
    return sum(
        tied_parameter_count(
            guidance_pairs(getattr(args, f"{side}_layers"), blocks),
            getattr(args, f"{side}_embed_dim"),
            getattr(args, f"{side}_ffn_embed_dim"),
        )
        for side in ("encoder", "decoder")
    )
