"""What every kernel entry point checks of the tensors it hands to C, before the call (grn_kernel.py,
mhc_kernel.py, hc_kernel.py, and the operators of grn_ops.py and mhc_ops.py, real and fake implementations).

A C kernel gets a pointer and a length in floats: a float16 or float64 tensor, a tensor on another device (a
meta tensor's pointer is 0), a nested or sparse one, or one of another shape would be read or written out of
bounds, or computed wrong. So each tensor argument is checked here by name, and a refusal is one line naming
the argument and what is allowed. Layout only needs no check: a non-contiguous tensor is copied (``dense``).
"""

import torch
from torch import Tensor

ALLOWED = "float32 strided CPU tensors"


def ok(t) -> bool:
    """Whether ``t`` is a float32 strided CPU tensor, in the cheapest tests (a decoding step makes hundreds of
    kernel calls)."""
    return isinstance(t, Tensor) and t.dtype == torch.float32 and t.is_cpu and t.layout == torch.strided \
        and not t.is_nested  # fmt: skip


def kind(name: str, t) -> str | None:
    """Why ``t`` cannot be argument ``name`` of a kernel (not a float32 strided CPU tensor), or None."""
    if ok(t):
        return None
    if not isinstance(t, Tensor):
        return f"{name} = {type(t).__name__} (allowed: {ALLOWED})"
    nested = " nested" if t.is_nested else ""
    return f"{name}: a {t.dtype} {t.layout}{nested} tensor on {t.device} (allowed: {ALLOWED})"


def tensor(name: str, t, shape: tuple, what: str = "") -> str | None:
    """Why ``t`` cannot be argument ``name`` of shape ``shape`` (``kind``, then the shape), or None; ``what``
    says where the shape comes from."""
    reason = kind(name, t)
    if reason is None and t.shape != tuple(shape):
        return f"{name} of shape {tuple(t.shape)} (allowed: {tuple(shape)}{what})"
    return reason


def first(*reasons: str | None) -> str | None:
    """The first refusal of several checks, or None."""
    return next((r for r in reasons if r is not None), None)


def dense(t: Tensor) -> Tensor:
    """``t`` as the C code reads it: contiguous, and with a negative view's sign applied (``torch._neg_view``
    shares the memory of the values it negates, and ``contiguous()`` keeps it so)."""
    return (t.resolve_neg() if t.is_neg() else t).contiguous()
