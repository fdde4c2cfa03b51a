"""Axis ``--norm``: the normalisation function of every normalisation layer of the model.

fairseq builds its LayerNorms inside the layers' ``__init__`` with no hook (``LayerNorm(embed_dim,
export=...)``), and so do the plugin's modules; a choice other than ``layernorm`` therefore replaces, once the
model is built, every ``nn.LayerNorm`` of the encoder and the decoder by ``make(normalized_shape, eps)``
(``replace_norms_``), keeping the module's place, so the parameter names stay (``...layer_norm.weight``; a
norm without a bias has no ``.bias``). A new normalisation (DyT, Derf) is one nn.Module with that
constructor plus one Choice here.

    layernorm   LN(x) = (x - mean) / sqrt(var + eps) * g + b        (Ba et al. 2016; fairseq's default)
    rmsnorm     RMS(x) = x / sqrt(mean(x^2) + eps) * g              (Zhang & Sennrich 2019, arXiv:1910.07467)
    dyt         DyT(x) = g * tanh(alpha x) + b, alpha_0 0.5          (Zhu et al. 2025, arXiv:2503.10622)
    derf        Derf(x) = g * erf(alpha x + s) + b, alpha_0 by task  (Chen et al. 2025, arXiv:2512.10938)
                (--derf-alpha-init: 1.0 for a language model, 0.5 for translation, as the authors' code per task)

DyT and Derf are element-wise and bounded (|y| <= |g| + |b|), so they need no float32 region under autocast
(modules/dyt.py, modules/derf.py); they replace every LayerNorm, cross-attention's and the stack-final ones
included, as the papers replace every norm.
"""

from torch import nn

from ..modules.derf import ALPHA_INIT, DynamicErf
from ..modules.dyt import DynamicTanh
from ..validation import check_float
from .choice import KEEPS_PACE, Choice, Option, set_defaults_since


class Norm(Choice):
    axis = "norm"

    @classmethod
    def make(cls, normalized_shape, eps: float, args=None) -> nn.Module:
        """The norm replacing a LayerNorm of that shape and eps (``args``: the model's, for the choice's options)."""
        raise NotImplementedError


class LayerNorm(Norm):
    name, source = "layernorm", "LayerNorm (Ba et al. 2016), fairseq's own"
    paper, code, preset = "https://arxiv.org/abs/1607.06450", "", None  # the default: every preset without a norm
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (nn.LayerNorm,), ()  # its statistics (CUDA autocast does it for layer_norm, CPU autocast not)


class RMSNorm(Norm):
    name, source = "rmsnorm", "RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467)"
    paper, code, preset = "https://arxiv.org/abs/1910.07467", "https://github.com/bzhangGo/rmsnorm", "preln_rmsnorm"
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (nn.RMSNorm,), ()

    @classmethod
    def make(cls, normalized_shape, eps: float, args=None) -> nn.Module:
        return nn.RMSNorm(normalized_shape, eps=eps)


class DyT(Norm):
    name, source = "dyt", "DyT (Zhu et al., CVPR 2025, arXiv:2503.10622)"
    paper, code, preset = "https://arxiv.org/abs/2503.10622", "https://github.com/jiachenzhu/DyT", "dyt"
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), KEEPS_PACE  # element-wise and bounded: no float32 region (module docstring)

    @classmethod
    def make(cls, normalized_shape, eps: float, args=None) -> nn.Module:
        return DynamicTanh(normalized_shape, eps)


# Derf's alpha_0 per task, from the authors' code (zlab-princeton/Derf@8dd9ea3): 1.0 in the GPT-2 language model
# (language model/model_derf.patch and train_derf.patch, attn/ffn/dec_alpha_init_value = 1.0), 0.5 in every other
# task (DiT/ and ViT/dynamic_erf.py, speech model/ (wav2vec 2.0, in fairseq) and DNA model/dynamic_erf.patch)
DERF_ALPHA_LM, DERF_ALPHA_OTHER = 1.0, 0.5


class Derf(Norm):
    name, source = "derf", "Derf (Chen et al. 2025, arXiv:2512.10938; zlab-princeton/Derf)"
    paper, code, preset = "https://arxiv.org/abs/2512.10938", "https://github.com/zlab-princeton/Derf", "derf"
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), KEEPS_PACE  # element-wise and bounded: no float32 region (module docstring)
    options = (
        Option("derf_alpha_init", check_float, (0.0, 100.0, True), None, "A",  # filled by defaults(): by task
               "Derf's initial alpha in every norm, 0 < A <= 100 (default by task, from the authors' code "
               "zlab-princeton/Derf: 1.0 for the plugin's language models, as its GPT-2 patch "
               "(attn/ffn/dec_alpha_init_value = 1.0); 0.5 for translation, the value of every task of the authors "
               "but the language model (ViT, DiT, wav2vec 2.0 in fairseq, DNA), since translation is not among "
               "them and fairseq scales the embeddings by sqrt(C), so the stream a norm reads has entries of order "
               "1 as in those tasks, not GPT-2's 0.02-scale embeddings; a checkpoint saved before issue 55 is "
               "rebuilt with 0.5, the value then for every task)"),
    )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        # the plugin's language models are decoders without cross-attention (lm/language_model.py sets it)
        alpha = DERF_ALPHA_LM if getattr(args, "no_cross_attention", False) else DERF_ALPHA_OTHER
        set_defaults_since(args, {"derf_alpha_init": alpha}, {"derf_alpha_init": DERF_ALPHA_OTHER})
        super().defaults(args)

    @classmethod
    def make(cls, normalized_shape, eps: float, args=None) -> nn.Module:
        alpha = getattr(args, "derf_alpha_init", None)
        return DynamicErf(normalized_shape, eps, alpha_init=ALPHA_INIT if alpha is None else alpha)


def replace_norms_(module: nn.Module, norm: type[Norm], args=None) -> int:
    """Replace every nn.LayerNorm under ``module`` by ``norm.make`` (given the model's ``args``); returns how many
    were replaced."""
    if norm is LayerNorm:
        return 0
    found = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.LayerNorm)]
    for name, m in found:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, norm.make(m.normalized_shape, m.eps, args).to(m.weight.device if m.weight is not None else None))
    return len(found)


NORMS: dict[str, type[Norm]] = {c.name: c for c in (LayerNorm, RMSNorm, DyT, Derf)}
