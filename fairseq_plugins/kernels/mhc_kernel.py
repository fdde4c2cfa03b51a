"""The fused CPU mHC gate kernel (mhc_cpu.c): built on first use, loaded through ctypes, optional.

mHC (modules/mhc.py) computes H_pre = sigmoid, H_post = 2 sigmoid and H_res = Sinkhorn(exp(.)) of its logits
with this kernel for float32 logits on the CPU when it can be had and the inputs are ones it takes (``check``),
and with its PyTorch code otherwise (float64, other devices, n > MAX_N streams, more than MAX_ITERS
iterations, no tokens, no C compiler, a cache that is not private, ``FAIRSEQ_PLUGINS_MHC_KERNEL=0``). Both
compute the same function (tests/test_mhc_kernel.py holds them to each other and to float64 maths).
kernels/loader.py builds and verifies the library as it does the GRN kernels' (docs/kernels.md), as a library
of its own; one that cannot be had is reported once as a warning and training goes on with the PyTorch code.

The mixing (``mix_forward``: u = H_pre x and H_res x per token from the streams x and the coefficients, and
``mix_backward``) runs in the same library for float32 streams (``check_mix``); mHC-lite uses it too.

Hyper-connections' coefficient kernels (same library) are called through kernels/hc_kernel.py.

Without autograd (decoding) ``coefficients`` computes the whole coefficient maths of a unit (RMSNorm, the
product with phi, gates and bias, then the gates above) in one call (kernels/mhc_coef.c).

Logits the exp-then-divide iteration cannot take (|x| > 15, mhc.py's MAX_EXP_LOGIT) make the kernel return
LOG_DOMAIN without writing anything; ``forward`` and ``backward`` then return None and the caller
(kernels/mhc_ops.py) runs the PyTorch log-domain code.
"""

import ctypes
import logging
import math
import os
import sys
import threading
from array import array

import torch
from torch import Tensor

from . import loader, switch
from .arguments import dense, first, kind, ok, tensor

logger = logging.getLogger(__name__)

ENV_SWITCH = "FAIRSEQ_PLUGINS_MHC_KERNEL"  # "0" turns the kernel off
LIBRARY = "mhc_cpu"
ABI_VERSION = 7  # mhc_abi_version() in mhc_cpu.c
MAX_N = 8  # MAX_N, MAX_ITERS and MAX_TOKENS in mhc_cpu.c
MAX_LITE_N = 5  # mhc_coef.c: mHC-lite's n! residual coefficients
MAX_ITERS = 1000
MAX_TOKENS = 1 << 36
MAX_WIDTH = 1 << 24  # mhc_mix.c
_FACTORIAL = [math.factorial(i) for i in range(MAX_LITE_N + 1)]
MAX_THREADS = 1024  # mhc_cpu.c: more threads than this are capped (torch.set_num_threads(1025) is allowed)
LOG_DOMAIN = 1  # MHC_LOG_DOMAIN
DIMS = ("n", "tokens", "iters", "threads")
FORWARD_BUFFERS = ("logits", "out")
BACKWARD_BUFFERS = ("logits", "grad", "grad logits")
MIX_DIMS = ("n", "tokens", "width", "threads")
COEF_DIMS = ("n", "tokens", "width", "iters", "threads")
COEF_BUFFERS = ("v", "raw", "bias", "gates", "out")
MIX_FORWARD_BUFFERS = ("x", "coefficients", "u", "mixed")
MIX_BACKWARD_BUFFERS = ("x", "coefficients", "grad u", "grad mixed", "grad x", "grad coefficients")
POST_FORWARD_BUFFERS = ("mixed", "post", "out", "new")
POST_BACKWARD_BUFFERS = ("grad", "post", "out", "grad post", "grad out")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None  # once loaded, never replaced: a backward uses the library its forward used
_tried = False
_enabled = os.environ.get(ENV_SWITCH, "1") != "0"
failure: str | None = None  # why the kernel is not available, once loading was tried


def _load() -> ctypes.CDLL:
    lib = loader.load(LIBRARY)
    lib.mhc_abi_version.argtypes, lib.mhc_abi_version.restype = [], ctypes.c_int
    if lib.mhc_abi_version() != ABI_VERSION:
        raise OSError(f"the mHC kernel's library has ABI {lib.mhc_abi_version()}, expected {ABI_VERSION}")
    table = ctypes.c_void_p  # the address of an array("q") of dims, pointers or sizes
    for fn in (lib.mhc_forward, lib.mhc_backward, lib.mhc_mix_forward, lib.mhc_mix_backward, lib.mhc_post_forward,
               lib.mhc_post_backward):  # fmt: skip
        fn.argtypes, fn.restype = [table, table, table, ctypes.c_int64], ctypes.c_int
    lib.mhc_coefficients.argtypes = [table, ctypes.c_float, table, table, ctypes.c_int64]
    lib.mhc_coefficients.restype = ctypes.c_int
    for fn in (lib.hc_coefficients, lib.hc_coefficients_backward, lib.mhc_lite_coefficients):
        fn.argtypes, fn.restype = [table, ctypes.c_float, table, table, ctypes.c_int64], ctypes.c_int
    return lib


loaded = switch.loader(sys.modules[__name__], "mHC kernel")


# the availability check torch.compile can trace and the on/off switch, shared with the other kernel modules
_available = switch.availability(sys.modules[__name__])
enabled = switch.switch(sys.modules[__name__])


def check(logits: Tensor, n: int, iters: int) -> str | None:
    """Why the kernel cannot take these inputs, or None if it can: logits (2n + n^2, tokens), a float32 strided
    CPU tensor with 1 to MAX_TOKENS tokens, 1 <= n <= MAX_N, 1 <= iters <= MAX_ITERS."""
    if not isinstance(n, int) or not isinstance(iters, int) or not 1 <= n <= MAX_N or not 1 <= iters <= MAX_ITERS:
        return f"n = {n!r} streams and {iters!r} iterations (the kernel takes 1 to {MAX_N} and 1 to {MAX_ITERS})"
    reason = kind("logits", logits)
    if reason is None and (logits.dim() != 2 or logits.size(0) != 2 * n + n * n
                           or not 1 <= logits.size(1) <= MAX_TOKENS):  # fmt: skip
        reason = (f"logits of shape {tuple(logits.shape)} (allowed: ({2 * n + n * n}, 1 to {MAX_TOKENS} tokens) "
                  f"for n = {n})")  # fmt: skip
    return reason


def check_backward(logits: Tensor, grad: Tensor, n: int, iters: int) -> str | None:
    """Why ``backward`` cannot take these inputs, or None: ``check``, and grad of the logits' shape, float32."""
    reason = check(logits, n, iters)
    return reason if reason is not None else tensor("grad", grad, logits.shape, " as the logits")


def usable(logits: Tensor, n: int, iters: int) -> bool:
    """Whether the kernel is on, can be had, and takes these inputs (``check``)."""
    return _enabled and check(logits, n, iters) is None and _available()


def check_mix(x: Tensor, coef: Tensor | None, n: int, name: str = "x") -> str | None:
    """Why the mixing kernel cannot take these inputs, or None: x (tokens, n, C) and coef (2n + n^2, tokens),
    float32 strided CPU tensors, 1 <= n <= MAX_N, 1 to MAX_TOKENS tokens, 1 <= C <= MAX_WIDTH (coef None: the
    streams alone; ``name``: the streams' argument name in messages)."""
    if _streams_fit(x, n) and (coef is None or (ok(coef) and coef.shape == (2 * n + n * n, x.shape[0]))):
        return None  # the common case in the fewest tests (a decoding step checks hundreds of arguments)
    if not isinstance(n, int) or not 1 <= n <= MAX_N:
        return f"n = {n!r} streams (the kernel takes 1 to {MAX_N})"
    reason = first(kind(name, x), None if coef is None else kind("coef", coef))
    if reason is not None:
        return reason
    if x.dim() != 3 or x.size(1) != n or not 1 <= x.size(0) <= MAX_TOKENS or not 1 <= x.size(2) <= MAX_WIDTH:
        return (f"{name} of shape {tuple(x.shape)} (allowed: (1 to {MAX_TOKENS} tokens, n, 1 to {MAX_WIDTH}) for "
                f"n = {n})")  # fmt: skip
    return None if coef is None else tensor("coef", coef, (2 * n + n * n, x.size(0)), f" for n = {n}")


def _streams_fit(x: Tensor, n) -> bool:
    """Whether streams x (tokens, n, C) pass ``check_mix`` (coef None), in the fewest tests; False says nothing
    (the full check then finds the reason)."""
    if not (isinstance(n, int) and 1 <= n <= MAX_N and ok(x) and x.dim() == 3):
        return False
    tokens, streams, width = x.shape
    return streams == n and 1 <= tokens <= MAX_TOKENS and 1 <= width <= MAX_WIDTH


def check_mix_backward(x: Tensor, coef: Tensor, grad_u: Tensor, grad_mixed: Tensor, n: int) -> str | None:
    """Why ``mix_backward`` cannot take these inputs, or None: ``check_mix``, grad_u (tokens, C) and grad_mixed
    of x's shape, float32."""
    reason = check_mix(x, coef, n)
    if reason is not None:
        return reason
    return first(tensor("grad_u", grad_u, (x.size(0), x.size(2)), " as u"),
                 tensor("grad_mixed", grad_mixed, x.shape, " as x"))  # fmt: skip


def usable_mix(x: Tensor, n: int) -> bool:
    """Whether the mixing kernel is on, can be had, and takes streams x (tokens, n, C) (the coefficients come
    from mhc.py itself: float32 (K, tokens))."""
    return _enabled and check_mix(x, None, n) is None and _available()


def _call(fn, n: int, second: int, buffers: list[Tensor], names: tuple[str, ...], dims=None, extra=()) -> bool:
    """Call a kernel on contiguous float32 buffers with dims (n, tokens, second, threads), tokens from the
    first buffer's second dimension unless dims are given; False if it asks for the log domain."""
    threads = min(torch.get_num_threads(), MAX_THREADS)  # more would be refused, not used
    dims = array("q", [*(dims or (n, buffers[0].size(1), second)), threads])
    ptrs = array("q", [t.data_ptr() for t in buffers])
    sizes = array("q", [t.numel() for t in buffers])
    status = fn(dims.buffer_info()[0], *extra, ptrs.buffer_info()[0], sizes.buffer_info()[0], len(buffers))
    if status == LOG_DOMAIN:
        return False
    if status == -1:
        raise MemoryError("the mHC kernel could not allocate its working memory")
    if status:  # the checks here let nothing through that mhc_cpu.c refuses: a bug of this file, said as such
        dim_names = {"x": MIX_DIMS, "mixed": MIX_DIMS, "grad": MIX_DIMS, "v": COEF_DIMS}.get(names[0], DIMS)
        what = f"dimension {dim_names[status - 10]}" if status < 100 else f"buffer {(*names, 'count')[status - 100]}"
        raise RuntimeError(f"the mHC kernel refused its arguments ({what}) that kernels/mhc_kernel.py passed as "
                           f"valid; {ENV_SWITCH}=0 runs the PyTorch code instead")
    return True


def _library_or_raise() -> ctypes.CDLL:
    lib = loaded()
    if lib is None:
        raise RuntimeError(f"the mHC kernel is unavailable: {failure}")
    return lib


def forward(logits: Tensor, n: int, iters: int, checked: bool = False) -> Tensor | None:
    """[H_pre; H_post; H_res] (2n + n^2, tokens) of logits (2n + n^2, tokens), H_res's n x n entries row-major;
    None for logits that need the log domain. Raises ValueError for inputs the kernel does not take (``check``;
    checked: the caller just ran it)."""
    reason = None if checked else check(logits, n, iters)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    logits = dense(logits)
    out = torch.empty_like(logits)
    return out if _call(_library_or_raise().mhc_forward, n, iters, [logits, out], FORWARD_BUFFERS) else None


def backward(logits: Tensor, grad: Tensor, n: int, iters: int) -> Tensor | None:
    """The gradient of forward(logits) for grad of its output (same shape); None for logits that need the log
    domain. Uses the library the forward used, whatever the switch says now."""
    reason = check_backward(logits, grad, n, iters)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    logits, grad = dense(logits), dense(grad)
    grad_logits = torch.empty_like(logits)
    ok = _call(_library_or_raise().mhc_backward, n, iters, [logits, grad, grad_logits], BACKWARD_BUFFERS)
    return grad_logits if ok else None


def mix_forward(x: Tensor, coef: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """u = H_pre x (tokens, C) and mixed = H_res x (tokens, n, C) of the streams x (tokens, n, C) and the
    coefficients coef (2n + n^2, tokens) = [H_pre; H_post; H_res] (H_post unused)."""
    reason = check_mix(x, coef, n)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    return mix_forward_checked(x, coef, n)


def mix_forward_checked(x: Tensor, coef: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``mix_forward`` for arguments ``check_mix(x, coef, n)`` has accepted (the caller checked them: a decoding
    step would check them twice)."""
    x, coef = dense(x), dense(coef)
    u, mixed = x.new_empty(x.size(0), x.size(2)), torch.empty_like(x)
    _call(_library_or_raise().mhc_mix_forward, n, 0, [x, coef, u, mixed], MIX_FORWARD_BUFFERS,
          dims=(n, x.size(0), x.size(2)))  # fmt: skip
    return u, mixed


def mix_backward(x: Tensor, coef: Tensor, grad_u: Tensor, grad_mixed: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_coef) of mix_forward for grad_u and grad_mixed; grad_coef's H_post rows are zero."""
    reason = check_mix_backward(x, coef, grad_u, grad_mixed, n)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    x, coef, grad_u, grad_mixed = map(dense, (x, coef, grad_u, grad_mixed))
    grad_x, grad_coef = torch.empty_like(x), torch.empty_like(coef)
    _call(_library_or_raise().mhc_mix_backward, n, 0, [x, coef, grad_u, grad_mixed, grad_x, grad_coef],
          MIX_BACKWARD_BUFFERS, dims=(n, x.size(0), x.size(2)))  # fmt: skip
    return grad_x, grad_coef


def check_post(mixed: Tensor, post: Tensor, out: Tensor, n: int, name: str = "mixed") -> str | None:
    """Why the depth-connection kernel cannot take these inputs, or None: mixed (tokens, n, C), post (n, tokens)
    and out (tokens, C), float32 strided CPU tensors, 1 <= n <= MAX_N, 1 to MAX_TOKENS tokens, 1 <= C <=
    MAX_WIDTH. n is given (an int; under tracing the shapes are tensors); ``name``: mixed's argument name (the
    backward's grad)."""
    if _streams_fit(mixed, n) and ok(post) and ok(out):
        tokens, _, width = mixed.shape
        if post.shape == (n, tokens) and out.shape == (tokens, width):
            return None  # the common case in the fewest tests
    reason = check_mix(mixed, None, n, name)
    if reason is not None:
        return reason
    tokens, width = mixed.shape[0], mixed.shape[2]
    return first(tensor("post", post, (n, tokens), f" for {name} of shape {tuple(mixed.shape)}"),
                 tensor("out", out, (tokens, width), f" for {name} of shape {tuple(mixed.shape)}"))  # fmt: skip


def usable_post(mixed: Tensor, post: Tensor, out: Tensor, n: int) -> bool:
    """Whether the depth-connection kernel is on, can be had, and takes these inputs (``check_post``)."""
    return _enabled and check_post(mixed, post, out, n) is None and _available()


def post_forward(mixed: Tensor, post: Tensor, out: Tensor, n: int) -> Tensor:
    """mixed + H_post^T out per token: (tokens, n, C) from mixed (tokens, n, C), post (n, tokens), out (tokens,
    C)."""
    reason = check_post(mixed, post, out, n)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    return post_forward_checked(mixed, post, out, n)


def post_forward_checked(mixed: Tensor, post: Tensor, out: Tensor, n: int) -> Tensor:
    """``post_forward`` for arguments ``check_post`` has accepted (the caller checked them)."""
    mixed, post, out = dense(mixed), dense(post), dense(out)
    new = torch.empty_like(mixed)
    _call(_library_or_raise().mhc_post_forward, n, 0, [mixed, post, out, new], POST_FORWARD_BUFFERS,
          dims=(n, mixed.size(0), mixed.size(2)))  # fmt: skip
    return new


def post_backward(grad: Tensor, post: Tensor, out: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(grad_post (n, tokens), grad_out (tokens, C)) of post_forward for grad (tokens, n, C) of its result (the
    gradient of mixed is grad itself)."""
    reason = check_post(grad, post, out, n, "grad")
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    grad, post, out = dense(grad), dense(post), dense(out)
    grad_post, grad_out = torch.empty_like(post), torch.empty_like(out)
    _call(_library_or_raise().mhc_post_backward, n, 0, [grad, post, out, grad_post, grad_out],
          POST_BACKWARD_BUFFERS, dims=(n, grad.size(0), grad.size(2)))  # fmt: skip
    return grad_post, grad_out


def check_coefficients(v: Tensor, gain: Tensor, phi: Tensor, bias: Tensor, gates: Tensor, n: int,
                       iters: int, permutations: bool = False) -> str | None:  # fmt: skip
    """Why ``coefficients`` cannot take these inputs, or None: v (tokens, n C), gain (n C), phi (n C, K),
    bias (K), gates (3) with K = 2n + n^2 (mHC-lite, ``permutations``: 2n + n!, n <= MAX_LITE_N), float32
    strided CPU tensors, and n, iters, tokens and C in range."""
    max_n = MAX_LITE_N if permutations else MAX_N
    if (isinstance(n, int) and isinstance(iters, int) and 1 <= n <= max_n and 1 <= iters <= MAX_ITERS and ok(v)
            and ok(gain) and ok(phi) and ok(bias) and ok(gates) and v.dim() == 2):  # fmt: skip
        (tokens, nc), k = v.shape, 2 * n + (_FACTORIAL[n] if permutations else n * n)
        if (1 <= tokens <= MAX_TOKENS and nc % n == 0 and 1 <= nc // n <= MAX_WIDTH and gain.shape == (nc,)
                and phi.shape == (nc, k) and bias.shape == (k,) and gates.shape == (3,)):  # fmt: skip
            return None  # the common case in the fewest tests
    if not isinstance(n, int) or not isinstance(iters, int) or not 1 <= n <= max_n or not 1 <= iters <= MAX_ITERS:
        return f"n = {n!r} streams and {iters!r} iterations (the kernel takes 1 to {max_n} and 1 to {MAX_ITERS})"
    reason = first(*(kind(name, t) for name, t in (("v", v), ("gain", gain), ("phi", phi), ("bias", bias),
                                                     ("gates", gates))))  # fmt: skip
    if reason is not None:
        return reason
    k = 2 * n + (math.factorial(n) if permutations else n * n)
    if v.dim() != 2 or not 1 <= v.size(0) <= MAX_TOKENS or v.size(1) % n or not 1 <= v.size(1) // n <= MAX_WIDTH:
        return f"v of shape {tuple(v.shape)} (allowed: (1 to {MAX_TOKENS} tokens, n C), C 1 to {MAX_WIDTH}, n = {n})"
    what = f" for n C = {v.size(1)} and K = {k}"
    return first(tensor("gain", gain, (v.size(1),), what), tensor("phi", phi, (v.size(1), k), what),
                 tensor("bias", bias, (k,), what), tensor("gates", gates, (3,)))  # fmt: skip


def coefficients(v: Tensor, gain: Tensor, phi: Tensor, bias: Tensor, gates: Tensor, n: int, iters: int,
                 eps: float, permutations: bool = False, weight: Tensor | None = None,
                 checked: bool = False) -> tuple[Tensor, bool]:  # fmt: skip
    """Without autograd: (out, True) with out = [H_pre; H_post; H_res] (2n + n^2, tokens) of the streams v
    (tokens, n C) as mhc.py computes them, or (logits, False) for logits that need the log domain (mHC only;
    mHC-lite, ``permutations``, has no iteration). The product with gain phi is torch's (MKL), the rest one
    kernel call; ``weight``: (gain phi)^T already computed (the caller keeps it while the parameters are
    unchanged); ``checked``: the caller has just run ``check_coefficients`` on these arguments."""
    reason = None if checked else check_coefficients(v, gain, phi, bias, gates, n, iters, permutations)
    if reason is not None:
        raise ValueError(f"the mHC kernel cannot take {reason}")
    v = dense(v.detach())
    if weight is None or kind("weight", weight) is not None or weight.shape != phi.shape[::-1]:
        weight = (phi.detach() * gain.detach().unsqueeze(-1)).t()
    raw = torch.mm(weight, v.t())  # (K, tokens), contiguous
    buffers = [v, raw, dense(bias.detach()), dense(gates.detach())]
    out = v.new_empty(2 * n + n * n, v.size(0))
    lib = _library_or_raise()
    fn = lib.mhc_lite_coefficients if permutations else lib.mhc_coefficients
    ok = _call(fn, n, 0, [*buffers, out], COEF_BUFFERS,
               dims=(n, v.size(0), v.size(1) // n, iters), extra=(eps,))  # fmt: skip
    return out, ok


def usable_coefficients(v: Tensor, gain: Tensor, phi: Tensor, bias: Tensor, gates: Tensor, n: int,
                        iters: int, permutations: bool = False) -> bool:  # fmt: skip
    """Whether the kernel is on, can be had, and ``coefficients`` takes these inputs."""
    return (_enabled and check_coefficients(v, gain, phi, bias, gates, n, iters, permutations) is None
            and _available())  # fmt: skip
