"""The fused CPU GRN kernels (grn_cpu.c): built on first use, loaded through ctypes, optional.

The GRN of modules/grn.py runs these kernels for float32 tensors on the CPU when they can be had and the inputs
are ones they take (``check``), and its pure-PyTorch code otherwise (other dtypes and devices, more than
MAX_OUTPUTS outputs, no C compiler, a cache that is not private, ``FAIRSEQ_PLUGINS_GRN_KERNEL=0``); both compute
the same function, the kernels in one pass over the tokens, parallel over tokens on torch.get_num_threads()
threads (tests/test_grn_kernel.py holds them to each other). kernels/loader.py builds and verifies the library
(docs/kernels.md: what is checked and refused); a library that cannot be had is reported once as a warning, and
training goes on with the PyTorch code.

Under tracing or compilation the kernels run as the custom operators ``torch.ops.fairseq_plugins.grn_forward``
and ``grn_backward`` (kernels/grn_ops.py), which torch.compile and torch.jit.trace see as ordinary operators;
in eager autograd as an autograd Function with the same forward and backward (activation checkpointing and DDP
work either way); without autograd (decoding) ``forward`` is called directly. The operator dispatch costs
about 0.05 ms a call without autograd and 0.2 ms with it, more than the kernels save on a decoding step.
"""

import ctypes
import logging
import os
import sys
import threading
from array import array

import torch
from torch import Tensor

from . import loader, switch
from .arguments import dense, first, kind, ok, tensor

logger = logging.getLogger(__name__)

ENV_SWITCH = "FAIRSEQ_PLUGINS_GRN_KERNEL"  # "0" turns the kernels off
ABI_VERSION = 2  # grn_abi_version() in grn_cpu.c

_lock = threading.Lock()
_library: ctypes.CDLL | None = None  # once loaded, never replaced: a backward uses the library its forward used
_tried = False
_enabled = os.environ.get(ENV_SWITCH, "1") != "0"
failure: str | None = None  # why the kernels are not available, once loading was tried

MAX_CHUNKS = 3  # the stack's chunks the kernels take: all of it, or k-DCA's embedding, middle sum and last k
MAX_OUTPUTS = 4  # GRN outputs the kernels take (DCA's GRNs have 1 or 3), MAX_OUTPUTS in grn_cpu.c
MAX_ENTRIES = 1 << 20  # grn_cpu.c: entries of one chunk
MAX_DIM = 1 << 40  # grn_cpu.c: tokens, and width
MAX_THREADS = 1024  # grn_cpu.c: more threads than this are capped (torch.set_num_threads(1025) is allowed)
# the buffers of grn_forward and grn_backward, in the order of grn_cpu.c's enums (for error messages)
FORWARD_BUFFERS = ("chunk 0", "chunk 1", "chunk 2", "b", "w", "norm weight", "norm bias", "first", "h", "mean",
                   "rstd", "rho", "dot")  # fmt: skip
BACKWARD_BUFFERS = ("chunk 0", "chunk 1", "chunk 2", "b", "w", "norm weight", "grad", "grad first", "mean",
                    "rstd", "rho", "dot", "grad chunk 0", "grad chunk 1", "grad chunk 2", "grad b", "grad w",
                    "grad norm weight", "grad norm bias")  # fmt: skip
DIMS = ("tokens", "width", "outputs", "b's last dimension", "entries 0", "entries 1", "entries 2", "layer norm",
        "threads")  # fmt: skip


def _load() -> ctypes.CDLL:
    lib = loader.load()
    lib.grn_abi_version.argtypes, lib.grn_abi_version.restype = [], ctypes.c_int
    if lib.grn_abi_version() != ABI_VERSION:
        raise OSError(f"the GRN kernels' library has ABI {lib.grn_abi_version()}, expected {ABI_VERSION}")
    table = ctypes.c_void_p  # the address of an array("q") of dims, pointers or sizes
    lib.grn_forward.argtypes = [table, ctypes.c_float, table, table, ctypes.c_int64]
    lib.grn_backward.argtypes = [table, table, table, ctypes.c_int64]
    lib.grn_forward.restype = lib.grn_backward.restype = ctypes.c_int
    return lib


loaded = switch.loader(sys.modules[__name__], "GRN kernels")


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on the first call; None if they are turned off or cannot be had."""
    return loaded() if _enabled else None


# the availability check torch.compile can trace and the on/off switch, shared with the other kernel modules
_available = switch.availability(sys.modules[__name__])
enabled = switch.switch(sys.modules[__name__])


def check(chunks: list[Tensor], b: Tensor, w: Tensor | None = None, norm_weight: Tensor | None = None,
          norm_bias: Tensor | None = None, with_norm: bool = False) -> str | None:  # fmt: skip
    """Why the kernels cannot take these inputs, or None if they can: chunks (entries_i, *, d) of equal shapes
    after the first dimension, b (outputs, entries, d or 1) with 1 to MAX_OUTPUTS outputs, w (outputs, d), the
    LayerNorm's weight and bias (d) (only with with_norm), all float32 strided tensors on the CPU."""
    if not 1 <= len(chunks) <= MAX_CHUNKS:
        return f"{len(chunks)} chunks (allowed: 1 to {MAX_CHUNKS})"
    if not all(t is None or ok(t) for t in (*chunks, b, w, norm_weight, norm_bias)):  # named only when refused
        named = [*((f"chunks[{i}]", c) for i, c in enumerate(chunks)), ("b", b), ("w", w),
                 ("norm_weight", norm_weight), ("norm_bias", norm_bias)]  # fmt: skip
        return first(*(kind(name, t) for name, t in named if t is not None))
    if chunks[0].dim() < 2:
        return f"chunks[0] of shape {tuple(chunks[0].shape)} (allowed: (entries, *, d), 2 or more dimensions)"
    shape = chunks[0].shape[1:]
    if any(c.shape[1:] != shape or c.size(0) < 1 for c in chunks) or shape.numel() == 0:
        return (f"chunks of shapes {[tuple(c.shape) for c in chunks]} (allowed: at least one entry each, equal "
                f"but for the entries, not empty)")  # fmt: skip
    dim, entries = shape[-1], sum(c.size(0) for c in chunks)
    if any(c.size(0) > MAX_ENTRIES for c in chunks) or dim > MAX_DIM or shape[:-1].numel() > MAX_DIM:
        return (f"chunks of shapes {[tuple(c.shape) for c in chunks]} (allowed: at most {MAX_ENTRIES} entries a "
                f"chunk, {MAX_DIM} tokens and width)")  # fmt: skip
    if b.dim() != 3 or not 1 <= b.size(0) <= MAX_OUTPUTS or b.size(1) != entries or b.size(2) not in (1, dim):
        return (f"b of shape {tuple(b.shape)} (allowed: (1 to {MAX_OUTPUTS} outputs, {entries} entries, {dim} or "
                f"1) for the chunks)")  # fmt: skip
    if w is not None and w.shape != (b.size(0), dim):
        return f"w of shape {tuple(w.shape)} (allowed: {(b.size(0), dim)} for b and the chunks, or None)"
    for name, t in (("norm_weight", norm_weight), ("norm_bias", norm_bias)):
        if t is not None and not with_norm:
            return f"{name} without the LayerNorm (with_norm is False; allowed: None)"
        if t is not None and t.shape != (dim,):
            return f"{name} of shape {tuple(t.shape)} (allowed: {(dim,)} for the chunks' width, or None)"
    return None


def check_backward(chunks: list[Tensor], b: Tensor, w: Tensor | None, norm_weight: Tensor | None, with_norm: bool,
                   grad: Tensor, grad_first: Tensor | None, stats) -> str | None:  # fmt: skip
    """Why ``backward`` cannot take these inputs, or None: those of ``check``, grad (outputs, *, d) and
    grad_first (*, d; optional, with the LayerNorm only), and the statistics forward saved, float32 strided
    CPU tensors: mean and rstd (outputs, tokens) with the LayerNorm, rho (entries, tokens) and dot (outputs,
    entries, tokens) with w, each None otherwise."""
    reason = check(chunks, b, w, norm_weight, None, with_norm)
    if reason is not None:
        return reason
    shape, outputs, entries = tuple(chunks[0].shape[1:]), b.size(0), sum(c.size(0) for c in chunks)
    tokens = chunks[0].shape[1:-1].numel()
    wanted = [("grad", grad, (outputs, *shape), True), ("grad_first", grad_first, shape, None if with_norm else False),
              ("mean", stats[0], (outputs, tokens), with_norm), ("rstd", stats[1], (outputs, tokens), with_norm),
              ("rho", stats[2], (entries, tokens), w is not None),
              ("dot", stats[3], (outputs, entries, tokens), w is not None)]  # fmt: skip
    for name, t, want, present in wanted:  # present: True (required), False (must be None), None (optional)
        if t is None and present:
            return f"{name} = None (allowed: a tensor of shape {want}{' with w' if name in ('rho', 'dot') else ''})"
        if t is not None and present is False:
            return f"{name} (allowed: None {'without w' if name in ('rho', 'dot') else 'without the LayerNorm'})"
        if t is not None:
            reason = tensor(name, t, want, " for the chunks and b")
            if reason is not None:
                return reason
    return None


def usable(chunks: list[Tensor], b: Tensor, w: Tensor | None = None, norm_weight: Tensor | None = None,
           norm_bias: Tensor | None = None, with_norm: bool | None = None) -> bool:  # fmt: skip
    """Whether the kernels are on, can be had, and take these inputs (``check``)."""
    if with_norm is None:
        with_norm = norm_weight is not None or norm_bias is not None
    return _enabled and check(chunks, b, w, norm_weight, norm_bias, with_norm) is None and _available()


def _status(status: int, names: tuple[str, ...]) -> None:
    if status == -1:
        raise MemoryError("the GRN kernel could not allocate its working memory")
    if status:  # check() lets nothing through that grn_cpu.c refuses: a bug of this file, said as such
        what = f"dimension {DIMS[status - 1]}" if status < 100 else f"buffer {(*names, 'count')[status - 100]}"
        raise RuntimeError(f"the GRN kernel refused its arguments ({what}) that kernels/grn_kernel.py passed as "
                           f"valid; {ENV_SWITCH}=0 runs the PyTorch code instead")


def _call(fn, dims: list[int], buffers: list[Tensor | None], *extra) -> None:
    """Call a kernel with dims, the threads torch uses, and each buffer's pointer and length (0 for None).
    The tables are array('q')s passed by address: building ctypes arrays cost more than a decoding step's
    kernel call saves."""
    dims = array("q", [*dims, min(torch.get_num_threads(), MAX_THREADS)])  # more would be refused, not used
    ptrs = array("q", [0 if t is None else t.data_ptr() for t in buffers])
    sizes = array("q", [0 if t is None else t.numel() for t in buffers])
    args = (dims.buffer_info()[0], *extra, ptrs.buffer_info()[0], sizes.buffer_info()[0], len(buffers))
    _status(fn(*args), FORWARD_BUFFERS if extra else BACKWARD_BUFFERS)


def _contiguous(t: Tensor | None) -> Tensor | None:
    return None if t is None else dense(t)


def _padded(ts: list[Tensor]) -> list[Tensor | None]:
    return [*ts, *[None] * (MAX_CHUNKS - len(ts))]


def _dims(chunks: list[Tensor], b: Tensor, with_norm: bool) -> list[int]:
    entries = [c.size(0) for c in chunks] + [0] * (MAX_CHUNKS - len(chunks))
    return [chunks[0].shape[1:-1].numel(), chunks[0].size(-1), b.size(0), b.size(2), *entries, int(with_norm)]


def _fits(out, shape: torch.Size, outputs: int, inputs: list[Tensor]) -> bool:
    """Whether out = (first, h) can be written: the result's shapes, float32 contiguous CPU tensors whose memory
    is apart from each other and from the inputs (the stack, b, w and the LayerNorm's parameters), which the
    kernel reads while it writes out."""
    if out is None or len(out) != 2 or out[0].shape != shape or out[1].shape != (outputs, *shape):
        return False
    for t in out:
        if kind("out", t) is not None or not t.is_contiguous() or t.is_neg():
            return False
    spans = [(t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in (*out, *inputs) if t is not None]
    (s0, e0), (s1, e1) = spans[:2]
    return (e0 <= s1 or e1 <= s0) and all((e0 <= s or e <= s0) and (e1 <= s or e <= s1) for s, e in spans[2:])


def forward(chunks: list[Tensor], b: Tensor, w: Tensor | None, norm_weight: Tensor | None,
            norm_bias: Tensor | None, norm_eps: float, with_norm: bool, save: bool, out=None, checked=False):  # fmt: skip
    """The GRN of grn.py on chunks (entries_i, *, d). Returns (first, h, stats) with the LayerNorm, else
    (x, None, stats): first = x[0] (*, d); h and x (outputs, *, d); stats = (mean, rstd, rho, dot) for
    backward (None where not saved or not used). out: (first, h) to write into, with the LayerNorm, used if it
    fits. Raises ValueError for inputs the kernels do not take (``check``; checked: the caller just ran it and
    it passed, as in usable())."""
    reason = None if checked else check(chunks, b, w, norm_weight, norm_bias, with_norm)
    if reason is not None:
        raise ValueError(f"the GRN kernels cannot take {reason}")
    lib = loaded()
    if lib is None:
        raise RuntimeError(f"the GRN kernels are unavailable: {failure}")
    chunks = [dense(c) for c in chunks]
    b, w, norm_weight, norm_bias = map(_contiguous, (b, w, norm_weight, norm_bias))
    shape, n_entries, outputs = chunks[0].shape[1:], sum(c.size(0) for c in chunks), b.size(0)
    tokens, new = shape[:-1].numel(), chunks[0].new_empty
    if with_norm and _fits(out, shape, outputs, [*chunks, b, w, norm_weight, norm_bias]):
        first, h = out
    else:
        first, h = (new(shape) if with_norm else None), new(outputs, *shape)
    mean = new(outputs, tokens) if save and with_norm else None
    rstd = new(outputs, tokens) if save and with_norm else None
    rho = new(n_entries, tokens) if save and w is not None else None
    dot = new(outputs, n_entries, tokens) if save and w is not None else None
    _call(lib.grn_forward, _dims(chunks, b, with_norm), [*_padded(chunks), b, w, norm_weight, norm_bias, first, h,
          mean, rstd, rho, dot], norm_eps)  # fmt: skip
    stats = (mean, rstd, rho, dot)
    return (first, h, stats) if with_norm else (h, None, stats)


def backward(chunks: list[Tensor], b: Tensor, w: Tensor | None, norm_weight: Tensor | None, with_norm: bool,
             grad: Tensor, grad_first: Tensor | None, stats, norm_grads: tuple[bool, bool]):  # fmt: skip
    """Gradients of forward() for grad (outputs, *, d) of h (with the LayerNorm) or of x, and grad_first
    (*, d) of first; norm_grads: whether the LayerNorm's weight and bias want theirs. Uses the library the
    forward used, whatever the switch says now. Returns grad_b, grad_w, grad_norm_weight, grad_norm_bias,
    [grad of each chunk]. Raises ValueError for inputs it does not take (``check_backward``)."""
    reason = check_backward(chunks, b, w, norm_weight, with_norm, grad, grad_first, stats)
    if reason is not None:
        raise ValueError(f"the GRN kernels cannot take {reason}")
    lib = loaded()
    if lib is None:
        raise RuntimeError(f"the GRN kernels are unavailable: {failure}")
    chunks = [dense(c) for c in chunks]
    b, w, norm_weight, grad, grad_first = map(_contiguous, (b, w, norm_weight, grad, grad_first))
    dim = chunks[0].size(-1)
    mean, rstd, rho, dot = map(_contiguous, stats)
    grad_chunks = [torch.empty_like(c, memory_format=torch.contiguous_format) for c in chunks]
    grad_b = torch.zeros_like(b)
    grad_w = torch.zeros_like(w) if w is not None else None
    grad_norm_weight = grad.new_zeros(dim) if with_norm and norm_grads[0] else None
    grad_norm_bias = grad.new_zeros(dim) if with_norm and norm_grads[1] else None
    buffers = [*_padded(chunks), b, w, norm_weight, grad, grad_first, mean, rstd, rho, dot, *_padded(grad_chunks),
               grad_b, grad_w, grad_norm_weight, grad_norm_bias]  # fmt: skip
    _call(lib.grn_backward, _dims(chunks, b, with_norm), buffers)
    return grad_b, grad_w, grad_norm_weight, grad_norm_bias, grad_chunks
