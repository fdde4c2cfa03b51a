"""DeepCrossAttention (Heddes et al., arXiv:2502.06785) in encoder and decoder: its layers and its carry
(modules/carry.py), run by the one stack of modules/carry_stack.py (``--depth-aggregation dca`` and ``dca-k``;
the ``dca_transformer`` checkpoints and presets).

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
their ``iwslt_`` widths. The options are checked by the declaration (axes/aggregation.py's ``DCA``).
"""

import torch
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from .carry import Carry
from .depth_stack import DepthStack, build_grn, effective_k, stack_entries
from .grn import GRN
from .layer_stack import FORMAT_VERSION
from .site_layers import ChangedBranches

DCA_FORMAT_VERSION = FORMAT_VERSION  # of the GRN parameters (``dca_version``), for upgrade_state_dict_named


class _ReadsStack(ChangedBranches):
    """A layer that owns its GRN(s) and reads the stack: the GRN runs inside the layer's forward, so
    activation checkpointing and FSDP wrapping (wrap_layer) cover it like every other layer weight. A residual
    choice's change of each branch (``branch_output``, site_layers.BranchChange, which states the maths) applies
    to a, c and m where they are added; without one they are the paper's."""

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
        a = self.branch_output("self_attn", self.dropout_module(a))
        x = self.residual_connection(a, q_in)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x))))
        return torch.add(a, self.branch_output("ffn", self.dropout_module(self.fc2(x))), out=out)


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
    # (refused by axes/aggregation.py's DCA) and the NormFormer scalings (not options of the translation transformer);
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
        a = self.branch_output("self_attn", self.dropout_module(a))
        x = self.residual_connection(a, q_in)
        branches, attn = a, None
        if self.encoder_attn is not None and encoder_out is not None:
            c, attn = self.encoder_attn(
                query=self.encoder_attn_layer_norm(x), key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )  # fmt: skip
            c = self.branch_output("encoder_attn", self.dropout_module(c))
            x = self.residual_connection(c, x)
            branches = branches + c
        x = self.activation_dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x))))
        return torch.add(branches, self.branch_output("ffn", self.dropout_module(self.fc2(x))), out=out), attn, None


class DCACarry(Carry):
    """DCA's carry (modules/carry.py): the state is the DepthStack G_t of the embedding and the layer outputs
    (k-DCA's form for ``k`` > 0, bounded by each stack's depth: ``effective_k``); the stack builds DCA's own
    layers, each given the GRN(s) for its position in the stack, and the stack's ``output_grn`` gives
    y = GRN(G_{T+1}), fused with the final LayerNorm."""

    version = "dca"
    torchscript_unsupported_reason = (
        "DeepCrossAttention's GRNs and depth stack run hand-written torch.autograd.Function subclasses, its layers "
        "take the stack as a variable number of chunks and its layer loop carries a Python DepthStack"
    )

    def __init__(self, mode: str, k: int):
        self.mode, self.k = mode, k

    def _grn(self, embed_dim: int, index: int, layers: int) -> GRN:
        return build_grn(self.mode, embed_dim, stack_entries(index, effective_k(self.k, layers)))

    def encoder_layer(self, cfg, index: int) -> nn.Module:
        return DCAEncoderLayer(cfg, self._grn(cfg.encoder.embed_dim, index, cfg.encoder.layers))

    def decoder_layer(self, cfg, index: int, no_encoder_attn: bool) -> nn.Module:
        return DCADecoderLayer(cfg, self._grn(cfg.decoder.embed_dim, index, cfg.decoder.layers), no_encoder_attn)

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        k = effective_k(self.k, layers)
        return {"output_grn": build_grn(self.mode, embed_dim, stack_entries(layers, k), output=True)}

    def begin(self, stack: nn.Module, x: Tensor) -> DepthStack:
        return DepthStack(x, len(stack.layers), effective_k(self.k, len(stack.layers)))

    def call_layer(self, stack: nn.Module, idx: int, layer, x: Tensor, state: DepthStack, **kwargs):
        # the GRNs and the layer write into the stack's buffers (grn_out, next_slot) when decoding
        return layer(*state.chunks(), grn_out=state.grn_out(layer.grn.num_outputs), out=state.next_slot(), **kwargs)

    def after_layer(self, stack: nn.Module, idx: int, x: Tensor, y: Tensor, state: DepthStack):
        state.push(y)
        return state.last, state

    def output(self, stack: nn.Module, x: Tensor, state: DepthStack) -> Tensor:
        # y = GRN(G_{T+1}), then the final LayerNorm (fused: y is recomputed in backward, not kept)
        if stack.layer_norm is None:
            return stack.output_grn(state.chunks())[0]
        return stack.output_grn(state.chunks(), norm=stack.layer_norm, out=state.grn_out(1))[1][0]


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

