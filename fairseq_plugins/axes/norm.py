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
    derf        Derf(x) = g * erf(alpha x + s) + b, alpha_0 0.5     (Chen et al. 2025, arXiv:2512.10938)

DyT and Derf are element-wise and bounded (|y| <= |g| + |b|), so they need no float32 region under autocast
(modules/dyt.py, modules/derf.py); they replace every LayerNorm, cross-attention's and the stack-final ones
included, as the papers replace every norm.
"""

from torch import nn

from . import Choice


class Norm(Choice):
    axis = "norm"

    @classmethod
    def make(cls, normalized_shape, eps: float) -> nn.Module:
        raise NotImplementedError


class LayerNorm(Norm):
    name, source = "layernorm", "LayerNorm (Ba et al. 2016), fairseq's own"


class RMSNorm(Norm):
    name, source = "rmsnorm", "RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467)"

    @classmethod
    def make(cls, normalized_shape, eps: float) -> nn.Module:
        return nn.RMSNorm(normalized_shape, eps=eps)


class DyT(Norm):
    name, source = "dyt", "DyT (Zhu et al., CVPR 2025, arXiv:2503.10622)"

    @classmethod
    def make(cls, normalized_shape, eps: float) -> nn.Module:
        from ..modules.dyt import DynamicTanh

        return DynamicTanh(normalized_shape, eps)


class Derf(Norm):
    name, source = "derf", "Derf (Chen et al. 2025, arXiv:2512.10938)"

    @classmethod
    def make(cls, normalized_shape, eps: float) -> nn.Module:
        from ..modules.derf import DynamicErf

        return DynamicErf(normalized_shape, eps)


def replace_norms_(module: nn.Module, norm: type[Norm]) -> int:
    """Replace every nn.LayerNorm under ``module`` by ``norm.make``; returns how many were replaced."""
    if norm is LayerNorm:
        return 0
    found = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.LayerNorm)]
    for name, m in found:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, norm.make(m.normalized_shape, m.eps).to(m.weight.device if m.weight is not None else None))
    return len(found)


NORMS: dict[str, type[Norm]] = {c.name: c for c in (LayerNorm, RMSNorm, DyT, Derf)}
