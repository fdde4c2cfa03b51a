"""Where the norms of a layer go, per sublayer and layer index: Pre-LN, Post-LN, Peri-LN (= Sandwich-LN),
Mix-LN, HybridNorm (and HybridNorm*), and ReZero's "no norm". Plain data and pure functions, no modules:
a layer loop asks ``sublayer_norms(placement, ...)`` which norms to build and ``apply_sublayer`` shows,
executably, what each flag means. The norm *function* (LayerNorm, RMSNorm, DyT, Derf) is a separate axis.

Per sublayer (x the residual stream, F the branch with its dropout, N a norm of its own):

    pre        x <- x + F(N(x))                      fairseq's normalize_before
    post       x <- N(x + F(x))                      fairseq's default
    peri       x <- x + N_out(F(N_in(x)))            Peri-LN eq. 3 (arXiv:2502.02732); the same placement as
                                                     Sandwich-LN (CogView, arXiv:2105.13290, section 2.4)
    hybrid     attention: x <- x + Attn(x) with per-head N_q, N_k, N_v inside (``hybrid_norm.HeadNorm``)
               FFN:       h = N(x); x <- h + FFN(h)  the normalised sum becomes the residual
    rezero     x <- x + alpha F(x)                   no norm (``rezero.ReZeroGate`` holds alpha)

Stack level (``stack_norms``): ``final`` = a norm on the stack output (fairseq's ``layer_norm``: the encoder
output that cross-attention reads, and the decoder state before the output projection); ``embedding`` = a
norm on the embedding output (fairseq's ``layernorm_embedding``).

Sources and decisions:
- Peri-LN: both norms have learnable gains, init 1 (freezing the output gain hurts, the paper's figure 8, via
  third-party notes). The paper also normalises the embedding and keeps the final norm (third-party notes,
  not confirmed from the paper text): ``final=True``; the embedding norm is an option (``peri_embedding``,
  default off) because it is the unconfirmed part.
- Mix-LN (arXiv:2412.13795; authors' code pixeli99/MixLN ``NORM_TYPE=post_pre``, read at ff45826): layers
  l < floor(alpha L) are Post-LN with no pre-norms, the rest Pre-LN, alpha = 0.25 (``POST_NUM`` 3 of 12 and
  6 of 24 in the authors' scripts), and the final norm is always applied. For an encoder-decoder we count L
  per stack (E6D6: 1 Post-LN layer in each stack); a decoder Post-LN layer post-normalises all three
  sublayers, cross-attention included. floor(alpha L) = 0 (L < 4) leaves plain Pre-LN.
- HybridNorm (arXiv:2503.04598; authors' code BryceZhuo/HybridNorm ``dense_model/olmo/model.py`` and the
  1.2B config, read at f0dd605: ``attn_norm: false``, ``use_query/key/value_norm: true``, ``ffn_norm: true``,
  ``ffn_residual_after_norm: true``, RMSNorm eps 1e-5, final ``ln_f``). HybridNorm* (README,
  ``norm_pos_special_config``): layer 0 keeps a pre-norm on attention and its FFN is plain Pre-LN (the model's
  ``--hybrid-first-layer pre``: site_layers' ``keep_pre_ln``, Q/K/V norms kept in layer 0 as the code's global
  ``use_*_norm``; in a decoder, cross-attention gets its pre-norm too).
  Our decisions for the decoder: cross-attention is treated like self-attention (no input norm, N_q on the
  decoder query, N_k and N_v on the encoder projections, which fairseq then caches under static_kv), and is
  not followed by its own normalised residual: the FFN's N normalises the sum of both attention sublayers,
  Y1 = X + SA(X), Y2 = Y1 + CA(Y1), X' = N(Y2) + FFN(N(Y2)), so a decoder layer keeps the paper's single
  normalised residual per layer.
- The encoder output read by cross-attention is the stack output after its final norm wherever ``final``
  is set (all placements but ``post``, as in fairseq).
Every placement is per position: incremental decoding and beam search are unaffected (HybridNorm's K/V
norms act before fairseq caches K/V, so the cache holds normalised keys and values, as in the authors'
code, which normalises before concatenating ``layer_past``).
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

PLACEMENTS = ("pre", "post", "peri", "mix", "hybrid", "hybrid_star", "rezero")
SUBLAYERS = ("self_attn", "encoder_attn", "ffn")
MIX_LN_ALPHA = 0.25


@dataclass(frozen=True)
class SublayerNorms:
    """The norms of one sublayer.

    pre: N on the branch input, F(N(x)).
    branch: N on the branch output before the add, x + N(F(.)) (Peri-LN's output norm).
    post: N on the sum, N(x + F(.)) (Post-LN).
    residual_from_pre: the residual is the normalised input, N(x) + F(N(x)) (HybridNorm's FFN); needs pre.
    qkv: per-head norms on Q, K and V inside the attention (HybridNorm's attention).
    """

    pre: bool = False
    branch: bool = False
    post: bool = False
    residual_from_pre: bool = False
    qkv: bool = False


@dataclass(frozen=True)
class StackNorms:
    embedding: bool = False
    final: bool = True


PRE = SublayerNorms(pre=True)
POST = SublayerNorms(post=True)
PERI = SublayerNorms(pre=True, branch=True)
NONE = SublayerNorms()


def mix_ln_post_layers(num_layers: int, alpha: float = MIX_LN_ALPHA) -> int:
    """floor(alpha L): how many leading layers of a stack Mix-LN makes Post-LN."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"Mix-LN alpha must be in [0, 1], got {alpha}")
    return int(alpha * num_layers + 1e-9)


def sublayer_norms(placement: str, layer_idx: int, num_layers: int, sublayer: str,
                   mix_alpha: float = MIX_LN_ALPHA) -> SublayerNorms:
    """The norms of ``sublayer`` (``self_attn``, ``encoder_attn`` or ``ffn``) in 0-based layer ``layer_idx``
    of a stack of ``num_layers`` layers (encoder and decoder counted separately)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"norm placement must be one of {PLACEMENTS}, got {placement!r}")
    if sublayer not in SUBLAYERS:
        raise ValueError(f"sublayer must be one of {SUBLAYERS}, got {sublayer!r}")
    if not 0 <= layer_idx < num_layers:
        raise ValueError(f"layer_idx must be in [0, {num_layers}), got {layer_idx}")
    if placement == "pre":
        return PRE
    if placement == "post":
        return POST
    if placement == "peri":
        return PERI
    if placement == "rezero":
        return NONE
    if placement == "mix":
        return POST if layer_idx < mix_ln_post_layers(num_layers, mix_alpha) else PRE
    first = placement == "hybrid_star" and layer_idx == 0
    if sublayer == "ffn":
        return PRE if first else SublayerNorms(pre=True, residual_from_pre=True)
    return SublayerNorms(pre=first, qkv=True)


def stack_norms(placement: str, peri_embedding: bool = False) -> StackNorms:
    """The stack-level norms (see the module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"norm placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement in ("post", "rezero"):  # ReZero: the authors' code has no final norm (modules/rezero.py)
        return StackNorms(final=False)
    return StackNorms(embedding=placement == "peri" and peri_embedding, final=True)


def apply_sublayer(spec: SublayerNorms, x: Tensor, branch: Callable[[Tensor], Tensor], norms: dict) -> Tensor:
    """One sublayer under ``spec``: ``branch`` is F with its dropout (for an attention with ``spec.qkv`` the
    Q/K/V norms live inside it); ``norms`` maps ``pre``/``branch``/``post`` to the norm modules it needs."""
    h = norms["pre"](x) if spec.pre else x
    out = branch(h)
    if spec.branch:
        out = norms["branch"](out)
    y = (h if spec.residual_from_pre else x) + out
    return norms["post"](y) if spec.post else y
