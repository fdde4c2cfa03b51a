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
