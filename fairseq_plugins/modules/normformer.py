"""NormFormer (Shleifer, Weston, Ott, "NormFormer: Improved Transformer Pretraining with Extra
Normalization", arXiv:2110.09456, section 2 and figure 1): Pre-LN plus three operations and an optional
residual scale, all learned and all starting at 1 (LayerNorm weights 1, biases 0):

    attention: x <- x + dropout(LN_a(HeadScaleMHA(LN(x))))              --scale-attn (LN_a), --scale-heads
               HeadScaleMHA(q, k, v) = Concat(g_1 h_1, ..., g_H h_H) W_O, g = ones(H)
    FFN:       x <- lambda * x + dropout(fc2(LN_f(act(fc1(LN(x))))))    --scale-fc (LN_f, width ffn_dim),
                                                                       --scale-resids (lambda = ones(d))

fairseq 0.12 has these four flags in its decoder layer only (``TransformerDecoderLayerBase``: attn_ln,
c_attn, ffn_layernorm, w_resid), for self-attention, with one departure: its head scale multiplies the
*projected* output cut into H chunks, after W_O (deliberate, not equivalent, fairseq issue #3973).

``--normformer-impl paper`` (default): the paper's operations in encoder and decoder. The decoder reuses
fairseq's attn_ln, ffn_layernorm and w_resid (they are the paper's) and takes the head scale g before W_O,
written as W_O applied to the head-scaled concatenation (``HeadScaledLinear`` replaces out_proj, so every
attention path, incremental decoding included, uses it; fairseq's fused full-sequence attention reads
out_proj.weight directly, so that path is switched off for these attentions). The encoder layer gets the
same operations: LN_a inside the out_proj module (after W_O, before dropout, as in fairseq's decoder),
LN_f in front of fc2, lambda on the FFN residual.
``--normformer-impl fairseq``: fairseq's own decoder-side code, unchanged; the encoder stays plain Pre-LN.

Cross-attention: the paper (decoder-only and encoder-only language models) has none. Our reading, like
fairseq's code: NormFormer's operations apply to self-attention and FFN; cross-attention stays Pre-LN.
"""

import torch
import torch.nn.functional as F
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor, nn

from .residual_wiring import SiteEncoderLayer

IMPLEMENTATIONS = ("paper", "fairseq")
FLAGS = ("scale_attn", "scale_fc", "scale_heads", "scale_resids")


class HeadScaledLinear(nn.Module):
    """W_O with NormFormer's head scale, Concat(g_1 h_1, ..., g_H h_H) W_O + b, then LN_a if given.

    Takes over the weight and bias Parameters of the ``nn.Linear`` it replaces (same state_dict keys
    ``weight``/``bias``, same values, no random numbers drawn).

    Args:
        linear: the attention's out_proj.
        num_heads: H, the input (seq_len, batch, H * head_dim) being the concatenated heads; None: no g.
        attn_ln: LN_a (encoder side) or None.
    """

    def __init__(self, linear: nn.Linear, num_heads: int | None, attn_ln: nn.Module | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.head_scale = nn.Parameter(torch.ones(num_heads)) if num_heads else None
        self.attn_ln = attn_ln

    def forward(self, x: Tensor) -> Tensor:
        if self.head_scale is not None:
            x = x * self.head_scale.repeat_interleave(self.in_features // self.head_scale.numel())
        x = F.linear(x, self.weight, self.bias)
        return self.attn_ln(x) if self.attn_ln is not None else x


class PreNormLinear(nn.Module):
    """fc2 with LN_f in front: fc2(LN_f(x)). Takes over the replaced ``nn.Linear``'s Parameters."""

    def __init__(self, linear: nn.Linear, norm: nn.Module):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.ffn_layernorm = norm

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(self.ffn_layernorm(x), self.weight, self.bias)


def replace_out_proj_(attn, scale_heads: bool, attn_ln: nn.Module | None = None) -> None:
    """Install ``HeadScaledLinear`` as ``attn.out_proj`` and route every call through it."""
    attn.out_proj = HeadScaledLinear(attn.out_proj, attn.num_heads if scale_heads else None, attn_ln)
    # fairseq's fused path passes out_proj.weight to F.multi_head_attention_forward, bypassing the
    # module; this switch (meant for pruned heads) selects fairseq's own, module-calling path.
    attn._set_skip_embed_dim_check()


class NormFormerEncoderLayer(SiteEncoderLayer):
    """fairseq's Pre-LN encoder layer with NormFormer's LN_a, head scale, LN_f and lambda (paper impl).

    Args:
        cfg: the layer's TransformerConfig; ``scale_attn``/``scale_fc``/``scale_heads``/``scale_resids``
            are read from it like fairseq's decoder layer does.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        flags = {f: bool(getattr(cfg, f, False)) for f in FLAGS}
        attn_ln = LayerNorm(self.embed_dim, export=cfg.export) if flags["scale_attn"] else None
        if flags["scale_heads"] or attn_ln is not None:
            replace_out_proj_(self.self_attn, flags["scale_heads"], attn_ln)
        if flags["scale_fc"]:
            self.fc2 = PreNormLinear(self.fc2, LayerNorm(cfg.encoder.ffn_embed_dim, export=cfg.export))
        self.w_resid = nn.Parameter(torch.ones(self.embed_dim)) if flags["scale_resids"] else None

    def combine(self, site, x, residual):
        if site == "ffn" and self.w_resid is not None:
            return self.w_resid * residual + x
        return residual + x


def carry_layer_(layer: nn.Module, flags: dict, export: bool = False) -> None:
    """NormFormer inside the sublayers of a stream carry's layer (modules/carry_stack.py's, DCA's, MUDD's; the
    residual choice's ``BranchChange``, modules/site_layers.py, states the composed maths): the paper's form in
    encoder and decoder alike, as ``NormFormerEncoderLayer``: head scale g before W_O and LN_a after it (one
    ``HeadScaledLinear``), LN_f in front of fc2. The modules fairseq's decoder layer built from the flags
    (attn_ln, c_attn, ffn_layernorm), which only its own forward reads, are dropped for these. lambda
    (``scale_resids``) scales the stream, which a carry replaces: refused before (axes/residual.py)."""
    for name in ("attn_ln", "c_attn", "ffn_layernorm", "w_resid"):
        if getattr(layer, name, None) is not None:
            setattr(layer, name, None)
    attn_ln = LayerNorm(layer.embed_dim, export=export) if flags["scale_attn"] else None
    if flags["scale_heads"] or attn_ln is not None:
        replace_out_proj_(layer.self_attn, flags["scale_heads"], attn_ln)
    if flags["scale_fc"]:
        layer.fc2 = PreNormLinear(layer.fc2, LayerNorm(layer.fc2.in_features, export=export))


class NormFormerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's Pre-LN decoder layer with its own NormFormer flags; with ``heads_before_out_proj`` the
    head scale is the paper's (before W_O) instead of fairseq's (after W_O).

    Args:
        cfg: TransformerConfig with the four ``scale_*`` flags as fairseq reads them.
        no_encoder_attn: as fairseq.
        heads_before_out_proj: paper impl; cfg.scale_heads must then be False for fairseq's part.
    """

    def __init__(self, cfg, no_encoder_attn: bool, heads_before_out_proj: bool = False):
        super().__init__(cfg, no_encoder_attn)
        if heads_before_out_proj:
            replace_out_proj_(self.self_attn, scale_heads=True)

