"""``dca_transformer``: DeepCrossAttention (Heddes et al., arXiv:2502.06785) in encoder and decoder.

The paper's decoder-only LM brought to encoder-decoder translation. In every encoder and decoder layer t, GRNs
read the per-token stack G_t of the embedding and the earlier layers' outputs (modules/depth_stack.py) and
produce the layer's inputs (section 3.2, figure 4; ``--dca-mode dca``):

    q_in, k_in, v_in = GRN_q(G_t), GRN_k(G_t), GRN_v(G_t)          three GRN-v3 (modules/grn.py)
    a = SelfAttn(LN(q_in), LN(k_in), LN(v_in))                      one LayerNorm for the three, Pre-LN
    h = q_in + a                                                    decoder: h = h + c, c = CrossAttn(LN(h), enc)
    m = FFN(LN(h))
    f_t = a (+ c) + m                                               the layer output pushed onto the stack
    output = LN_final(GRN_out(G_{T+1}))                             y = GRN(G_{T+1}), section 3.1

Interpretations of figure 4 for this setting:
- "the remaining skip connections ensure that the inputs are not added to the outputs of the block, but are
  included in the inputs of both the attention and the feed forward module": the skip around attention starts
  at the *query* input (the position's own stream; keys and values are context), and the block output f_t is
  the sum of its sub-block outputs without that input, so G_t 1 is exactly a residual network's stream.
- Pre-LN as in the baseline: the layer's self-attention LayerNorm normalises each of q_in, k_in, v_in (one
  module, no new parameters), so a retrofitted Pre-LN checkpoint keeps every weight where it was.
- Cross-attention (decoder only; not in the paper) sits where a Pre-LN decoder has it, on the skip path
  between self-attention and FFN; its keys and values are the encoder output, and its query reads the stream
  h, not a GRN of its own.
- The GRN-vX modes (table 7's ablation) use one GRN-vX per layer for queries, keys and values alike.

With b = 1 and w = 0 every GRN returns G_t 1 and the model computes exactly the Pre-LN transformer
(``transformer_preln_*``) with the same weights; scripts/training/retrofit_dca.py relies on it.

Incremental decoding: a stack is per position, so it is rebuilt from the current position's embedding at
every step and never cached; beam search caches only attention's keys and values, as for the baseline.
Self-attention is built with ``self_attention=False`` in encoder and decoder, because fairseq's
``self_attention=True`` projects keys and values from the query on every path but PyTorch's fused one (the
decoder's incremental path among them); the parameters are the same.

Memory: the GRN outputs are recomputed in backward rather than kept for their LayerNorm (modules/grn.py), so a
layer keeps its stack entry (and, in k-DCA, its middle sum) and three LayerNorm outputs for the q/k/v
projections where the baseline keeps its residual stream and one. fairseq's ``inner_states`` (and the encoder's
``encoder_states``) hold the layer outputs f_t, on the stack buffer's memory.

Named architectures (from the preset table): ``dca_e6d6`` ... ``dca_e36d6``, ``dca_k2_*`` (k-DCA, k = 2) and
their ``iwslt_`` widths.
"""

import torch
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from ..modules.depth_stack import (
    DCA_MODES,
    DepthStack,
    build_grn,
    effective_k,
    stack_entries,
)
from ..modules.grn import GRN
from ..modules.layer_stack import LayerStackDecoder, LayerStackEncoder, wrap_layer
from ..validation import PluginOptionError, check_choice, check_int

MODES = tuple(DCA_MODES)
MAX_DCA_K = 10_000  # parse-time bound only; build_model bounds k by the model's depth
DCA_FORMAT_VERSION = 1.0  # of the GRN parameters, for upgrade_state_dict_named should their layout change


class _ReadsStack:
    """A layer that owns its GRN(s) and reads the stack: the GRN runs inside the layer's forward, so
    activation checkpointing and FSDP wrapping (wrap_layer) cover it like every other layer weight."""

    grn: GRN

    def read_stack(self, chunks: tuple[Tensor, ...], grn_out=None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(q_in, query, key, value), each `(seq_len, batch, embed_dim)`: the query's GRN output (the skip
        connection's start) and the self-attention LayerNorm of the three GRN outputs (of the one GRN output
        in the GRN-vX modes). The GRN outputs themselves are recomputed in backward, not kept (grn.py).
        grn_out: where the GRN may write them when decoding (DepthStack.grn_out)."""
        q_in, h = self.grn(list(chunks), norm=self.self_attn_layer_norm, out=grn_out)
        query, key, value = h.unbind(0) if h.size(0) == 3 else (h[0], h[0], h[0])
        return q_in, query, key, value


class DCAEncoderLayer(_ReadsStack, TransformerEncoderLayerBase):
    """fairseq's Pre-LN encoder layer fed by its GRN(s) from the stack; returns its output without its input.

    Args of forward:
        *chunks: the stack, chunks of shape `(entries, seq_len, batch, embed_dim)` (DepthStack.chunks()).
        grn_out, out: when decoding, where the GRNs and the layer may write their results (DepthStack.grn_out,
            DepthStack.next_slot), which saves an allocation and a copy per layer and step; None otherwise.
    Returns:
        f: `(seq_len, batch, embed_dim)`, the sum of the attention and FFN outputs.
    """

    def __init__(self, cfg, grn: GRN):
        super().__init__(cfg)
        self.grn = grn

    def build_self_attention(self, embed_dim, cfg):
        # fairseq's version with self_attention=False: with True, every path but PyTorch's fused one (TorchScript,
        # ONNX export, pruned heads) projects keys and values from the query and would ignore GRN_k and GRN_v
        return MultiheadAttention(
            embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout, self_attention=False,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )  # fmt: skip

    # Copied from fairseq 0.12.3 TransformerEncoderLayerBase.forward, Pre-LN branch (queries, keys and values
    # get different inputs, no hook exists for that); changed: the inputs, and the output excludes the input.
    def forward(self, *chunks: Tensor, encoder_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                grn_out=None, out: Tensor | None = None):  # fmt: skip
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if chunks[0].dtype == torch.float32 else -1e4)
        q_in, query, key, value = self.read_stack(chunks, grn_out)
        a, _ = self.self_attn(
            query=query, key=key, value=value, key_padding_mask=encoder_padding_mask, need_weights=False,
            attn_mask=attn_mask,
        )  # fmt: skip
        a = self.dropout_module(a)
        x = self.residual_connection(a, q_in)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x))))
        return torch.add(a, self.dropout_module(self.fc2(x)), out=out)


class DCADecoderLayer(_ReadsStack, TransformerDecoderLayerBase):
    """fairseq's Pre-LN decoder layer fed by its GRN(s); returns (f, attn, None), f its output without its input."""

    def __init__(self, cfg, grn: GRN, no_encoder_attn: bool = False):
        super().__init__(cfg, no_encoder_attn)
        self.grn = grn

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        # fairseq's version with self_attention=False: see the module docstring (incremental decoding)
        return MultiheadAttention(
            embed_dim, cfg.decoder.attention_heads, dropout=cfg.attention_dropout, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn, self_attention=False, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size, xformers_att_config=cfg.decoder.xformers_att_config,
        )  # fmt: skip

    # Copied from fairseq 0.12.3 TransformerDecoderLayerBase.forward, Pre-LN branch, without cross-self-attention
    # (rejected in check_dca_args) and the NormFormer scalings (not options of the translation transformer);
    # changed: the inputs, and the output excludes the input.
    def forward(
        self,
        *chunks: Tensor,
        encoder_out: Tensor | None = None,
        encoder_padding_mask: Tensor | None = None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None = None,
        self_attn_mask: Tensor | None = None,
        self_attn_padding_mask: Tensor | None = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        grn_out=None,
        out: Tensor | None = None,
    ):
        if need_head_weights:
            need_attn = True
        q_in, query, key, value = self.read_stack(chunks, grn_out)
        a, _ = self.self_attn(
            query=query, key=key, value=value, key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
        )  # fmt: skip
        a = self.dropout_module(a)
        x = self.residual_connection(a, q_in)
        branches, attn = a, None
        if self.encoder_attn is not None and encoder_out is not None:
            c, attn = self.encoder_attn(
                query=self.encoder_attn_layer_norm(x), key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )  # fmt: skip
            c = self.dropout_module(c)
            x = self.residual_connection(c, x)
            branches = branches + c
        x = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x))))
        return torch.add(branches, self.dropout_module(self.fc2(x)), out=out), attn, None


class _DCAStack:
    """What DCA's encoder and decoder share: GRN sizes by layer, the output GRN and the stack's life cycle.

    ``_init_dca`` runs before the fairseq base ``__init__``, whose ``build_*_layer`` hook is then called once
    per layer, in order, and gives each layer the GRN for its position in the stack (no layer index is passed
    to the hook, see FAIRSEQ_NOTES).
    """

    torchscript_unsupported_reason = (
        "DeepCrossAttention's GRNs and depth stack run hand-written torch.autograd.Function subclasses, its layers "
        "take the stack as a variable number of chunks and its layer loop carries a Python DepthStack"
    )

    def _init_dca(self, mode: str, k: int, num_layers: int) -> None:
        self.dca_mode, self.dca_k, self._dca_layers_built = mode, effective_k(k, num_layers), 0

    def _next_layer_grn(self, embed_dim: int) -> GRN:
        t, self._dca_layers_built = self._dca_layers_built, self._dca_layers_built + 1
        return build_grn(self.dca_mode, embed_dim, stack_entries(t, self.dca_k))

    def _finish_dca(self, embed_dim: int, num_layers: int) -> None:
        self.output_grn = build_grn(self.dca_mode, embed_dim, stack_entries(num_layers, self.dca_k), output=True)
        self.register_buffer("dca_version", torch.tensor([DCA_FORMAT_VERSION]))

    def begin_layers(self, x):
        return DepthStack(x, len(self.layers), self.dca_k)

    def end_layers(self, x, stack: DepthStack):
        # y = GRN(G_{T+1}), then the final LayerNorm (fused: y is recomputed in backward, not kept)
        if self.layer_norm is None:
            return self.output_grn(stack.chunks())[0]
        return self.output_grn(stack.chunks(), norm=self.layer_norm, out=stack.grn_out(1))[1][0]


class DCAEncoder(_DCAStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, dca_mode: str, dca_k: int):
        self._init_dca(dca_mode, dca_k, cfg.encoder.layers)
        super().__init__(cfg, dictionary, embed_tokens)
        self._finish_dca(cfg.encoder.embed_dim, cfg.encoder.layers)

    def build_encoder_layer(self, cfg):
        return wrap_layer(DCAEncoderLayer(cfg, self._next_layer_grn(cfg.encoder.embed_dim)), cfg)

    def run_layer(self, idx, layer, x, stack: DepthStack, padding_mask):
        grn_out, out = stack.grn_out(layer.grn.num_outputs), stack.next_slot()
        stack.push(layer(*stack.chunks(), encoder_padding_mask=padding_mask, grn_out=grn_out, out=out))
        return stack.last, stack


class DCADecoder(_DCAStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, dca_mode: str, dca_k: int, no_encoder_attn=False):
        self._init_dca(dca_mode, dca_k, cfg.decoder.layers)
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self._finish_dca(cfg.decoder.embed_dim, cfg.decoder.layers)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(DCADecoderLayer(cfg, self._next_layer_grn(cfg.decoder.embed_dim), no_encoder_attn), cfg)

    def run_layer(self, idx, layer, x, stack: DepthStack, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        f, attn, _ = layer(
            *stack.chunks(), encoder_out=encoder_out, encoder_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
            grn_out=stack.grn_out(layer.grn.num_outputs), out=stack.next_slot(),
        )  # fmt: skip
        stack.push(f)
        return stack.last, stack, attn


def check_dca_args(args) -> None:
    """Reject options outside their range or that DCA's layers do not implement, naming them."""
    args.dca_mode = check_choice("dca_mode", args.dca_mode, MODES)
    depth = max(args.encoder_layers, args.decoder_layers)
    try:
        args.dca_k = check_int("dca_k", args.dca_k, 0, depth)
    except PluginOptionError as err:
        raise PluginOptionError(
            f"{err} (0 keeps every layer output; k = the number of layers already does, so larger k is "
            f"rejected; the deeper side has {depth} layers)"
        ) from None
    for side in ("encoder", "decoder"):
        if not getattr(args, f"{side}_normalize_before", False):
            raise PluginOptionError(
                f"dca_transformer needs --{side}-normalize-before: DCA is built on Pre-LN layers "
                "(the GRNs replace the Pre-LN residual stream)"
            )
        if (getattr(args, f"{side}_layerdrop", 0) or 0) != 0 or getattr(args, f"{side}_layers_to_keep", None):
            raise PluginOptionError(
                f"--{side}-layerdrop and --{side}-layers-to-keep cannot be used with dca_transformer: every "
                "layer owns GRNs sized by its position in the stack"
            )
    if getattr(args, "cross_self_attention", False):
        raise PluginOptionError("--cross-self-attention cannot be used with dca_transformer")


def initial_dca_state(args) -> dict[str, Tensor]:
    """The entries a ``dca_transformer`` with ``args`` adds to a Pre-LN transformer's state dict, at their
    initial values (b = 1, w = 0: the model then computes the Pre-LN transformer), under the same names."""
    state = {}
    for side in ("encoder", "decoder"):
        dim, layers = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_layers")
        k = effective_k(args.dca_k, layers)
        grns = {f"layers.{t}.grn": build_grn(args.dca_mode, dim, stack_entries(t, k)) for t in range(layers)}
        grns["output_grn"] = build_grn(args.dca_mode, dim, stack_entries(layers, k), output=True)
        for prefix, grn in grns.items():
            state.update({f"{side}.{prefix}.{name}": value for name, value in grn.state_dict().items()})
        state[f"{side}.dca_version"] = torch.tensor([DCA_FORMAT_VERSION])
    return state

