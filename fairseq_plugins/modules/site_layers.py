"""fairseq's layers with one module per residual site: the layer classes of the 2024-26 residual-site ideas
on the ``--residual`` axis (axes/residual_sites.py).

A site is one sublayer's residual sum (``residual_wiring.SiteResidual``: self_attn, encoder_attn, ffn).
``SiteUpdateEncoderLayer``/``SiteUpdateDecoderLayer`` hold ``site_update``, an nn.ModuleDict site -> module
whose ``forward(x, residual)`` replaces ``residual + x`` (x the dropped-out branch output, fairseq's
``residual_connection`` order): LayerScale (modules/layer_scale.py), ReZero's gate (modules/rezero.py), the
orthogonal update (modules/orthogonal_residual.py) and Peri-LN's output norm (``PeriOutput``) all have that
interface, so one pair of layer classes carries them and no fairseq forward is copied. ``per_layer=True`` builds one module
shared by all the layer's sites (ReZero's authors' one gate per layer), saved once as ``site_update.layer``.

ReZero's layers have no sublayer norms (norm_placement ``rezero``): ``drop_sublayer_norms_`` turns them into
identities, so the norm axis, which replaces nn.LayerNorm modules, leaves them alone. HybridNorm's layers
(``HybridEncoderLayer``/``HybridDecoderLayer``) drop the attention input norms, put per-head Q/K/V norms in
every attention (modules/hybrid_norm.py) and take the FFN's residual from its normalised input.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from .hybrid_norm import attach_qkv_norms
from .residual_wiring import (
    DECODER_SITES,
    ENCODER_SITES,
    SiteDecoderLayer,
    SiteEncoderLayer,
)


class PeriOutput(nn.Module):
    """Peri-LN's output norm: residual + N_out(x), N_out a LayerNorm of its own (gain 1, bias 0 at init).

    fairseq drops the branch output out before the residual sum, so N_out normalises dropout(F); at inference
    (no dropout) this is the paper's x + N_out(F(N_in(x))).
    """

    def __init__(self, embed_dim: int):
        super().__init__()
        self.layer_norm = nn.LayerNorm(embed_dim)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return residual + self.layer_norm(x)

    def branch(self, x: Tensor) -> Tensor:
        """N_out(x): the normalised branch, joined to the stream by a stream carry's site."""
        return self.layer_norm(x)


class Contiguous(nn.Module):
    """A dropped norm: the identity, but contiguous as LayerNorm's output is. fairseq's (time, batch, C) stream is
    a transposed view, and a Linear given one takes matmul's slower path (a copy, mm and a separate bias add
    instead of one addmm). No parameters: checkpoints are those of an nn.Identity."""

    def forward(self, x: Tensor) -> Tensor:
        return x.contiguous()


def drop_sublayer_norms_(layer: nn.Module) -> None:
    for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
        if getattr(layer, name, None) is not None:
            setattr(layer, name, Contiguous())


LAYER_SITE = "layer"  # the key of a module shared by every site of a layer (``per_layer``)


def site_updates(sites, make_update: Callable[[str], nn.Module], per_layer: bool) -> nn.ModuleDict:
    """site -> its module, or {"layer": one module} that every site uses (``per_layer``)."""
    return nn.ModuleDict({LAYER_SITE: make_update(LAYER_SITE)} if per_layer else {s: make_update(s) for s in sites})


@dataclass(frozen=True)
class BranchChange:
    """A residual choice's change of every sublayer branch, composed with a stream carry's sites.

    A stream carry (modules/carry.py: hyper-connections static and dynamic, mHC, mHC-lite, frac-connections,
    Full and Block AttnRes) joins each sublayer to its state as ``state <- site(state, b)``, b the Pre-LN branch
    h -> dropout(F(LN(h))) of modules/carry_stack.py's layers (h: what the site feeds the sublayer, e.g. HC's
    A_m^T H). A residual choice whose update is a function of the branch alone changes b and nothing else,
    so the composed update is the carry's with b replaced:

        state <- site(state, h -> g(dropout(F(N(h)))))

    DCA's and MUDD's layers (modules/dca.py, muddformer.py) add their branches themselves: each branch output y
    becomes g(y) where the layer uses it (DCA: h = q_in + g(a), f_t = g(a) (+ g(c)) + g(m); MUDD: X'_A = R + g(a),
    X' = X'_A + g(m)); their attention reads norms of their own (LN of the GRN mixtures, MUDD's LN_Q/K/V), so
    they take only the choices that keep the sublayer norms (N = LN: LayerScale, Peri-LN, NormFormer).

        layerscale   g(y) = diag(lambda) y, N = LN      lambda_0 = CaiT's eps(depth) (--layerscale-init)
        rezero       g(y) = alpha y,        N = id      alpha_0 = 0; one alpha per layer (--rezero-gate layer) or
                                                        per sublayer; the stack's final norm per --rezero-final-norm
        peri         g(y) = LN_out(y),      N = LN      LN_out a norm of its own per site (gain 1, bias 0 at init)
        tfixup       g(y) = y,              N = id      F's v, out_proj, fc1, fc2 initialised as T-Fixup's (the
                                                        stack depth's scale), the embeddings scaled, no final norm
        normformer   g(y) = y,              N = LN      F changed inside: self-attention's heads scaled by gamma
                                                        before W_O and LN_a after it, LN_f before fc2, cross-
                                                        attention as Pre-LN (normformer.py's ``carry_layer_``, the
                                                        paper's form on both sides); lambda on the stream
                                                        (--scale-resids) and --normformer-impl fairseq are refused

    e.g. with static hyper-connections (n streams H_j): H_k <- sum_j A_r[j, k] H_j + B_k g(dropout(F(N(h)))),
    h = sum_j A_m[j] H_j (tests/test_axes_compose.py writes each out in float64). No paper
    describes these compositions: the carries' papers use Pre-LN sublayers (g = id, N = LN), and the residual
    choices' papers a single stream, where the site is x <- x + b. So at initialisation ReZero's alpha = 0 makes
    every site add nothing: HC's and frac-connections' sites start as their stream mixing alone (the identity
    at HC's A_r = I), AttnRes reads a softmax over the embedding and zero outputs; T-Fixup's scales are derived
    for a single residual sum, which the n streams or the softmax over depth replace.

    Built on a layer by ``attach``: ``site_update``, the site -> module table of the residual choice's own
    layers (the same names, ``layers.N.site_update.SITE.*``; ``layer`` for one module per layer), each with
    ``branch(y) = g(y)``; ``make_update`` None: g = id, no module; ``inside``: F's own change, module replacements
    on the layer. A layer with no change has none of them, so its state dict and its computation are those of the
    carry alone.

    Args:
        make_update: (embed_dim, stack depth) -> a module whose ``branch(y)`` is g(y); None for g = id.
        per_layer: one module shared by all the layer's sites (ReZero's gate per layer).
        sublayer_norms: False: the sublayers' input norms are dropped (N = id), as ``drop_sublayer_norms_``.
        inside: changes F inside the layer's sublayers (NormFormer's), called with the layer; None: none.
    """

    make_update: Callable[[int, int], nn.Module] | None = None
    per_layer: bool = False
    sublayer_norms: bool = True
    inside: Callable[[nn.Module], None] | None = None

    def attach(self, layer: nn.Module, sites: tuple[str, ...], embed_dim: int, depth: int) -> None:
        if self.make_update is not None:
            layer.site_update = site_updates(sites, lambda site: self.make_update(embed_dim, depth), self.per_layer)
            layer.per_layer_update, layer.changes_branches = self.per_layer, True
        if not self.sublayer_norms:
            drop_sublayer_norms_(layer)
        if self.inside is not None:
            self.inside(layer)


class ChangedBranches:
    """Mixin of a stream carry's layer: its ``BranchChange`` applied to a branch's output y (``branch_output``,
    for layers that add it themselves: DCA's, MUDD's) or to the branch callable a site runs (``changed``)."""

    changes_branches = False  # set by BranchChange.attach when the layer has a site_update table

    def branch_output(self, site: str, y: Tensor) -> Tensor:
        if not self.changes_branches:
            return y
        return self.site_update[LAYER_SITE if self.per_layer_update else site].branch(y)

    def changed(self, site: str, branch: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        if not self.changes_branches:
            return branch  # the carry alone: the same callable, the same computation
        return lambda h: self.branch_output(site, branch(h))


class SiteUpdateEncoderLayer(SiteEncoderLayer):
    def __init__(self, cfg, make_update: Callable[[str], nn.Module], sublayer_norms: bool = True,
                 per_layer: bool = False):  # fmt: skip
        super().__init__(cfg)
        self.site_update = site_updates(ENCODER_SITES, make_update, per_layer)
        self.per_layer_update = per_layer
        if not sublayer_norms:
            drop_sublayer_norms_(self)

    def combine(self, site: str, x: Tensor, residual: Tensor) -> Tensor:
        return self.site_update[LAYER_SITE if self.per_layer_update else site](x, residual)


class SiteUpdateDecoderLayer(SiteDecoderLayer):
    def __init__(self, cfg, no_encoder_attn: bool, make_update: Callable[[str], nn.Module], sublayer_norms: bool = True,
                 per_layer: bool = False):  # fmt: skip
        super().__init__(cfg, no_encoder_attn)
        sites = ("self_attn", "ffn") if no_encoder_attn else DECODER_SITES
        self.site_update = site_updates(sites, make_update, per_layer)
        self.per_layer_update = per_layer
        if not sublayer_norms:
            drop_sublayer_norms_(self)

    def combine(self, site: str, x: Tensor, residual: Tensor) -> Tensor:
        return self.site_update[LAYER_SITE if self.per_layer_update else site](x, residual)


class _Hybrid:
    """HybridNorm: attention without input norm but with Q/K/V norms; FFN residual N(x) + FFN(N(x)).
    ``keep_pre_ln`` makes the layer HybridNorm*'s first (see norm_placement's ``hybrid_star``)."""

    pre_ln_ffn = False

    def keep_pre_ln(self) -> None:
        """HybridNorm*'s first layer: a pre-norm on each attention's input (its Q/K/V norms stay, as the authors'
        global ``use_*_norm``) and a Pre-LN FFN, x <- x + FFN(N(x)). The input norms are copies of the layer's FFN
        norm, called in the model's ``__init__`` while every norm still has its initial values, so each starts
        as a new norm of the same kind (the norm axis replaces all of them afterwards)."""
        self.self_attn_layer_norm = copy.deepcopy(self.final_layer_norm)
        if getattr(self, "encoder_attn", None) is not None:
            self.encoder_attn_layer_norm = copy.deepcopy(self.final_layer_norm)
        self.pre_ln_ffn = True

    def _hybridise(self) -> None:
        self.self_attn_layer_norm = Contiguous()
        attach_qkv_norms(self.self_attn)
        if getattr(self, "encoder_attn", None) is not None:
            self.encoder_attn_layer_norm = Contiguous()
            attach_qkv_norms(self.encoder_attn)

    def combine(self, site: str, x: Tensor, residual: Tensor) -> Tensor:
        # fairseq keeps the un-normalised sum as the FFN's residual; HybridNorm's residual is N(sum), the FFN's
        # own input (recomputed here: one norm per layer, no fairseq forward copied)
        return (self.final_layer_norm(residual) if site == "ffn" and not self.pre_ln_ffn else residual) + x


class HybridEncoderLayer(_Hybrid, SiteEncoderLayer):
    def __init__(self, cfg):
        super().__init__(cfg)
        self._hybridise()


class HybridDecoderLayer(_Hybrid, SiteDecoderLayer):
    def __init__(self, cfg, no_encoder_attn: bool = False):
        super().__init__(cfg, no_encoder_attn)
        self._hybridise()
