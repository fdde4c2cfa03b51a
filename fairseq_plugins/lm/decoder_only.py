"""A family's decoder without cross-attention, built by the family's own translation model class.

Every family of the plugin is an encoder-decoder ``TransformerModel`` subclass whose ``build_model`` applies
its defaults and checks, builds the encoder and the decoder through ``build_encoder`` / ``build_decoder``
and, for the initialisation methods (DeepNet, T-Fixup, B2T, Admin), re-initialises the built layers. A
language model needs exactly that decoder with ``no_cross_attention`` set. ``build_decoder_only`` runs the
family's ``build_model`` unchanged on a subclass of the family's class that overrides two hooks:

- ``build_encoder`` returns ``NoEncoder``: no layers, no weights, and ``None`` as its output, so the decoder
  runs with ``encoder_out=None`` exactly as an LM's decoder does;
- ``build_embedding`` returns the LM's own token embedding (plain, adaptive input or character CNN, as
  fairseq's ``transformer_lm``), for the decoder and the encoder alike, so the family's init sees one shared
  table (T-Fixup scales it once) and no second table is ever allocated.

The family's model object is kept (``FamilyBuild.model``) for the model-level methods a family has beyond its
decoder (Crossformer-SG's ``guidance_loss``, Admin's ``profile_admin``); it holds the LM's decoder itself.

Depths: formulas written for N encoder and M decoder layers read N = M (the LM's arch sets the encoder
options to the decoder's). Where the paper gives a decoder-only constant of its own, an adaptation below
replaces the encoder-decoder one on the built decoder (``ADAPTATIONS``, keyed by the layer class, so it holds
for any model class that builds those layers).
"""

from dataclasses import dataclass
from typing import Any

from fairseq.models import MODEL_REGISTRY, FairseqEncoder
from torch import nn

from ..modules import residual_wiring as rw


class NoEncoder(FairseqEncoder):
    """The encoder of a decoder-only model: no layers, output ``None`` (the decoder skips cross-attention).

    ``embed_tokens`` is the decoder's own table (the same module), kept because some families' init reads
    ``model.encoder.embed_tokens``; the language model never registers this encoder, so nothing is saved twice.
    """

    def __init__(self, dictionary, embed_tokens):
        super().__init__(dictionary)
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList()

    def forward(self, src_tokens, src_lengths=None, **kwargs):
        return None

    def reorder_encoder_out(self, encoder_out, new_order):
        return encoder_out


# ---------------------------------------------------------------------------------------------------
# Adaptations: where the paper gives a decoder-only form that differs from its encoder-decoder decoder


def deepnet_decoder_only_constants(decoder_layers: int) -> dict[str, float]:
    """DeepNet's decoder-only row (arXiv:2203.00555, figure 2's table; torchscale's decoder without an
    encoder): alpha = (2M)^(1/4), beta = (8M)^(-1/4); torchscale divides by (8M)^(1/4)."""
    m = decoder_layers
    return {"alpha": (2 * m) ** (1 / 4), "beta": (8 * m) ** (-1 / 4), "torchscale_scale": (8 * m) ** (1 / 4)}


def deepnet_decoder_only_(decoder, args) -> None:
    """DeepNorm with the decoder-only constants: an encoder-decoder decoder has three sublayers per layer
    (hence 3M and 12M), a decoder-only one two (2M and 8M). Applied to the built layers (their alpha, then
    the family's init again with the decoder-only beta), so it holds whichever model class built them."""
    layers = [layer for layer in decoder.layers if isinstance(layer, rw.DeepNetDecoderLayer)]
    if not layers:
        return
    constants = deepnet_decoder_only_constants(len(decoder.layers))
    for layer in layers:
        layer.alpha = constants["alpha"]
        if args.deepnet_init == "paper":
            rw.deepnet_init_(layer, constants["beta"])
        else:
            rw.torchscale_init_(layer, constants["torchscale_scale"])


# run on every decoder built for a language model; each acts only on the layers it knows
ADAPTATIONS = (deepnet_decoder_only_,)


@dataclass
class FamilyBuild:
    decoder: nn.Module
    model: Any  # the family's model object (encoder: NoEncoder), for its model-level methods


def decoder_only_class(model_name: str, embed_tokens: nn.Module) -> type:
    """The family's model class with ``NoEncoder`` and the LM's embedding."""
    family_cls = MODEL_REGISTRY[model_name]

    def build_embedding(cls, args, dictionary, embed_dim, path=None):
        return embed_tokens

    def build_encoder(cls, args, src_dict, encoder_embed_tokens):
        return NoEncoder(src_dict, encoder_embed_tokens)

    return type(
        f"DecoderOnly{family_cls.__name__}",
        (family_cls,),
        {"build_embedding": classmethod(build_embedding), "build_encoder": classmethod(build_encoder)},
    )


def build_decoder_only(model_name: str, args, task, embed_tokens: nn.Module) -> FamilyBuild:
    """Build the decoder of the family registered as ``model_name`` with cross-attention off.

    Args:
        args: the model options, with ``no_cross_attention`` set and the encoder's shape equal to the
            decoder's (``lm.presets.lm_architecture`` does both).
        task: gives ``source_dictionary`` and ``target_dictionary`` (fairseq's language_modeling task).
        embed_tokens: the LM's input embedding, used as the decoder's ``embed_tokens``.
    """
    if not getattr(args, "no_cross_attention", False):
        raise ValueError("build_decoder_only needs args.no_cross_attention (a language model's decoder)")
    model = decoder_only_class(model_name, embed_tokens).build_model(args, task)
    for adapt in ADAPTATIONS:
        adapt(model.decoder, args)
    return FamilyBuild(model.decoder, model)
