"""The fused CPU GRN kernels (grn_cpu.c): built on first use, loaded through ctypes, optional.

The GRN of modules/grn.py runs these kernels for float32 tensors on the CPU when they can be had, and its
pure-PyTorch code otherwise (other dtypes and devices, no C compiler, or ``FAIRSEQ_PLUGINS_GRN_KERNEL=0``);
both compute the same function, the kernels in one pass over the tokens (tests/test_grn_kernel.py holds them
to each other). Building takes about a second with the system's C compiler (``$CC``, default ``cc``); the
library is cached under ``$FAIRSEQ_PLUGINS_CACHE`` (default ``~/.cache/fairseq_plugins``), keyed by the
source, the flags and this CPU (it is built for the CPU it runs on), and written under a temporary name and
moved into place, so concurrent ranks and killed builds never leave a half-written library behind. A build
that fails is reported once as a warning, and training goes on with the PyTorch code.
"""

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("grn_cpu.c")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC")
ENV_SWITCH = "FAIRSEQ_PLUGINS_GRN_KERNEL"  # "0" turns the kernels off

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False
_enabled = os.environ.get(ENV_SWITCH, "1") != "0"
failure: str | None = None  # why the kernels are not available, once a build was tried

_i64, _ptr, _int, _float = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
MAX_CHUNKS = 3  # the stack's chunks the kernels take: all of it, or k-DCA's embedding, middle sum and last k
MAX_OUTPUTS = 4  # GRN outputs the kernels take (DCA's GRNs have 1 or 3), MAX_OUTPUTS in grn_cpu.c
_CHUNKS = [_ptr, _i64] * MAX_CHUNKS
_FORWARD_ARGS = [_i64] * 4 + _CHUNKS + [_ptr, _ptr, _int, _ptr, _ptr, _float] + [_ptr] * 6
_BACKWARD_ARGS = [_i64] * 4 + _CHUNKS + [_ptr, _ptr, _int] + [_ptr] * 14


def _cpu_key() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    return platform.processor() + platform.machine()


def _cache_dir() -> Path:
    return Path(os.environ.get("FAIRSEQ_PLUGINS_CACHE", Path.home() / ".cache" / "fairseq_plugins"))


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC", "cc")
    key = hashlib.sha256("\0".join([SOURCE.read_text(), compiler, *FLAGS, _cpu_key()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"grn_cpu-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run([compiler, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                                  check=False, timeout=300)  # fmt: skip
            if done.returncode:
                raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(target))
    lib.grn_forward.argtypes, lib.grn_forward.restype = _FORWARD_ARGS, _int
    lib.grn_backward.argtypes, lib.grn_backward.restype = _BACKWARD_ARGS, _int
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on the first call; None if they are turned off or cannot be built."""
    global _library, _tried, failure
    if not _enabled:
        return None
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    _library = _build()
                except (OSError, subprocess.SubprocessError) as err:
                    failure = str(err)
                    logger.warning("GRN kernels unavailable, using the PyTorch code (slower): %s", failure)
                _tried = True
    return _library


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Turn the kernels on or off inside the block (tests compare both paths)."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def usable(chunks: list[Tensor], b: Tensor, *tensors: Tensor | None) -> bool:
    """Whether the kernels can run on the stack's chunks, the GRN weights b (outputs, entries, d or 1) and
    these tensors: float32 on the CPU (None entries are ignored), at most MAX_CHUNKS chunks and MAX_OUTPUTS
    outputs."""
    if len(chunks) > MAX_CHUNKS or b.size(0) > MAX_OUTPUTS:
        return False
    for t in (*chunks, b, *tensors):
        if t is not None and (t.dtype != torch.float32 or not t.is_cpu):
            return False
    return library() is not None


def _p(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _chunk_args(chunks: list[Tensor]) -> tuple[list, list[Tensor], int]:
    """(pointer, entries) of each chunk, padded to MAX_CHUNKS; the chunks they point into (contiguous, kept
    alive by the caller for the call); the tokens per entry."""
    chunks = [c if c.is_contiguous() else c.contiguous() for c in chunks]
    args = []
    for c in chunks:
        args += (c.data_ptr(), c.size(0))
    tokens = chunks[0].shape[1:].numel() // chunks[0].size(-1)
    return args + [None, 0] * (MAX_CHUNKS - len(chunks)), chunks, tokens


def _check(status: int) -> None:
    if status:
        raise MemoryError("the GRN kernel could not allocate its working memory")


def forward(chunks: list[Tensor], b: Tensor, w: Tensor | None, norm_weight: Tensor | None,
            norm_bias: Tensor | None, norm_eps: float, with_norm: bool, save: bool, out=None):  # fmt: skip
    """The GRN of grn.py on chunks (entries_i, *, d). Returns (first, h, stats) with the LayerNorm, else
    (x, None, stats): first = x[0] (*, d); h and x (outputs, *, d); stats = (mean, rstd, rho, dot) for
    backward (None where not saved or not used). out: (first, h) to write into, with the LayerNorm."""
    chunk_args, chunks, tokens = _chunk_args(chunks)
    shape, n_entries, outputs = chunks[0].shape[1:], sum(c.size(0) for c in chunks), b.size(0)
    b = b.contiguous()
    w = w.contiguous() if w is not None else None
    new = chunks[0].new_empty
    if out is not None and with_norm and out[0].shape == shape and out[1].shape == (outputs, *shape):
        first, h = out
    else:
        h = new(outputs, *shape)
        first = new(shape) if with_norm else None
    mean = new(outputs, tokens) if save and with_norm else None
    rstd = new(outputs, tokens) if save and with_norm else None
    rho = new(n_entries, tokens) if save and w is not None else None
    dot = new(outputs, n_entries, tokens) if save and w is not None else None
    _check(library().grn_forward(
        tokens, shape[-1], outputs, b.size(-1), *chunk_args, _p(b), _p(w), with_norm, _p(norm_weight),
        _p(norm_bias), norm_eps, _p(first), _p(h), _p(mean), _p(rstd), _p(rho), _p(dot),
    ))  # fmt: skip
    stats = (mean, rstd, rho, dot)
    return (first, h, stats) if with_norm else (h, None, stats)


def backward(chunks: list[Tensor], b: Tensor, w: Tensor | None, norm_weight: Tensor | None, with_norm: bool,
             grad: Tensor, grad_first: Tensor | None, stats, norm_grads: tuple[bool, bool]):  # fmt: skip
    """Gradients of forward() for grad (outputs, *, d) of h (with the LayerNorm) or of x, and grad_first
    (*, d) of first; norm_grads: whether the LayerNorm's weight and bias want theirs.
    Returns grad_b, grad_w, grad_norm_weight, grad_norm_bias, [grad of each chunk]."""
    chunk_args, chunks, tokens = _chunk_args(chunks)
    dim, outputs = chunks[0].size(-1), b.size(0)
    mean, rstd, rho, dot = stats
    b = b.contiguous()
    w = w.contiguous() if w is not None else None
    grad = grad.contiguous()
    grad_first = grad_first.contiguous() if grad_first is not None else None
    grad_chunks = [torch.empty_like(c, memory_format=torch.contiguous_format) for c in chunks]
    grad_ptrs = [g.data_ptr() for g in grad_chunks] + [None] * (MAX_CHUNKS - len(chunks))
    grad_b = torch.zeros_like(b)
    grad_w = torch.zeros_like(w) if w is not None else None
    grad_norm_weight = grad.new_zeros(dim) if with_norm and norm_grads[0] else None
    grad_norm_bias = grad.new_zeros(dim) if with_norm and norm_grads[1] else None
    _check(library().grn_backward(
        tokens, dim, outputs, b.size(-1), *chunk_args, _p(b), _p(w), with_norm, _p(norm_weight), _p(grad),
        _p(grad_first), _p(mean), _p(rstd), _p(rho), _p(dot), *grad_ptrs, _p(grad_b), _p(grad_w),
        _p(grad_norm_weight), _p(grad_norm_bias),
    ))  # fmt: skip
    return grad_b, grad_w, grad_norm_weight, grad_norm_bias, grad_chunks
