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
        return f"{len(chunks)} chunks (the kernels take 1 to {MAX_CHUNKS})"
    for t in (*chunks, b, w, norm_weight, norm_bias):
        if t is not None and (t.dtype != torch.float32 or not t.is_cpu or t.layout != torch.strided):
            return f"a {t.dtype} {t.layout} tensor on {t.device} (the kernels take float32 strided CPU tensors)"
    if chunks[0].dim() < 2:
        return f"a chunk of shape {tuple(chunks[0].shape)} (entries, *, d)"
    shape = chunks[0].shape[1:]
    if any(c.shape[1:] != shape or c.size(0) < 1 for c in chunks) or shape.numel() == 0:
        return f"chunks of shapes {[tuple(c.shape) for c in chunks]} (non-empty, equal but for the entries)"
    dim, entries = shape[-1], sum(c.size(0) for c in chunks)
    if b.dim() != 3 or not 1 <= b.size(0) <= MAX_OUTPUTS or b.size(1) != entries or b.size(2) not in (1, dim):
        return f"b of shape {tuple(b.shape)} for {entries} entries of width {dim} (outputs 1 to {MAX_OUTPUTS})"
    if w is not None and w.shape != (b.size(0), dim):
        return f"w of shape {tuple(w.shape)}, not {(b.size(0), dim)}"
    for name, t in (("weight", norm_weight), ("bias", norm_bias)):
        if t is not None and (not with_norm or t.shape != (dim,)):
            return f"a LayerNorm {name} of shape {tuple(t.shape)} for width {dim}"
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
    if status:  # check() lets nothing through that grn_cpu.c refuses: a bug here, said as such
        what = f"dimension {DIMS[status - 1]}" if status < 100 else f"buffer {(*names, 'count')[status - 100]}"
        raise RuntimeError(f"the GRN kernel refused its arguments ({what}); please report this")


def _call(fn, dims: list[int], buffers: list[Tensor | None], *extra) -> None:
    """Call a kernel with dims, the threads torch uses, and each buffer's pointer and length (0 for None).
    The tables are array('q')s passed by address: building ctypes arrays cost more than a decoding step's
    kernel call saves."""
    dims = array("q", [*dims, torch.get_num_threads()])
    ptrs = array("q", [0 if t is None else t.data_ptr() for t in buffers])
    sizes = array("q", [0 if t is None else t.numel() for t in buffers])
    args = (dims.buffer_info()[0], *extra, ptrs.buffer_info()[0], sizes.buffer_info()[0], len(buffers))
    _status(fn(*args), FORWARD_BUFFERS if extra else BACKWARD_BUFFERS)


def _contiguous(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.contiguous()


def _padded(ts: list[Tensor]) -> list[Tensor | None]:
    return [*ts, *[None] * (MAX_CHUNKS - len(ts))]


def _dims(chunks: list[Tensor], b: Tensor, with_norm: bool) -> list[int]:
    entries = [c.size(0) for c in chunks] + [0] * (MAX_CHUNKS - len(chunks))
    return [chunks[0].shape[1:-1].numel(), chunks[0].size(-1), b.size(0), b.size(2), *entries, int(with_norm)]


def _fits(out, shape: torch.Size, outputs: int, chunks: list[Tensor]) -> bool:
    """Whether out = (first, h) can be written: the result's shapes, float32 contiguous CPU tensors whose memory
    is apart from each other and from the stack."""
    if out is None or len(out) != 2 or out[0].shape != shape or out[1].shape != (outputs, *shape):
        return False
    for t in out:
        if t.dtype != torch.float32 or not t.is_cpu or t.layout != torch.strided or not t.is_contiguous():
            return False
    spans = [(t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in (*out, *chunks)]
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
    chunks = [c.contiguous() for c in chunks]
    b, w, norm_weight, norm_bias = map(_contiguous, (b, w, norm_weight, norm_bias))
    shape, n_entries, outputs = chunks[0].shape[1:], sum(c.size(0) for c in chunks), b.size(0)
    tokens, new = shape[:-1].numel(), chunks[0].new_empty
    if with_norm and _fits(out, shape, outputs, chunks):
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
    [grad of each chunk]."""
    lib = loaded()
    if lib is None:
        raise RuntimeError(f"the GRN kernels are unavailable: {failure}")
    chunks = [c.contiguous() for c in chunks]
    b, w, norm_weight = map(_contiguous, (b, w, norm_weight))
    dim, outputs = chunks[0].size(-1), b.size(0)
    mean, rstd, rho, dot = map(_contiguous, stats)
    grad = grad.to(torch.float32).contiguous()
    if grad.shape != (outputs, *chunks[0].shape[1:]):
        raise ValueError(f"a gradient of shape {tuple(grad.shape)} for outputs of {(outputs, *chunks[0].shape[1:])}")
    grad_first = grad_first.to(torch.float32).contiguous() if grad_first is not None and with_norm else None
    grad_chunks = [torch.empty_like(c, memory_format=torch.contiguous_format) for c in chunks]
    grad_b = torch.zeros_like(b)
    grad_w = torch.zeros_like(w) if w is not None else None
    grad_norm_weight = grad.new_zeros(dim) if with_norm and norm_grads[0] else None
    grad_norm_bias = grad.new_zeros(dim) if with_norm and norm_grads[1] else None
    buffers = [*_padded(chunks), b, w, norm_weight, grad, grad_first, mean, rstd, rho, dot, *_padded(grad_chunks),
               grad_b, grad_w, grad_norm_weight, grad_norm_bias]  # fmt: skip
    _call(lib.grn_backward, _dims(chunks, b, with_norm), buffers)
    return grad_b, grad_w, grad_norm_weight, grad_norm_bias, grad_chunks
