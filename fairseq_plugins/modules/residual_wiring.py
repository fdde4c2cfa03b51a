"""How the residual stream of a fairseq layer is wired and initialised: DeepNet, T-Fixup, B2T (and the
shared pieces Admin and NormFormer build on, see admin.py and normformer.py).

Notation: x the input of a sublayer F (self-attention, cross-attention or FFN), LN a LayerNorm, N encoder
and M decoder layers. fairseq's Post-LN layer computes x <- LN(x + dropout(F(x))) and calls its hook
``residual_connection(dropout(F(x)), x)`` for the sum; every method here overrides that one hook (the
decoder calls it for self-attention, cross-attention and FFN, in that order).

DeepNet / DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", arXiv:2203.00555,
section 3 and figure 2's pseudocode), Post-LN with an up-weighted skip on every sublayer:

    x <- LN(alpha * x + F(x))
    encoder: alpha_e = 0.81 (N^4 M)^(1/16),  beta_e = 0.87 (N^4 M)^(-1/16)
    decoder: alpha_d = (3M)^(1/4),           beta_d = (12M)^(-1/4)
    init ("paper"): xavier_normal(gain=beta) for fc1, fc2, v_proj, out_proj; xavier_normal(gain=1) for
    q_proj, k_proj; the decoder's self- and cross-attention both take beta_d; biases, LayerNorms and
    embeddings unchanged.
    init ("torchscale", the authors' later code): every nn.Linear of the layer keeps PyTorch's default
    init (torchscale never calls its attention's reset_parameters), then every parameter of fc1, fc2,
    v_proj, out_proj, weight and bias (torchscale divides each named parameter containing those names), is
    divided by init_scale: (N^4 M)^(1/16) / 1.15 in the encoder (an effective beta 1.32x the paper's),
    (12M)^(1/4) in the decoder.

T-Fixup (Huang et al., "Improving Transformer Optimization Through Better Initialization", ICML 2020,
section 3.2's initialization procedure), no LayerNorm at all (sublayers, final, embedding) and no warm-up:

    x <- x + F(x)
    Xavier (uniform, gain 1) for every weight matrix except the embeddings, which keep fairseq's
    N(0, d^-1/2); then scale decoder v and out matrices, decoder FFN weights and both input embeddings by
    (9N)^(-1/4), encoder v and out matrices and encoder FFN weights by 0.67 N^(-1/4).
    The paper has one N (its models have N encoder and N decoder layers, and its decoder's derivation is
    over the decoder's own layers). The authors' code uses the decoder's own depth M for the decoder side,
    which is the default (``--tfixup-decoder-depth decoder``; ``encoder`` gives the code of 8302f79, whose
    default it was, and shrinks the decoder scale by (N/M)^(1/4), 1.19-1.57x on E12D6..E36D6); with shared
    embeddings it scales the one table once, with N. It also keeps fairseq's q/k gain 1/sqrt(2); we
    follow the paper's "Xavier for all" (gain 1), which only rescales the initial attention logits.
    Biases: fc biases zero (as the authors' Linear), attention biases as fairseq leaves them.

B2T connection (Takase et al., "B2T Connection: Serving Stability and Performance in Deep Transformers",
Findings of ACL 2023, section 4, figure 1(c)), Post-LN plus a skip from the layer input x to its last sum:

    encoder: h = LN(x + Attn(x));                       x' = LN(h + FFN(h) + x)
    decoder: h1 = LN(x + Self(x)); h2 = LN(h1 + Cross(h1)); x' = LN(h2 + FFN(h2) + x)
    init (authors' code, ``rescaling_init``, whether the paper states it is unconfirmed): every weight
    of the layer except LayerNorms (q/k/v/out projections of both attentions, fc1, fc2) times L^(-1/2),
    L the depth of its own stack; ``--b2t-init default`` leaves fairseq's init.

Shared: ``xavier_fc_`` is the fc1/fc2 init of the Admin and T-Fixup codebases (fairseq builds fc1/fc2 as
plain nn.Linear); ``SiteResidual`` tells the hook which sublayer is summing, for methods that treat the
FFN (B2T, NormFormer's lambda) or each sublayer (Admin) differently.
"""

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

ENCODER_SITES = ("self_attn", "ffn")
DECODER_SITES = ("self_attn", "encoder_attn", "ffn")


# ---------------------------------------------------------------------------------------------------
# shared pieces


def attentions(layer) -> list:
    """The layer's MultiheadAttention modules: self-attention, then cross-attention if it has one."""
    return [a for a in (layer.self_attn, getattr(layer, "encoder_attn", None)) if a is not None]


@torch.no_grad()
def xavier_fc_(layer, gain: float = 1.0) -> None:
    """fc1/fc2 <- xavier_uniform(gain), bias 0: the Admin and T-Fixup codebases' FFN init."""
    for fc in (layer.fc1, layer.fc2):
        nn.init.xavier_uniform_(fc.weight, gain=gain)
        nn.init.zeros_(fc.bias)


@torch.no_grad()
def scale_weights_(modules, factor: float) -> None:
    for m in modules:
        m.weight.mul_(factor)


class SiteResidual:
    """Mixin: ``combine(site, x, residual)`` replaces the residual sum, told which sublayer is summing.

    fairseq calls ``residual_connection`` once per sublayer in a fixed order; the layer's ``forward``
    records that order for this call (the decoder skips cross-attention when it has none or gets no
    encoder output) and the layer input (B2T needs it), so no forward is copied. Both live only for one
    forward call, so activation checkpointing recomputes them like any other value.
    """

    _sites: tuple[str, ...] = ()
    _site_index: int = 0
    _layer_input: Tensor | None = None

    def _begin(self, x: Tensor, sites: tuple[str, ...]) -> None:
        self._sites, self._site_index, self._layer_input = sites, 0, x

    def _end(self) -> None:
        self._layer_input = None

    def residual_connection(self, x, residual):
        site = self._sites[self._site_index]
        self._site_index += 1
        return self.combine(site, x, residual)

    def combine(self, site: str, x: Tensor, residual: Tensor) -> Tensor:
        return residual + x


class SiteEncoderLayer(SiteResidual, TransformerEncoderLayerBase):
    def forward(self, x, encoder_padding_mask: Tensor | None, attn_mask: Tensor | None = None):
        self._begin(x, ENCODER_SITES)
        try:
            return super().forward(x, encoder_padding_mask, attn_mask)
        finally:
            self._end()


class SiteDecoderLayer(SiteResidual, TransformerDecoderLayerBase):
    def forward(self, x, encoder_out: Tensor | None = None, *args, **kwargs):
        has_cross = self.encoder_attn is not None and encoder_out is not None
        self._begin(x, DECODER_SITES if has_cross else ("self_attn", "ffn"))
        try:
            return super().forward(x, encoder_out, *args, **kwargs)
        finally:
            self._end()


# ---------------------------------------------------------------------------------------------------
# DeepNet


def deepnet_constants(encoder_layers: int, decoder_layers: int) -> dict[str, float]:
    """alpha and beta of DeepNet's encoder-decoder table (arXiv:2203.00555, figure 2)."""
    n, m = encoder_layers, decoder_layers
    return {
        "encoder_alpha": 0.81 * (n**4 * m) ** (1 / 16),
        "encoder_beta": 0.87 * (n**4 * m) ** (-1 / 16),
        "decoder_alpha": (3 * m) ** (1 / 4),
        "decoder_beta": (12 * m) ** (-1 / 4),
    }


def torchscale_init_scales(encoder_layers: int, decoder_layers: int) -> dict[str, float]:
    """torchscale's divisors of the PyTorch-default weights (encoder, decoder)."""
    n, m = encoder_layers, decoder_layers
    return {"encoder": (n**4 * m) ** (1 / 16) / 1.15, "decoder": (12 * m) ** (1 / 4)}


class ScaledResidual:
    """Mixin: x <- alpha * residual + F(x) (DeepNorm's skip); alpha is a fixed constant."""

    alpha: float = 1.0

    def residual_connection(self, x, residual):
        return residual * self.alpha + x


class DeepNetEncoderLayer(ScaledResidual, TransformerEncoderLayerBase):
    """fairseq's Post-LN encoder layer with DeepNorm's alpha-weighted skip."""

    def __init__(self, cfg, alpha: float):
        super().__init__(cfg)
        self.alpha = alpha


class DeepNetDecoderLayer(ScaledResidual, TransformerDecoderLayerBase):
    """fairseq's Post-LN decoder layer with DeepNorm's alpha-weighted skip (cross-attention included)."""

    def __init__(self, cfg, no_encoder_attn: bool, alpha: float):
        super().__init__(cfg, no_encoder_attn)
        self.alpha = alpha


@torch.no_grad()
def deepnet_init_(layer, beta: float) -> None:
    """The paper's init: xavier_normal(beta) for fc1, fc2, v, out; xavier_normal(1) for q, k."""
    for fc in (layer.fc1, layer.fc2):
        nn.init.xavier_normal_(fc.weight, gain=beta)
    for attn in attentions(layer):
        nn.init.xavier_normal_(attn.q_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attn.k_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attn.v_proj.weight, gain=beta)
        nn.init.xavier_normal_(attn.out_proj.weight, gain=beta)


@torch.no_grad()
def torchscale_init_(layer, init_scale: float) -> None:
    """torchscale's init: PyTorch-default Linear weights and biases, fc1/fc2/v/out (weights and biases) divided
    by init_scale (torchscale's ``p.data.div_(init_scale)`` for every named parameter of those projections)."""
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            module.reset_parameters()
    scaled = [layer.fc1, layer.fc2]
    for attn in attentions(layer):
        scaled += [attn.v_proj, attn.out_proj]
    for module in scaled:
        for p in module.parameters():
            p.div_(init_scale)


# ---------------------------------------------------------------------------------------------------
# T-Fixup


class _NoLayerNorm:
    """Mixin: every LayerNorm of the layer becomes the identity (T-Fixup has none)."""

    def _drop_layer_norms(self) -> None:
        self.self_attn_layer_norm = nn.Identity()
        self.final_layer_norm = nn.Identity()
        if getattr(self, "encoder_attn_layer_norm", None) is not None:
            self.encoder_attn_layer_norm = nn.Identity()


class TFixupEncoderLayer(_NoLayerNorm, TransformerEncoderLayerBase):
    """x <- x + F(x), no LayerNorm: fairseq's Post-LN encoder layer with its LayerNorms removed."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self._drop_layer_norms()


class TFixupDecoderLayer(_NoLayerNorm, TransformerDecoderLayerBase):
    """x <- x + F(x), no LayerNorm: fairseq's Post-LN decoder layer with its LayerNorms removed."""

    def __init__(self, cfg, no_encoder_attn: bool):
        super().__init__(cfg, no_encoder_attn)
        self._drop_layer_norms()


def tfixup_scales(encoder_layers: int, decoder_layers: int, decoder_depth: str) -> dict[str, float]:
    """Encoder scale 0.67 N^(-1/4); decoder and embedding scale (9N)^(-1/4) (N or M, see above)."""
    n = encoder_layers
    m = decoder_layers if decoder_depth == "decoder" else encoder_layers
    return {
        "encoder": 0.67 * n ** (-1 / 4),
        "decoder": (9 * m) ** (-1 / 4),
        "encoder_embedding": (9 * n) ** (-1 / 4),
        "decoder_embedding": (9 * m) ** (-1 / 4),
    }


@torch.no_grad()
def tfixup_init_(layer, scale: float) -> None:
    """Xavier (gain 1) for every weight matrix, then v, out, fc1, fc2 times ``scale``."""
    xavier_fc_(layer)
    scaled = [layer.fc1, layer.fc2]
    for attn in attentions(layer):
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            nn.init.xavier_uniform_(proj.weight)
        scaled += [attn.v_proj, attn.out_proj]
    scale_weights_(scaled, scale)


# ---------------------------------------------------------------------------------------------------
# B2T


class _BottomToTop(SiteResidual):
    def combine(self, site, x, residual):
        if site == "ffn":
            return residual + x + self._layer_input
        return residual + x


class B2TEncoderLayer(_BottomToTop, SiteEncoderLayer):
    """fairseq's Post-LN encoder layer plus the layer input added to the FFN's sum."""


class B2TDecoderLayer(_BottomToTop, SiteDecoderLayer):
    """fairseq's Post-LN decoder layer plus the layer input added to the FFN's sum."""


@torch.no_grad()
def b2t_rescale_(layer, num_layers: int) -> None:
    """The authors' ``rescaling_init``: every non-LayerNorm weight of the layer times L^(-1/2)."""
    factor = num_layers ** (-0.5)
    for name, p in layer.named_parameters():
        if "weight" in name and "layer_norm" not in name:
            p.mul_(factor)

