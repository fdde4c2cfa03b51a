"""``residual_transformer``: ResiDual (Pre-Post-LN) in encoder and decoder.

The equations, the authors' choices this follows and the FP16 scale are documented in
``fairseq_plugins/modules/dual_residual.py``. Named architectures: ``residual_e6d6`` ... ``residual_e36d6``
(base width) and ``residual_iwslt_*`` (the paper's IWSLT width), from the preset table.
"""

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    base_architecture,
)
from torch import Tensor

from ..modules.dual_residual import (
    DualResidualStream,
    ResiDualDecoderLayer,
    ResiDualEncoderLayer,
)
from ..precision import AutocastModel
from ..validation import PluginOptionError, argparse_type, check_float
from .layer_pruning import check_layers_to_keep
from .layer_stack import LayerStackDecoder, LayerStackEncoder, wrap_layer
from .presets import register_family


class ResiDualEncoder(LayerStackEncoder):
    torchscript = True

    def __init__(self, cfg, dictionary, embed_tokens, dual_residual_scale: float):
        super().__init__(cfg, dictionary, embed_tokens)
        self.dual_stream = DualResidualStream(
            embed_tokens.embedding_dim, dual_residual_scale, export=cfg.export
        )

    def build_encoder_layer(self, cfg):
        return wrap_layer(ResiDualEncoderLayer(cfg), cfg)

    def begin_layers(self, x):
        return self.dual_stream.start(x)

    def run_layer(self, idx: int, layer: ResiDualEncoderLayer, x, dual, padding_mask: Tensor | None):
        # TorchScript can pass a layer to a method only with its class named, and call it only by .forward
        if torch.jit.is_scripting():
            x, branch_sum = layer.forward(x, encoder_padding_mask=padding_mask)
        else:
            x, branch_sum = layer(x, encoder_padding_mask=padding_mask)
        return x, self.dual_stream.add(dual, branch_sum)

    def end_layers(self, x, dual):
        return self.dual_stream.merge(x, dual)


class ResiDualDecoder(LayerStackDecoder):
    torchscript = True

    def __init__(self, cfg, dictionary, embed_tokens, dual_residual_scale: float, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.dual_stream = DualResidualStream(
            embed_tokens.embedding_dim, dual_residual_scale, export=cfg.export
        )

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(ResiDualDecoderLayer(cfg, no_encoder_attn), cfg)

    def begin_layers(self, x):
        return self.dual_stream.start(x)

    def run_layer(
        self,
        idx: int,
        layer: ResiDualDecoderLayer,
        x,
        dual,
        encoder_out: Tensor | None,
        encoder_padding_mask: Tensor | None,
        incremental_state: dict[str, dict[str, Tensor | None]] | None,
        self_attn_mask: Tensor | None,
        self_attn_padding_mask: Tensor | None,
        need_attn: bool,
    ):
        if torch.jit.is_scripting():  # see ResiDualEncoder.run_layer
            x, branch_sum, attn, _ = layer.forward(
                x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
            )  # fmt: skip
        else:
            x, branch_sum, attn, _ = layer(
                x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
            )  # fmt: skip
        return x, self.dual_stream.add(dual, branch_sum), attn

    def end_layers(self, x, dual):
        return self.dual_stream.merge(x, dual)


def check_residual_args(args) -> None:
    """Reject options that contradict ResiDual, naming them (see README, "Options and their checks")."""
    args.dual_residual_scale = check_float("dual_residual_scale", args.dual_residual_scale, 0.0, 1.0, True)
    check_layers_to_keep(args)
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_normalize_before", False):
            raise PluginOptionError(
                f"--{side}-normalize-before cannot be used with residual_transformer: ResiDual's layers "
                "are Post-LN and its dual stream plays the Pre-LN part (use a transformer_preln_* arch "
                "for a Pre-LN model)"
            )


@register_model("residual_transformer")
class ResiDualTransformerModel(AutocastModel, TransformerModel):
    """ResiDual encoder-decoder (arXiv:2304.14802): fairseq's transformer with dual residual streams."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--dual-residual-scale",
            type=argparse_type(check_float, "dual_residual_scale", 0.0, 1.0, True),
            metavar="S",
            help="scale s of the dual residual stream, 0 < s <= 1 (default 1). The output is unchanged "
            "(LN(s*x) = LN(x)); s < 1 keeps the stream inside the FP16 range in deep models "
            "(ResiDual appendix H.3; the authors used 0.05 for fp16 OPUS-100)",
        )

    @classmethod
    def build_model(cls, args, task):
        residual_base_architecture(args)
        check_residual_args(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return ResiDualEncoder(cfg, src_dict, embed_tokens, args.dual_residual_scale)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return ResiDualDecoder(
            cfg, tgt_dict, embed_tokens, args.dual_residual_scale, no_encoder_attn=cfg.no_cross_attention
        )


@register_model_architecture("residual_transformer", "residual_transformer")
def residual_base_architecture(args):
    if getattr(args, "dual_residual_scale", None) is None:
        args.dual_residual_scale = 1.0
    base_architecture(args)


register_family("residual", "residual_transformer", residual_base_architecture)
