"""``laurel_transformer``: a Pre-LN transformer with one LAuReL connection around every layer (encoder and
decoder), variants RW, LR and PA. Equations, sources and interpretations: ``modules/laurel.py``.

The layers are fairseq's own Pre-LN layers; only the layer loop changes (layer_stack.py). PA's history of the
last k streams is per position, so incremental decoding rebuilds it at every step and caches only attention's
keys and values, as for the baseline.

Named architectures (presets.py): ``laurel_rw_*``, ``laurel_lr_*``, ``laurel_pa_*`` at every depth and both
widths.
"""

from torch import nn

from ..modules.laurel import RW_NORMS, VARIANTS, LaurelConnection
from ..validation import argparse_type, check_choice, check_int
from .layer_stack import LayerStackDecoder, LayerStackEncoder
from .pre_ln_stack import add_format_version

# r above the width is allowed (B A is then a full-rank D x D map with more parameters than it needs)
MAX_RANK = 65_536
MAX_PA_K = 64


class _LaurelStack:
    """Every layer's output y_i becomes x_{i+1} = LAuReL_i(x_i, y_i, history); the carry is the history of
    streams x_0 .. x_i that PA reads (its last k entries)."""

    laurel: nn.ModuleList

    def _init_laurel(self, num_layers: int, embed_dim: int, options: dict) -> None:
        self.laurel = nn.ModuleList(LaurelConnection(embed_dim=embed_dim, **options) for _ in range(num_layers))
        self._keep = options["pa_k"] if options["variant"] == "pa" else 1
        add_format_version(self, "laurel")

    def begin_layers(self, x):
        return [x]

    def _connect(self, idx, x, y, history):
        x = self.laurel[idx](x, y, history)
        return x, [*history, x][-self._keep :]


class LaurelEncoder(_LaurelStack, LayerStackEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, options: dict):
        super().__init__(cfg, dictionary, embed_tokens)
        self._init_laurel(cfg.encoder.layers, cfg.encoder.embed_dim, options)

    def run_layer(self, idx, layer, x, history, padding_mask):
        return self._connect(idx, x, layer(x, encoder_padding_mask=padding_mask), history)


class LaurelDecoder(_LaurelStack, LayerStackDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, options: dict, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self._init_laurel(cfg.decoder.layers, cfg.decoder.embed_dim, options)

    def run_layer(self, idx, layer, x, history, encoder_out, encoder_padding_mask, incremental_state,
                  self_attn_mask, self_attn_padding_mask, need_attn):  # fmt: skip
        y, attn, _ = layer(
            x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask, need_attn=need_attn, need_head_weights=need_attn,
    )  # fmt: skip
        return *self._connect(idx, x, y, history), attn


LAUREL_DEFAULTS = {"laurel_variant": "lr", "laurel_rank": 32, "laurel_pa_k": 3, "laurel_rw_norm": "softmax"}


def check_laurel_options(args) -> None:
    args.laurel_variant = check_choice("laurel_variant", args.laurel_variant, VARIANTS)
    args.laurel_rw_norm = check_choice("laurel_rw_norm", args.laurel_rw_norm, RW_NORMS)
    args.laurel_rank = check_int("laurel_rank", args.laurel_rank, 1, MAX_RANK)
    args.laurel_pa_k = check_int("laurel_pa_k", args.laurel_pa_k, 1, MAX_PA_K)


def laurel_options(args) -> dict:
    return {"variant": args.laurel_variant, "rank": args.laurel_rank, "pa_k": args.laurel_pa_k,
        "rw_norm": args.laurel_rw_norm}  # fmt: skip


def add_laurel_args(parser) -> None:
    parser.add_argument(
        "--laurel-variant", type=argparse_type(check_choice, "laurel_variant", VARIANTS), metavar="V",
        help="rw (learned residual weights, section 2.1), lr (low-rank B A x added to the skip, eq. 3) or "
        "pa (low-rank mix of the last k streams, eq. 4); set by the laurel_rw/lr/pa presets",
    )  # fmt: skip
    parser.add_argument(
        "--laurel-rank", type=argparse_type(check_int, "laurel_rank", 1, MAX_RANK), metavar="R",
        help="rank r of B A in lr and pa (default 32, the paper's ablation value; 4 and 64 for its 1B and "
        "4B LLMs); 1 <= R <= 65536",
    )  # fmt: skip
    parser.add_argument(
        "--laurel-pa-k", type=argparse_type(check_int, "laurel_pa_k", 1, MAX_PA_K), metavar="K",
        help=f"pa: how many streams x_i, x_{{i-1}}, ... are mixed (default 3, the paper's ablation); "
            f"1 <= K <= {MAX_PA_K}",
    )  # fmt: skip
    parser.add_argument(
        "--laurel-rw-norm", type=argparse_type(check_choice, "laurel_rw_norm", RW_NORMS), metavar="N",
        help="rw: softmax (default: (alpha, beta) = softmax of two logits from 0, i.e. 0.5/0.5; the paper, "
        "section 2.1, says the learned weights must be bounded in practice, by softmax or sigmoid) or none "
        "(alpha, beta learned directly from 1, unbounded, the Pre-LN baseline at initialisation; this "
        "plugin's default until issue 26); one of none, softmax",
    )  # fmt: skip
