"""mHC, manifold-constrained hyper-connections (Xie et al., DeepSeek, "mHC: Manifold-Constrained
Hyper-Connections", arXiv:2512.24880 v2, sections 3-4, eq. 3 and 7-9, appendix A.1 table 5), and mHC-lite
(Yang & Gao, arXiv:2601.05732: the residual matrix as a convex combination of permutation matrices).

A token carries n streams x_l in R^{n x C} (the embedding replicated n times at the stack input). Every
sublayer (encoder: self-attention, FFN; decoder: self-attention, cross-attention, FFN) replaces x + F(x) by

    x_{l+1} = H_res x_l + H_post^T F(H_pre x_l)                          (eq. 3)

with F the Pre-LN sublayer dropout(F(LN(u))), u = H_pre x_l (width C). Coefficients per token (eq. 7-9):

    v  = vec(x_l) in R^{nC},   v' = RMSNorm(v)   (eps 1e-20, table 5; a learned gain of size nC, init 1)
    H~_pre = a_pre (v' phi_pre) + b_pre           phi_pre, phi_post in R^{nC x n}
    H~_post = a_post (v' phi_post) + b_post
    H~_res = a_res mat(v' phi_res) + b_res        phi_res in R^{nC x n^2}; no tanh (HC had one)
    H_pre = sigmoid(H~_pre),  H_post = 2 sigmoid(H~_post),  H_res = SK(H~_res)
    SK: M^0 = exp(H~_res), M^t = T_r(T_c(M^{t-1})) (columns, then rows), t_max = 20

so the rows of H_res sum to 1 exactly and its columns to Sinkhorn's tolerance. We iterate in the log domain
(subtracting logsumexp), which gives the same iterates as the paper's exp-then-divide without overflow.
mHC-lite (``residual="permutations"``): H_res = sum_k a_k P_k over the n! permutation matrices (itertools
order, index 0 = identity), a = softmax(a_res (v' phi_res) + b_res), phi_res in R^{nC x n!}: exactly doubly
stochastic, no iterations; everything else as mHC.

Constants: n = 4, gating factors a_pre = a_post = a_res = 0.01 (table 5), t_max = 20. phi = 0 at
initialisation (not stated by the paper; HC's and both reference codes' choice), so every coefficient starts
at its static part. All coefficient maths (RMSNorm, products with phi, sigmoid, Sinkhorn, softmax) runs in
float32 (the paper's table keeps coefficients fp32); the mixing itself runs in the streams' dtype.

Static init b (the mHC paper states none). ``bias_init="mhc_lite"`` (default since issue 55): the values of the
authors' line of code, FFTYYY/mhc-lite (its ``mhc.py`` and ``mhc_lite.py``, read at ea19775; the mHC-lite
authors' own code and their mHC): b_pre = b_post = +1 on stream k mod n and -1 elsewhere (``init_alpha0``,
``beta_init``), so H_pre = sigmoid(+-1) = 0.73 / 0.27 and H_post = 2 sigmoid(+-1) = 1.46 / 0.54; b_res = 0 on
the diagonal and -8 off it (``init_alpha1``; mHC-lite: 0 for the identity permutation, -8 for the others), so
H_res ~ I (0.99899 on the diagonal for n = 4; mHC-lite 0.99401). Not Pre-LN at initialisation: the
streams part from the first sublayer, stream k mod n receiving 1.46 F and the others 0.54 F. (The code draws k
at random per unit when no layer index is given, as its model.py does; here k is the sublayer's index, HC's
rule.) ``bias_init="preln"`` (the default before issue 55, ours): HC's initialisation (H_pre = e_{k mod n},
H_res = I, H_post = 1, site k) mapped through mHC's constraints: the same b_pre and b_res, b_post = 0 (H_post = 1
exactly); the branch input is then 0.73 x_k + 0.27 sum_others, which is 1.54 h when all streams equal h, and
the sublayer's LayerNorm removes the scale; any row-stochastic H_res maps equal streams to themselves. So at
initialisation every stream equals the Pre-LN state (up to LayerNorm's eps), and the asymmetric b_pre breaks
the symmetry between streams. ``bias_init="mixed"``:
preln's b_pre and b_post with H_res starting at SK(exp I), e / (e + n - 1) on the diagonal and 1 / (e + n - 1)
off it (0.475 / 0.175 for n = 4; lucidrains' mHCv2 start; mHC-lite: the permutation logits that give the same
matrix), so that the streams mix from the first step. Still the Pre-LN model at initialisation (H_res
doubly stochastic maps equal streams to themselves). Why it exists: from the 0 / -8 logits, the translation
study's mHC and mHC-lite gave each stream on average 0.4% of the others after 800 updates (the gradient
through a -8 logit is ~e^-8), so neither used the mixing (docs/study/new_ideas_e12d12).

Where the reference code departs from the paper (noted, not offered): lucidrains' ``mHCv2`` computes the
coefficients per stream from each stream's C-dim RMSNorm (fewer parameters), starts H_res at SK(exp I)
(0.475 / 0.175 for n = 4, not near I) and ends Sinkhorn on columns; mhc-lite also ends on columns and takes
``F.normalize`` (no eps) for the RMSNorm. We end on rows as the paper does.

Encoder-decoder decisions (ours; the paper is decoder-only):
- one unit per sublayer, cross-attention included, each with its own phi, b, a (``site`` counts sublayers
  through the stack, so b_pre's favoured stream rotates);
- separate stream sets per stack, each starting from its embedding replicated n times (``expand_streams``);
- the encoder output read by cross-attention: ``collapse_streams`` sums the streams, then the stack's final
  LayerNorm (HC's read-out, as ``hyper_connections.py``); ``order="norm_then_sum"`` is mhc-lite's LN-then-sum;
- dropout is part of F, before H_post (HC's algorithm applies dropout to the branch output);
- per position across depth: the coefficients of a token depend on its own streams only. Incremental decoding
  keeps fairseq's K/V caches unchanged (they are built from u); the n x C streams of the current step live
  only while the step's layers run, and beam reordering has nothing extra to reorder;
- weight decay: HC excludes the static parts; b, a and the gain should be excluded (the optimiser's business).

Interface: ``ManifoldHyperConnection(embed_dim, rate=4, site=0, residual="sinkhorn", ...)``;
``forward(streams, sublayer)`` with streams `(seq_len, batch, n, embed_dim)` and ``sublayer`` mapping u
`(seq_len, batch, embed_dim)` to dropout(F(LN(u))); returns the new streams. In the model: ``StreamCarry``
(hyper-connections' carry, modules/carry.py's interface; modules/carry_stack.py runs it).
"""

import contextlib
import itertools
import math

import torch
from torch import Tensor, nn

from ..kernels import mhc_kernel, mhc_ops
from ..kernels.sinkhorn import (  # noqa: F401  (NO_DOUBLE_BACKWARD: read here by the declarations and tests)
    NO_DOUBLE_BACKWARD,
    SINKHORN_ITERS,
    gates_pytorch,
    sinkhorn_tokens_last,
)
from .carry import Carry
from .parameter_cache import DerivedFromParameters
from .skinny import post_add, rms_project_t

RESIDUALS = ("sinkhorn", "permutations")
BIAS_INITS = ("preln", "mhc_lite", "mixed")
COLLAPSE_ORDERS = ("sum_then_norm", "norm_then_sum")
GATE_INIT = 0.01
RMS_EPS = 1e-20
OFF_DIAGONAL_LOGIT = -8.0

# exp-then-divide (the C kernel's iteration, kernels/mhc_cpu.c) needs every iterate's entries representable:
# with the logits of a matrix within a spread s, every entry of every iterate stays >= exp(-2 s) / n^2 (cross
# ratios are invariant under the scalings), a normal float32 for s <= 30 at any n <= MAX_RATE. |logits| <= 15
# bounds the spread by 30 (and exp by 3.3e6); the kernel sends larger logits to the PyTorch code (log domain)
MAX_EXP_LOGIT = 15.0


def _no_autocast(device_type: str):
    """Autocast off inside the block; a no-op context where it is off already (entering and leaving
    torch.autocast costs about 10 us each: three times per unit, most of a decoding step's Python time)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def sinkhorn(logits: Tensor, iters: int = SINKHORN_ITERS) -> Tensor:
    """SK(logits) of eq. 9 over the last two dims: exp, then ``iters`` x (columns, then rows)."""
    lead, (n, m) = logits.shape[:-2], logits.shape[-2:]
    tokens_last = logits.reshape(-1, n, m).permute(1, 2, 0)
    return sinkhorn_tokens_last(tokens_last, iters).permute(2, 0, 1).reshape(*lead, n, m)


def permutation_matrices(n: int) -> Tensor:
    """The n! permutation matrices (n!, n, n) in itertools order; index 0 is the identity."""
    perms = torch.tensor(list(itertools.permutations(range(n))))
    return torch.eye(n)[perms]


def mixed_permutation_logits(n: int) -> Tensor:
    """mHC-lite's static logits whose H_res = sum_k softmax(b)_k P_k is SK(exp I), e / (e + n - 1) on the
    diagonal: b = log x for the identity and 0 for the other n! - 1 permutations, of which (n - 1)! - 1 keep a
    given stream in place, so the diagonal is (x + (n - 1)! - 1) / (x + n! - 1), solved for x (n = 4:
    x = 6e - 5); the off-diagonal entries follow, equal by symmetry."""
    logits = torch.zeros(math.factorial(n))
    if n > 1:
        diagonal = math.e / (math.e + n - 1)
        stay, others = math.factorial(n - 1) - 1, math.factorial(n) - 1
        logits[0] = math.log((diagonal * others - stay) / (1 - diagonal))
    return logits


def expand_streams(x: Tensor, rate: int) -> Tensor:
    """(seq_len, batch, C) -> (seq_len, batch, n, C): the stack input replicated n times."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], rate, x.shape[-1]).contiguous()


def collapse_streams(streams: Tensor, norm: nn.Module | None = None, order: str = "sum_then_norm") -> Tensor:
    """The stack output: the sum of the n streams, then ``norm`` (or each stream normed, then summed)."""
    if order not in COLLAPSE_ORDERS:
        raise ValueError(f"stream collapse order must be one of {COLLAPSE_ORDERS}, got {order!r}")
    if norm is None:
        return streams.sum(-2)
    return norm(streams.sum(-2)) if order == "sum_then_norm" else norm(streams).sum(-2)


class StreamCarry(Carry):
    """n streams per token, hyper-connections' carry, which mHC keeps (modules/carry.py's interface): H^0 = the
    embedding output replicated n times (``expand_streams``), each layer's output (fairseq's ``inner_states``)
    the sum of the streams, the stack output the last layer's, before the final LayerNorm. Site k is
    ``connection(embed_dim, n, k, **options)``: ``HyperConnection`` (hyper_connections.py) or
    ``ManifoldHyperConnection``.

    The streams are a dimension next to the features, not folded into the batch, so attention, its incremental
    cache and beam search's reordering see the batch only. They are per position: incremental decoding rebuilds
    them from the current position's embedding at every step and caches only attention's keys and values."""

    def __init__(self, rate: int, connection: type[nn.Module], **options):
        self.rate, self.connection, self.options = rate, connection, options

    def site(self, embed_dim: int, index: int) -> nn.Module:
        return self.connection(embed_dim, self.rate, index, **self.options)

    def begin(self, stack: nn.Module, x: Tensor) -> Tensor:
        # a contiguous copy laid out as every layer's output, not an expanded view of the transposed embedding:
        # torch.compile guards on strides, so a compiled run_layer (and layer) would be compiled once for the
        # first layer's view and again for the later layers' outputs, in training and at every decoding step.
        # The first site's reshape to (tokens, n, C) copied the view anyway (but at one position): the same
        # outputs and gradients bit for bit, the C kernels on and off
        return expand_streams(x, self.rate)

    def layer_output(self, state: Tensor) -> Tensor:
        return state.sum(2)


class ManifoldHyperConnection(DerivedFromParameters):
    """The mHC (or mHC-lite) unit of one sublayer.

    Args:
        embed_dim: C.
        rate: n, the number of streams (mHC-lite needs n! coefficients: n <= 5).
        site: k, the sublayer's index in its stack (b_pre favours stream k mod n).
        residual: ``sinkhorn`` (mHC) or ``permutations`` (mHC-lite).
        sinkhorn_iters: t_max (``sinkhorn`` only).
        bias_init: ``mhc_lite`` (the authors' code), ``preln`` or ``mixed`` (see the module docstring).
        gate_init: the initial a_pre, a_post, a_res.
    """

    def __init__(self, embed_dim: int, rate: int = 4, site: int = 0, residual: str = "sinkhorn",
                 sinkhorn_iters: int = SINKHORN_ITERS, bias_init: str = "mhc_lite", gate_init: float = GATE_INIT,
                 rms_eps: float = RMS_EPS):
        super().__init__()
        if residual not in RESIDUALS or bias_init not in BIAS_INITS:
            raise ValueError(f"mHC residual must be one of {RESIDUALS} and bias_init one of {BIAS_INITS}")
        if rate < 1 or (residual == "permutations" and rate > 5):
            raise ValueError(f"mHC rate must be >= 1 (<= 5 with permutations: n! coefficients), got {rate}")
        if sinkhorn_iters < 1:
            raise ValueError(f"mHC sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
        self.rate, self.residual, self.iters, self.rms_eps = rate, residual, sinkhorn_iters, rms_eps
        n, k = rate, site % rate
        res_size = math.factorial(n) if residual == "permutations" else n * n
        self.gain = nn.Parameter(torch.ones(n * embed_dim))  # RMSNorm weight (the paper folds it into phi)
        self.phi = nn.Parameter(torch.zeros(n * embed_dim, 2 * n + res_size))  # [phi_pre | phi_post | phi_res]
        self.gates = nn.Parameter(torch.full((3,), float(gate_init)))  # a_pre, a_post, a_res
        b_pre = torch.full((n,), -1.0)
        b_pre[k] = 1.0
        b_post = b_pre.clone() if bias_init == "mhc_lite" else torch.zeros(n)
        if residual == "permutations":
            if bias_init == "mixed":
                b_res = mixed_permutation_logits(n)
            else:
                b_res = torch.full((res_size,), OFF_DIAGONAL_LOGIT)
                b_res[0] = 0.0  # the identity permutation
            self.register_buffer("perms", permutation_matrices(n), persistent=False)
        elif bias_init == "mixed":
            b_res = torch.eye(n).flatten()  # SK(exp I) = exp I / (e + n - 1): already doubly stochastic
        else:
            b_res = torch.full((n, n), OFF_DIAGONAL_LOGIT).fill_diagonal_(0.0).flatten()
        self.bias = nn.Parameter(torch.cat([b_pre, b_post, b_res]))
        # which of a_pre, a_post, a_res scales each coefficient (not state: derived from n and the residual)
        gate_index = torch.tensor([0] * n + [1] * n + [2] * res_size)
        self.register_buffer("gate_index", gate_index, persistent=False)

    def coefficients(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """H_pre (tokens, n), H_post (tokens, n), H_res (tokens, n, n), float32 (float64 for float64 input);
        views of the tokens-last coefficients the forward uses."""
        pre, post, res, _ = self._coefficients_tokens_last(streams)
        return pre.t(), post.t(), res.permute(2, 0, 1)

    def _coefficients_tokens_last(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """H_pre (n, tokens), H_post (n, tokens), H_res (n, n, tokens): the coefficient maths runs tokens last
        (the thin product's own layout), so that every operator covers contiguous rows of tokens. Also the
        fused kernel's [H_pre; H_post; H_res] (2n + n^2, tokens) of which the three are views, or None."""
        n = self.rate
        acc = torch.promote_types(streams.dtype, torch.float32)
        # autocast (the plugin's --autocast-dtype) would run these products in half precision
        with _no_autocast(streams.device.type):
            v = streams.reshape(-1, streams.shape[-2] * streams.shape[-1]).to(acc)
            # the direct kernel call is no operator: tracing and compilation take the operators below
            if not torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.compiler.is_compiling():
                decoded = self._coefficients_kernel(v)
                if decoded is not None:
                    return decoded
            # RMSNorm(v) phi = rsqrt(mean(v^2) + eps) * (v (gain phi)): the gain folded into phi (as the paper
            # does) and the scale applied to the n(2 + n) products, not to the nC inputs (two passes fewer
            # over the streams, forward and backward)
            proj = rms_project_t(v, self.gain.to(acc).unsqueeze(-1) * self.phi.to(acc), self.rms_eps)  # (K, tokens)
            # a_pre, a_post, a_res and b applied in one operator over all coefficients (they are many tiny
            # operators per sublayer otherwise)
            gates = self.gates.to(acc)[self.gate_index].unsqueeze(-1)
            logits = torch.addcmul(self.bias.to(acc).unsqueeze(-1), proj, gates)
            if self.residual == "sinkhorn" and mhc_kernel.usable(logits, n, self.iters):
                # sigmoids, exp and Sinkhorn per token in one fused kernel (kernels/mhc_cpu.c): 160 tiny
                # operator calls per unit in PyTorch, forward and backward
                out = mhc_ops.gates(logits, n, self.iters)
                return out[:n], out[n : 2 * n], out[2 * n :].view(n, n, -1), out
            pre_post = torch.sigmoid(logits[: 2 * n])
            pre, post = pre_post[:n], 2.0 * pre_post[n:]
            res_logits = logits[2 * n :]
            if self.residual == "permutations":
                # sum_k a_k P_k as one (n^2, n!) x (n!, tokens) product
                perms = self.perms.to(acc).flatten(1).t()
                res = (perms @ res_logits.softmax(0)).view(n, n, -1)
            else:
                res = sinkhorn_tokens_last(res_logits.view(n, n, -1), self.iters)
        return pre, post, res, None

    def _coefficients_kernel(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """Without autograd: the whole coefficient maths in one fused call (kernels/mhc_coef.c, mHC and mHC-lite;
        a decoding step's dozen small operator calls cost more than their arithmetic), or None where it does not
        run."""
        n, params, lite = self.rate, (self.gain, self.phi, self.bias, self.gates), self.residual == "permutations"
        if not mhc_kernel.usable_coefficients(v, *params, n, self.iters, lite):
            return None
        # (gain phi)^T, kept while gain and phi are unchanged (modules/parameter_cache.py): a decoding step would
        # otherwise multiply the nC x K matrix again in every unit
        weight = self.parameter_cache.get(
            (self.gain, self.phi), lambda: (self.phi.detach() * self.gain.detach().unsqueeze(-1)).t().contiguous())
        out, ok = mhc_kernel.coefficients(v, *params, n, self.iters, self.rms_eps, lite, weight)
        if not ok:  # the log domain: out holds the logits
            out = gates_pytorch(out, n, self.iters)
        return out[:n], out[n : 2 * n], out[2 * n :].view(n, n, -1), out

    def _decode(self, streams: Tensor, sublayer) -> Tensor | None:
        """``forward`` without autograd, tracing and autocast for float32 CPU streams the fused kernels take, every
        argument checked once (``forward`` checks each twice, once to choose the kernel and once in the call), and
        no autocast contexts or coefficient views: at a decoding step's 80 tokens the Python around a unit's three
        kernel calls cost as much as their arithmetic. The same calls, so the same numbers. None (before the
        sublayer runs) where it does not apply."""
        *lead, n, dim = streams.shape
        if streams.dtype != torch.float32 or torch.is_autocast_enabled(streams.device.type):
            return None
        flat = streams.reshape(-1, n, dim).contiguous()  # the first unit's streams are the embedding expanded
        v, params = flat.view(flat.shape[0], n * dim), (self.gain, self.phi, self.bias, self.gates)
        lite = self.residual == "permutations"
        if not (mhc_kernel.usable_coefficients(v, *params, n, self.iters, lite) and mhc_kernel.usable_mix(flat, n)):
            return None
        weight = self.parameter_cache.get(  # as _coefficients_kernel
            (self.gain, self.phi), lambda: (self.phi.detach() * self.gain.detach().unsqueeze(-1)).t().contiguous())
        coef, exact = mhc_kernel.coefficients(v, *params, n, self.iters, self.rms_eps, lite, weight, checked=True)
        if not exact:  # the log domain: coef holds the logits
            coef = gates_pytorch(coef, n, self.iters)
        u, mixed = mhc_kernel.mix_forward_checked(flat, coef, n)  # coef: the kernel's own (2n + n^2, tokens)
        out = sublayer(u.view(*lead, dim)).reshape(-1, dim).to(flat.dtype)  # as forward: the streams stay float32
        return depth_connection(mixed, coef[n : 2 * n], out, n).view(*lead, n, dim)

    def forward(self, streams: Tensor, sublayer) -> Tensor:
        if not torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            new = self._decode(streams, sublayer)
            if new is not None:
                return new
        *lead, n, dim = streams.shape
        flat = streams.reshape(-1, n, dim)
        pre, post, res, coef = self._coefficients_tokens_last(streams)
        # the streams are the residual stream: under autocast they keep their dtype (float32, as the plugin's
        # residual stream does by promotion) instead of dropping to half at the first mix
        with _no_autocast(streams.device.type):
            if mhc_kernel.usable_mix(flat, n):
                # H_pre x_l and H_res x_l per token in one pass over the streams (kernels/mhc_mix.c): a bmm of
                # (n + 1, n) x (n, C) matrices spends its time per matrix, not in the arithmetic
                if coef is None:  # mHC-lite, or the PyTorch gates
                    coef = torch.cat([pre, post, res.flatten(0, 1)])
                u, mixed = mhc_ops.mix(flat, coef, n)
                u = u.unsqueeze(1)
            else:
                # H_pre x_l and H_res x_l in one small product per token; split (not slicing) so that backward
                # joins the two gradients with one cat instead of zero-filling the (n + 1) x C block twice. The
                # cat also turns the tokens-last coefficients into the token-first (tokens, n + 1, n) bmm wants
                mix = torch.cat([pre.t().unsqueeze(1), res.permute(2, 0, 1)], 1).to(streams.dtype)
                u, mixed = torch.bmm(mix, flat).split([1, n], 1)
        out = sublayer(u.view(*lead, dim)).reshape(-1, dim).to(flat.dtype)
        with _no_autocast(streams.device.type):
            return depth_connection(mixed, post.to(streams.dtype), out, self.rate).view(*lead, n, dim)


def depth_connection(mixed: Tensor, post: Tensor, out: Tensor, n: int) -> Tensor:
    """H_res x + H_post^T F per token (tokens, n, C), for mixed = H_res x (tokens, n, C), post = H_post
    (n, tokens) tokens last and the branch output out (tokens, C); also hyper-connections' depth connection. The
    fused kernel (kernels/mhc_post.c) where it runs: PyTorch's backward is two bmm of one (n, C) x (C, 1) and
    one (1, n) x (n, C) product per token, whose time is the per-matrix overhead."""
    if mhc_kernel.usable_post(mixed, post, out, n):
        if not torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            return mhc_kernel.post_forward_checked(mixed, post, out, n)  # just checked: not again
        return mhc_ops.post_add(mixed, post, out, n)
    return post_add(mixed, post.t().unsqueeze(-1), out.unsqueeze(1))
