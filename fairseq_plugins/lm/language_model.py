"""``{family}_lm``: every family of the plugin as a decoder-only language model for fairseq's
``language_modeling`` task (``fairseq-train --task language_modeling``, ``fairseq-eval-lm``, sampling and beam
search through fairseq's ``SequenceGenerator`` and ``TransformerLanguageModel.from_pretrained(...).sample``).

A ``PluginLanguageModel`` is fairseq's ``TransformerLanguageModel`` whose decoder is the family's own
translation decoder built without cross-attention (decoder_only.py): the same layers, layer loop, options,
checks and initialisation as the translation model's decoder, so an idea trained as an LM is the idea the
translation model uses. Its state dict has fairseq's LM layout (``decoder.*``).

Options: fairseq's ``transformer_lm`` options plus the family's own (``--dca-mode``, ``--hc-rate``, ...), with
the translation-only ones left out (encoder, source positions, shared source/target embeddings,
cross-attention); defaults come from the family as for translation, except that the LM's embedding,
adaptive input/softmax and ``--add-bos-token`` follow ``transformer_lm``. fairseq's ``base_lm_architecture``
forces Pre-LN ("training is not stable without this"); here the family decides, so the Post-LN families
(DeepNet, Admin, B2T, T-Fixup, ResiDual, ``transformer_postln``) stay what they are.

Model-level methods a family has beyond its decoder are the family model's own, called on the object that
built the decoder (it holds the LM's decoder): Crossformer-SG's ``guidance_loss`` (the criterion
``label_smoothed_cross_entropy_with_guidance`` reads it) and Admin's ``profile_admin`` (run on the first
training batch, recorded in the ``admin_profiled`` buffer of the LM's state dict, as the translation model does).
"""

from contextlib import ExitStack

import torch
from fairseq import options
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_REGISTRY, register_model
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
)
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder
from omegaconf import OmegaConf, open_dict

from ..validation import PluginOptionError
from .decoder_only import build_decoder_only

# translation options a decoder-only model never reads (besides every encoder_* option)
TRANSLATION_ONLY = frozenset({
    "share_all_embeddings", "merge_src_tgt_embed", "no_cross_attention", "cross_self_attention",
    "max_source_positions", "decoder_embed_path", "layer_wise_attention",
})  # fmt: skip
# the decoder's shape, which the (unused) encoder options mirror so that formulas reading N read M
MIRRORED = ("layers", "embed_dim", "ffn_embed_dim", "attention_heads")


class _LMOptions:
    """Passes ``add_argument`` on to the LM's parser, once per option, leaving out translation-only ones."""

    def __init__(self, parser):
        self.parser, self.dests = parser, set()

    def add_argument(self, *names, **kwargs):
        dest = kwargs.get("dest") or next(n for n in names if n.startswith("--"))[2:].replace("-", "_")
        if dest in self.dests or dest.startswith("encoder_") or dest in TRANSLATION_ONLY:
            return None
        self.dests.add(dest)
        return self.parser.add_argument(*names, **kwargs)


def family_architecture(args, translation_arch: str) -> None:
    """Fill the LM's defaults: the family's (through its translation preset ``translation_arch``, whose
    shape defaults the LM's arch has already overridden), then ``transformer_lm``'s for the LM-only fields."""
    for name in MIRRORED:
        setattr(args, f"encoder_{name}", getattr(args, f"decoder_{name}", None))
    args.no_cross_attention = True
    args.share_all_embeddings = False
    ARCH_CONFIG_REGISTRY[translation_arch](args)
    pre_ln = args.decoder_normalize_before
    base_lm_architecture(args)
    args.decoder_normalize_before = pre_ln  # base_lm_architecture forces Pre-LN; the family decides


class PluginLanguageModel(TransformerLanguageModel):
    """fairseq's TransformerLanguageModel with a plugin family's decoder (see the module docstring)."""

    family = ""  # set per registered subclass (make_language_model)
    translation_model = ""  # the registered translation model whose decoder this LM uses
    translation_arch = ""  # a translation preset of the family: its settings are the LM's

    def __init__(self, decoder, args=None, family_model=None):
        super().__init__(decoder)
        self.args = args
        # not a submodule: its only weights are this decoder's, saved once under decoder.*
        object.__setattr__(self, "family_model", family_model)
        # Admin's model registers the flag that it has profiled; a model without it has nothing to profile
        self.profiles_admin = hasattr(family_model, "admin_profiled") and callable(getattr(family_model, "profile_admin", None))
        if self.profiles_admin:
            self.register_buffer("admin_profiled", torch.zeros((), dtype=torch.bool))

    @classmethod
    def add_args(cls, parser):
        lm_parser = _LMOptions(parser)
        MODEL_REGISTRY[cls.translation_model].add_args(lm_parser)  # the family's options win over the LM's
        gen_parser_from_dataclass(lm_parser, TransformerLanguageModelConfig(), delete_default=True)

    @classmethod
    def build_model(cls, args, task):
        if getattr(args, "decoder_layers_to_keep", None):
            # the families prune through their translation model's bookkeeping (encoder and decoder), which a
            # decoder-only model does not have yet; refuse rather than fail deep inside a family
            raise PluginOptionError(
                f"--decoder-layers-to-keep cannot be used with the plugin's language models ({cls.family}_lm) yet: "
                "train or evaluate the full stack"
            )
        with open_dict(args) if OmegaConf.is_config(args) else ExitStack():
            family_architecture(args, cls.translation_arch)
            if getattr(args, "max_target_positions", None) is None:
                args.max_target_positions = getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
            build = build_decoder_only(cls.translation_model, args, task, cls.build_lm_embedding(args, task))
        return cls(build.decoder, args, build.model)

    # Copied from fairseq 0.12.3 TransformerLanguageModel.build_model (the embedding part); changed: the two cutoffs
    # are compared as lists (the translation options parse --adaptive-softmax-cutoff into one, the LM's keep a string)
    @classmethod
    def build_lm_embedding(cls, args, task):
        if args.character_embeddings:
            embed_tokens = CharacterTokenEmbedder(
                task.source_dictionary, eval(args.character_filters), args.character_embedding_dim,
                args.decoder_embed_dim, args.char_embedder_highway_layers,
            )  # fmt: skip
        elif args.adaptive_input:
            embed_tokens = AdaptiveInput(
                len(task.source_dictionary), task.source_dictionary.pad(), args.decoder_input_dim,
                args.adaptive_input_factor, args.decoder_embed_dim,
                options.eval_str_list(args.adaptive_input_cutoff, type=int), args.quant_noise_pq,
                args.quant_noise_pq_block_size,
            )  # fmt: skip
        else:
            embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        if args.tie_adaptive_weights:
            assert args.adaptive_input
            assert args.adaptive_input_factor == args.adaptive_softmax_factor
            softmax_cutoff, input_cutoff = (
                options.eval_str_list(c, type=int) for c in (args.adaptive_softmax_cutoff, args.adaptive_input_cutoff)
            )
            assert softmax_cutoff == input_cutoff, f"{softmax_cutoff} != {input_cutoff}"
            assert args.decoder_input_dim == args.decoder_output_dim
        return embed_tokens

    def forward(self, src_tokens, src_lengths=None, **kwargs):
        """Args: src_tokens `(batch, seq_len)`. Returns the decoder's (logits `(batch, seq_len, vocab)`, extras)."""
        if self.profiles_admin and self.training and not bool(self.admin_profiled):
            # Admin's profiling pass is the family's own forward; with NoEncoder it runs this decoder alone
            self.family_model.profile_admin(src_tokens, src_lengths, src_tokens)
            self.admin_profiled.fill_(True)
        return self.decoder(src_tokens, src_lengths=src_lengths, **kwargs)


def _guidance_loss(self) -> torch.Tensor:
    """The family's regularizer over the decoder's layer pairs (Crossformer-SG's L_reg, eq. 1)."""
    return self.family_model.guidance_loss()


def make_language_model(family: str, translation_model: str, translation_arch: str) -> type:
    """Register ``{family}_lm``: a PluginLanguageModel whose decoder is ``translation_model``'s."""
    attrs = {
        "family": family,
        "translation_model": translation_model,
        "translation_arch": translation_arch,
        "__doc__": f"{family} as a decoder-only LM: the decoder of ``{translation_model}`` without cross-attention.",
        "__module__": __name__,
    }
    if callable(getattr(MODEL_REGISTRY[translation_model], "guidance_loss", None)):
        attrs["guidance_loss"] = _guidance_loss
    name = "".join(part.title() for part in family.split("_")) + "LanguageModel"
    return register_model(f"{family}_lm")(type(name, (PluginLanguageModel,), attrs))
