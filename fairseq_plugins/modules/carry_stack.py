"""One encoder layer, one decoder layer and one encoder and decoder for every idea declared by its carry
(modules/carry.py): the stream carries (hyper-connections static and dynamic, mHC, mHC-lite, frac-connections,
Full and Block AttnRes) on the layers below, and the between-layer ideas (DenseFormer, DLCL, LAuReL) on the
residual axis's layers (``build_with_layers``).

The layers are fairseq's Pre-LN layers (their modules and parameter names are the baseline's) whose sublayers are
written once, for encoder and decoder alike, as branches h -> dropout(F(LN(h))): self-attention, cross-attention,
FFN. Each is joined to the carry's state by its site's connection, ``state = hc[j](state, branch)``, built by the
carry's site factory; the stacks run layer_stack.py's loop with the carry's hooks (modules/carry.py).
An idea is its connection module and its carry, nothing here. A residual choice whose update is a function of
the branch alone (LayerScale, ReZero, Peri-LN, T-Fixup) changes every branch of these layers (the stacks'
``change``, site_layers.py's ``BranchChange``, which states the composed maths); without one the layers are the
carry's alone.

``hc`` names the sites' ModuleList for every carry (``layers.N.hc.J.*``): the name hyper-connections' checkpoints
gave it first, which mHC's, frac-connections' and AttnRes' checkpoints kept.
"""

from collections.abc import Callable

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from .carry import Carry
from .layer_stack import (
    LayerStackDecoder,
    LayerStackEncoder,
    add_format_version,
    wrap_layer,
)
from .residual_wiring import DECODER_SITES, ENCODER_SITES
from .site_layers import BranchChange, ChangedBranches

MakeSite = Callable[[int, int], nn.Module]  # (embed_dim, site index in the stack) -> connection


class _Sublayers(ChangedBranches):
    """fairseq 0.12.3's Pre-LN sublayers (TransformerEncoderLayerBase/TransformerDecoderLayerBase.forward, Pre-LN
    branch; no hook gives a sublayer its own input), each as a branch h -> dropout(F(LN(h))) that a site wraps
    instead of x + T(x), changed by the residual choice's ``change`` if any (``changed``)."""

    hc: nn.ModuleList

    def _connect(self, make_site: MakeSite, first_site: int, names: tuple[str, ...], change: BranchChange | None,
                 depth: int) -> None:  # fmt: skip
        self.hc = nn.ModuleList(make_site(self.embed_dim, first_site + j) for j in range(len(names)))
        if change is not None:
            change.attach(self, names, self.embed_dim, depth)

    def _self_attention(self, h: Tensor, padding_mask: Tensor | None, attn_mask: Tensor | None,
                        incremental_state=None) -> Tensor:  # fmt: skip
        h = self.self_attn_layer_norm(h)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=padding_mask,
                              incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)  # fmt: skip
        return self.dropout_module(h)

    def _ffn(self, h: Tensor) -> Tensor:
        h = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(h))))
        return self.dropout_module(self.fc2(h))


class CarryEncoderLayer(_Sublayers, TransformerEncoderLayerBase):
    """fairseq's Pre-LN encoder layer on a carry's state: sites ``first_site`` (self-attention) and
    ``first_site + 1`` (FFN)."""

    SITES = 2

    def __init__(self, cfg, make_site: MakeSite, first_site: int, change: BranchChange | None = None):
        super().__init__(cfg)
        self._connect(make_site, first_site, ENCODER_SITES, change, cfg.encoder.layers)

    def forward(self, state, encoder_padding_mask: Tensor | None, attn_mask: Tensor | None = None):
        def self_attention(h):
            mask = attn_mask  # fairseq's fill, by the dtype of the stream (the state may be no tensor)
            if mask is not None:
                mask = mask.masked_fill(mask.to(torch.bool), -1e8 if h.dtype == torch.float32 else -1e4)
            return self._self_attention(h, encoder_padding_mask, mask)

        state = self.hc[0](state, self.changed("self_attn", self_attention))
        return self.hc[1](state, self.changed("ffn", self._ffn))


class CarryDecoderLayer(_Sublayers, TransformerDecoderLayerBase):
    """fairseq's Pre-LN decoder layer on a carry's state: sites for self-attention, cross-attention (unless
    ``no_encoder_attn``) and FFN, from ``first_site`` on. Returns (state, cross-attention weights or None, None).
    Without cross-self-attention (refused by axes/aggregation.py) and the NormFormer scalings (not options of the
    translation transformer)."""

    def __init__(self, cfg, make_site: MakeSite, first_site: int, no_encoder_attn: bool = False,
                 change: BranchChange | None = None):  # fmt: skip
        super().__init__(cfg, no_encoder_attn)
        names = ("self_attn", "ffn") if self.encoder_attn is None else DECODER_SITES
        self._connect(make_site, first_site, names, change, cfg.decoder.layers)

    def forward(
        self,
        state,
        encoder_out: Tensor | None = None,
        encoder_padding_mask: Tensor | None = None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None = None,
        self_attn_mask: Tensor | None = None,
        self_attn_padding_mask: Tensor | None = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        need_attn = need_attn or need_head_weights
        attn: list[Tensor | None] = [None]

        def cross_attention(h):
            h, attn[0] = self.encoder_attn(
                query=self.encoder_attn_layer_norm(h), key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )  # fmt: skip
            return self.dropout_module(h)

        state = self.hc[0](state, self.changed("self_attn", lambda h: self._self_attention(
            h, self_attn_padding_mask, self_attn_mask, incremental_state)))  # fmt: skip
        if self.encoder_attn is not None and encoder_out is not None:
            state = self.hc[1](state, self.changed("encoder_attn", cross_attention))
        return self.hc[-1](state, self.changed("ffn", self._ffn)), attn[0], None


def _built(stack: nn.Module) -> int:
    """The index of the layer fairseq's __init__ is building (its build_*_layer hook gets none): the count so far."""
    index = stack.__dict__.get("_layers_built", 0)
    stack.__dict__["_layers_built"] = index + 1
    return index


def _attach(stack: nn.Module, carry: Carry, embed_dim: int) -> None:
    """After fairseq's __init__ built the layers: the format version, then the carry's stack-level modules."""
    stack.__dict__.pop("_layers_built", None)
    if carry.torchscript_unsupported_reason is not None:
        stack.torchscript_unsupported_reason = carry.torchscript_unsupported_reason
    if carry.version is not None:
        add_format_version(stack, carry.version)
    for name, module in carry.stack_modules(embed_dim, stack.sites, len(stack.layers)).items():
        stack.add_module(name, module)


class CarryEncoder(LayerStackEncoder):
    """fairseq's encoder threading ``carry``'s state through its layers (layer_stack.py's loop): the residual
    axis's layers when built by ``build_with_layers`` (a between-layer idea), else the carry's own layers
    (``encoder_layer``), else CarryEncoderLayers on the carry's sites, their branches changed by ``change``
    (a residual choice's, site_layers.BranchChange) if given."""

    def __init__(self, cfg, dictionary, embed_tokens, carry: Carry, change: BranchChange | None = None):
        # read by build_encoder_layer, which fairseq's __init__ calls
        self.carry, self.sites, self.change = carry, 0, change
        super().__init__(cfg, dictionary, embed_tokens)
        _attach(self, carry, cfg.encoder.embed_dim)

    def build_encoder_layer(self, cfg):
        if "_make_layer" in self.__dict__:  # set by build_with_layers
            return super().build_encoder_layer(cfg)
        layer = self.carry.encoder_layer(cfg, _built(self))
        if layer is None:
            layer = CarryEncoderLayer(cfg, self.carry.site, self.sites, self.change)
            self.sites += len(layer.hc)
        elif self.change is not None:  # the carry's own layers (DCA, MUDD) apply it themselves (ChangedBranches)
            self.change.attach(layer, ENCODER_SITES, cfg.encoder.embed_dim, cfg.encoder.layers)
        return wrap_layer(layer, cfg)

    def begin_layers(self, x):
        return self.carry.begin(self, x)

    def run_layer(self, idx, layer, x, state, padding_mask):
        y = self.carry.call_layer(self, idx, layer, x, state, encoder_padding_mask=padding_mask)
        return self.carry.after_layer(self, idx, x, y, state)

    def end_layers(self, x, state):
        return self.carry.output(self, x, state)


class CarryDecoder(LayerStackDecoder):
    """fairseq's decoder threading ``carry``'s state through its layers (layer_stack.py's loop), as
    CarryEncoder."""

    def __init__(self, cfg, dictionary, embed_tokens, carry: Carry, change: BranchChange | None = None,
                 no_encoder_attn=False):  # fmt: skip
        self.carry, self.sites, self.change = carry, 0, change
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        _attach(self, carry, cfg.decoder.embed_dim)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        if "_make_layer" in self.__dict__:  # set by build_with_layers
            return super().build_decoder_layer(cfg, no_encoder_attn)
        layer = self.carry.decoder_layer(cfg, _built(self), no_encoder_attn)
        if layer is None:
            layer = CarryDecoderLayer(cfg, self.carry.site, self.sites, no_encoder_attn, self.change)
            self.sites += len(layer.hc)
        elif self.change is not None:
            names = ("self_attn", "ffn") if layer.encoder_attn is None else DECODER_SITES
            self.change.attach(layer, names, cfg.decoder.embed_dim, cfg.decoder.layers)
        return wrap_layer(layer, cfg)

    def begin_layers(self, x):
        return self.carry.begin(self, x)

    def run_layer(self, idx, layer, x, state, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        y, attn, _ = self.carry.call_layer(
            self, idx, layer, x, state, encoder_out=encoder_out, encoder_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
        )  # fmt: skip
        return *self.carry.after_layer(self, idx, x, y, state), attn

    def end_layers(self, x, state):
        return self.carry.output(self, x, state)
