"""The layer loop shared by every family that threads state *between* layers.

fairseq's encoder and decoder run ``for layer in self.layers: x = layer(x, ...)`` inside
``forward_scriptable`` / ``extract_features_scriptable`` and have no hook there. ResiDual (a second,
dual residual stream) and DeepCrossAttention (a stack of earlier layer outputs) both need one, so the two
loops are copied here once, with three hooks a family overrides:

    carry = begin_layers(x)                      # after the embedding, x: (seq_len, batch, embed_dim)
    x, carry = run_layer(idx, layer, x, carry, ...)   # once per layer
    x = end_layers(x, carry)                     # replaces fairseq's final LayerNorm

With the defaults (no carry, final LayerNorm if present) the loops compute exactly what fairseq's do.
Families whose layers only change *inside* a layer (Crossformer) do not need this module. The ideas whose carry
is one small object behind one interface (hyper-connections, mHC, frac-connections, AttnRes, DCA, MUDD,
DenseFormer, DLCL, LAuReL: modules/carry.py) share one encoder and one decoder on this loop
(modules/carry_stack.py); ResiDual keeps its own pair (modules/dual_residual.py), which TorchScript compiles.

It lives in ``modules/`` (not ``models/``) so that the axes, which build the stacks, import it without importing
the registered models (imports run models -> axes -> modules -> kernels).

TorchScript (``torch.jit.script`` of the model or of fairseq's ``SequenceGenerator``) compiles the loop
with the family's hooks. A family opts in with ``torchscript = True`` once its hooks compile (annotate
``layer`` with the layer class and call ``layer.forward`` under ``torch.jit.is_scripting()``; TorchScript
cannot call a module passed as an argument); until then scripting stops at once with
``TorchScriptUnsupportedError`` naming the class, instead of a compiler error deep inside the hooks.
"""

from typing import Any

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor, nn

FORMAT_VERSION = 1.0


def add_format_version(stack: nn.Module, family: str) -> None:
    """Record the layout version of a layer-stack family's added weights (DenseFormer, DLCL, LAuReL, the carries of
    carry_stack.py) in the encoder's or decoder's state dict, as ``{family}_version``, read by
    ``upgrade_state_dict_named`` should that layout ever change."""
    stack.register_buffer(f"{family}_version", torch.tensor([FORMAT_VERSION]))


class TorchScriptUnsupportedError(RuntimeError):
    """``torch.jit.script`` was asked to compile a model whose layer loop is not scriptable."""


def _refuse_unless_scriptable(module: torch.nn.Module) -> torch.nn.Module:
    """``__prepare_scriptable__``: torch.jit.script calls it on every module before compiling."""
    if not module.torchscript:
        raise TorchScriptUnsupportedError(
            f"{type(module).__name__} cannot be exported with TorchScript (torch.jit.script): "
            f"{module.torchscript_unsupported_reason}. Translate with the eager model "
            "(fairseq-generate, fairseq-interactive, from_pretrained); see docs/layer_pruning_torchscript.md"
        )
    return module


def build_with_layers(cls, make_layer, *args, **kwargs):
    """``cls(*args, **kwargs)`` whose ``build_*_layer`` hook builds each layer with ``make_layer``.

    fairseq's encoder and decoder build their layers inside ``__init__`` through that hook, with no layer
    factory argument; the factory is set on the new object before ``__init__`` runs (as fairseq's own
    examples set what a hook needs before ``super().__init__()``), so no family's constructor changes.
    ``make_layer(cfg)`` for an encoder, ``make_layer(cfg, no_encoder_attn)`` for a decoder.
    """
    stack = cls.__new__(cls)
    object.__setattr__(stack, "_make_layer", make_layer)
    stack.__init__(*args, **kwargs)
    object.__delattr__(stack, "_make_layer")
    return stack


def wrap_layer(layer: torch.nn.Module, cfg) -> torch.nn.Module:
    """Apply the activation-checkpoint and FSDP wrapping that fairseq's ``build_*_layer`` applies."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # like fairseq: a checkpointed layer is always FSDP-wrapped, whatever its size
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class FactoryEncoder(TransformerEncoderBase):
    """fairseq's encoder, loop and all, whose layers come from ``build_with_layers``' factory."""

    def build_encoder_layer(self, cfg):
        return wrap_layer(self.__dict__["_make_layer"](cfg), cfg)


class FactoryDecoder(TransformerDecoderBase):
    """fairseq's decoder, loop and all, whose layers come from ``build_with_layers``' factory."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(self.__dict__["_make_layer"](cfg, no_encoder_attn), cfg)


class LayerStackEncoder(TransformerEncoderBase):
    """A fairseq encoder whose layer loop threads a family-specific ``carry`` between layers."""

    torchscript = False  # a family sets True once its hooks compile (module docstring)
    torchscript_unsupported_reason = "its layer loop threads state through hooks TorchScript cannot compile"
    __prepare_scriptable__ = _refuse_unless_scriptable

    def build_encoder_layer(self, cfg):
        make_layer = self.__dict__.get("_make_layer")  # set by build_with_layers
        return super().build_encoder_layer(cfg) if make_layer is None else wrap_layer(make_layer(cfg), cfg)

    def begin_layers(self, x: Tensor) -> Any:
        """Return the initial carry from the embedding output x: (src_len, batch, embed_dim)."""
        return None

    def run_layer(
        self, idx: int, layer, x: Tensor, carry: Any, padding_mask: Tensor | None
    ) -> tuple[Tensor, Any]:
        """Run layer ``idx``; return its output and the updated carry."""
        return layer(x, encoder_padding_mask=padding_mask), carry

    def end_layers(self, x: Tensor, carry: Any) -> Tensor:
        """Turn the last layer's output and the carry into the encoder output."""
        return self.layer_norm(x) if self.layer_norm is not None else x

    # Copied from fairseq 0.12.3 TransformerEncoderBase.forward_scriptable (no hook exists for the loop);
    # changed: the three hooks above, and no TorchScript / return_fc branches.
    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Tensor | None = None,
        return_all_hiddens: bool = False,
        token_embeddings: Tensor | None = None,
    ):
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = encoder_padding_mask.any()

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states: list[Tensor] = []
        if return_all_hiddens:
            encoder_states.append(x)

        layer_padding_mask = encoder_padding_mask if has_pads else None
        carry = self.begin_layers(x)
        for idx, layer in enumerate(self.layers):
            x, carry = self.run_layer(idx, layer, x, carry, layer_padding_mask)
            if return_all_hiddens:
                encoder_states.append(x)
        x = self.end_layers(x, carry)

        src_lengths = (
            src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        )
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class LayerStackDecoder(TransformerDecoderBase):
    """A fairseq decoder whose layer loop threads a family-specific ``carry`` between layers.

    In incremental decoding the loop sees only the newest target position, so a carry that is computed
    position by position (as both ResiDual's and DCA's are) needs no cache of its own.
    """

    torchscript = False
    torchscript_unsupported_reason = "its layer loop threads state through hooks TorchScript cannot compile"
    __prepare_scriptable__ = _refuse_unless_scriptable

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        make_layer = self.__dict__.get("_make_layer")  # set by build_with_layers
        if make_layer is None:
            return super().build_decoder_layer(cfg, no_encoder_attn)
        return wrap_layer(make_layer(cfg, no_encoder_attn), cfg)

    def begin_layers(self, x: Tensor) -> Any:
        """Return the initial carry from the embedding output x: (tgt_len, batch, embed_dim)."""
        return None

    def run_layer(
        self,
        idx: int,
        layer,
        x: Tensor,
        carry: Any,
        encoder_out: Tensor | None,
        encoder_padding_mask: Tensor | None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None,
        self_attn_mask: Tensor | None,
        self_attn_padding_mask: Tensor | None,
        need_attn: bool,
    ) -> tuple[Tensor, Any, Tensor | None]:
        """Run layer ``idx``; return its output, the updated carry and its attention (or None)."""
        x, attn, _ = layer(
            x,
            encoder_out,
            encoder_padding_mask,
            incremental_state,
            self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask,
            need_attn=need_attn,
            need_head_weights=need_attn,
        )
        return x, carry, attn

    def end_layers(self, x: Tensor, carry: Any) -> Tensor:
        """Turn the last layer's output and the carry into the decoder features."""
        return self.layer_norm(x) if self.layer_norm is not None else x

    # Copied from fairseq 0.12.3 TransformerDecoderBase.extract_features_scriptable (no hook exists for
    # the loop); changed: the three hooks above.
    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: dict[str, list[Tensor]] | None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None = None,
        full_context_alignment: bool = False,
        alignment_layer: int | None = None,
        alignment_heads: int | None = None,
    ):
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        enc: Tensor | None = None
        padding_mask: Tensor | None = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)

        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]

        prev_output_tokens = prev_output_tokens.contiguous()
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        self_attn_padding_mask: Tensor | None = None
        if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Tensor | None = None
        inner_states: list[Tensor | None] = [x]
        carry = self.begin_layers(x)
        for idx, layer in enumerate(self.layers):
            if incremental_state is None and not full_context_alignment:
                self_attn_mask = self.buffered_future_mask(x)
            else:
                self_attn_mask = None
            x, carry, layer_attn = self.run_layer(
                idx,
                layer,
                x,
                carry,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask,
                self_attn_padding_mask,
                need_attn=idx == alignment_layer,
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads

        x = self.end_layers(x, carry)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}
