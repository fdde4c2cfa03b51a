"""nGPT's normalized Transformer (Loshchilov, Hsieh, Sun, Ginsburg, "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere", ICLR 2025, arXiv:2410.01131; authors' code NVIDIA/ngpt ``model.py``
and ``train.py`` at ed19eb2, cited M:line / T:line as issue 54 item 6a's design note read them; the facts below
re-read in model.py at 8b9fa27).

Every hidden state lives on the unit sphere, Norm(x) = x / ||x||_2 over the embedding dimension C, and each
sublayer moves it a learned, per-dimension step towards the sublayer's normalised output (M:145-153, 169-177):

    h <- Norm( Norm(h) + |alpha_eff| * (Norm(h_F) - Norm(h)) )      h_F = F(h), F without input norm (M:81-83)

The scaled parameters are stored at ``scale`` and used times ``init / scale`` (M:86-100, 239-241), which sets
their effective learning rate under Adam (the paper's section on effective learning rates):

    alpha (per site, C)  init 0.05 (--ngpt-alpha-init), scale 1/sqrt(C) (--ngpt-alpha-scale)    M:86-92
    s_qk (attention, C)  init 1, scale 1/sqrt(C); q <- s_qk Norm_head(q), k <- s_qk Norm_head(k)  M:94-96, 129-131
    s_v (FFN, C_ffn)     init 1, scale 1, times sqrt(C) on fc1's output, before the activation    M:98-100, 160-161
    s_z (output, V)      init 1, scale 1/sqrt(C); logits <- s_z_eff * (E_out h)                    M:239-241, 284-285

Attention: no biases (T:78), the softmax scale sqrt(d_h) instead of 1/sqrt(d_h) (M:133-135). s_qk enters only
through q.k = sum_i s_qk,i^2 Norm(q)_i Norm(k)_i, so ``SphereQK`` puts s_qk_eff^2 on the query and leaves the key
a bare per-head unit vector: the same function and the same gradients, one parameter, and the incremental cache
holds unit keys. Logits: no stack-final norm (M:243-244 is the baseline's). Weights (T:394-411, 499-500): every
matrix is projected onto the sphere along C after every optimizer step and once after its init (N(0, 1/C),
M:259-265): embeddings, output table, q/k/v/fc1 per row, the attention output and fc2 per column.

What is in, and how it lives in fairseq (decisions of the design note):
- the site update ``SphereUpdate`` (one per sublayer site, cross-attention included: alpha_C, same constants),
  joined through the ``--residual`` axis's ``combine(site, x, residual)`` hook, sublayer norms dropped;
- ``SphereQK`` (q_proj/k_proj of every attention, keeping the Linear's ``weight`` name), the attention's
  ``scaling`` set to sqrt(d_h), every Linear of the layers bias-free; ``ScaledActivation`` (s_v) in place of the
  layer's ``activation_fn`` function attribute; ``SphereLogits`` around the decoder's output projection (it keeps
  the same ``weight`` Parameter, so fairseq's input/output tying survives); the stack-final LayerNorms removed;
- the weight projection ``SphereWeights``: a parameterless module on each stack, triggered by fairseq's own hooks,
  never a parametrisation (which would project the gradient instead, rename the state_dict keys and break the
  tied tables): ``set_num_updates(n)`` (FairseqTask.train_step calls it before every training forward; projected
  once per new n, so ``--update-freq`` and the encoder's repeat call redo nothing) and a switch to eval mode
  (validation, generation), plus once after the init. The rows are found at each call (after tying and
  value-residual surgery a projection may be shared; deduplicated by Parameter), normalised in float64, leaving
  fairseq's zero padding row zero and a vector already unit within its dtype's eps as it is (``project_``).

Encoder-decoder (ours; the paper is decoder-only): the encoder is an nGPT stack too (its output is unit per token,
what cross-attention reads); fairseq's scaled embedding plus sinusoidal positions stays (RoPE is the authors'
baseline's, not nGPT's): the first site's Norm(h) puts it on the sphere, and the first attention is invariant to
the scale of its input (q, k normalised, no biases, its output normalised). fairseq's FFN is ungated, so s_uv
becomes s_v on fc1's output before ``--activation-fn`` (the authors' SwiGLU is their baseline's too). Dropout
stays fairseq's, on the branch output before the update (the authors train with 0).

What stays out, and why: the authors' training recipe (lr 15e-4, no warm-up, weight decay 0: fairseq decays every
parameter, alpha and s included, so use ``--weight-decay 0`` as the authors), which is a command line, not a model.
Refused where the projection cannot be exact (axes/residual_sites.py ``NGPT.check``): fairseq's FP16Optimizer
(``--fp16``/``--bf16`` without ``--memory-efficient-*``) steps float32 master copies the projection cannot reach;
FSDP shards the rows; a depth aggregation that mixes layer outputs (the stream's owners), another --norm and
key-query tying (``NGPT.conflict``). Known gap: a checkpoint saved right after a step and before any eval holds the
un-projected weights; loading projects them (the trainer calls ``set_num_updates``).

Half precision: every norm (the stream's, the branch output's, each head's q and k) is computed in float32 (at
least) and cast back; the weight projection's norms in float64. Incremental decoding: every operation is per token;
nothing new is cached and nothing to reorder.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ALPHA_INIT = 0.05  # M:86-92 attn/mlp_alpha_init_value
EPS = 1e-12  # F.normalize's: a zero vector (a padding row or position) stays zero instead of NaN


def sphere(x: Tensor, dim: int = -1) -> Tensor:
    """x / max(||x||_2, eps) along ``dim``, computed in float32 at least and cast back."""
    acc = x.to(torch.promote_types(x.dtype, torch.float32))
    return F.normalize(acc, dim=dim, eps=EPS).to(x.dtype)


class SphereUpdate(nn.Module):
    """One site's update Norm(Norm(h) + |alpha_eff| (Norm(x) - Norm(h))), alpha_eff = stored * init / scale."""

    def __init__(self, embed_dim: int, init: float = ALPHA_INIT, scale: float | None = None):
        super().__init__()
        self.init = float(init)
        self.scale = float(scale) if scale is not None else embed_dim**-0.5
        self.alpha = nn.Parameter(torch.full((embed_dim,), self.scale))

    def effective(self) -> Tensor:
        return self.alpha * (self.init / self.scale)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """``x`` the (dropped-out) branch output, ``residual`` the stream h (fairseq's residual_connection order)."""
        # under autocast the branch output is half and the stream float32: the update runs in float32 (at least)
        out = torch.promote_types(x.dtype, residual.dtype)
        acc = torch.promote_types(out, torch.float32)
        h = F.normalize(residual.to(acc), dim=-1, eps=EPS)
        step = F.normalize(x.to(acc), dim=-1, eps=EPS)
        return F.normalize(torch.lerp(h, step, self.effective().abs().to(acc)), dim=-1, eps=EPS).to(out)

    def extra_repr(self) -> str:
        return f"{self.alpha.numel()}, init={self.init:g}, scale={self.scale:g}"


class SphereQK(nn.Module):
    """A q_proj/k_proj: each head's slice of x W^T normalised, the query's times s_qk_eff^2 (module docstring).

    Holds the Linear's ``weight`` under the same name (no bias); ``query`` True adds ``s_qk`` (init 1, stored at
    scale 1/sqrt(C), C the projection width)."""

    def __init__(self, linear: nn.Linear, num_heads: int, query: bool):
        super().__init__()
        if linear.out_features % num_heads:
            raise ValueError(f"projection width {linear.out_features} is not divisible by {num_heads} heads")
        self.in_features, self.out_features, self.num_heads = linear.in_features, linear.out_features, num_heads
        self.weight = linear.weight
        self.register_parameter("bias", None)
        self.scale = linear.out_features**-0.5
        if query:
            self.s_qk = nn.Parameter(torch.full((linear.out_features,), self.scale).to(linear.weight))
        else:
            self.register_parameter("s_qk", None)

    def forward(self, x: Tensor) -> Tensor:
        z = F.linear(x, self.weight)
        heads = sphere(z.reshape(*z.shape[:-1], self.num_heads, -1)).reshape(z.shape)
        if self.s_qk is None:
            return heads
        return heads * (self.s_qk / self.scale).square().to(z.dtype)  # s_qk_eff = stored * 1 / scale

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, heads={self.num_heads}"


class ScaledActivation(nn.Module):
    """act(u * s_v_eff * sqrt(C)), s_v of size C_ffn (init 1, scale 1): the layer's ``activation_fn``."""

    def __init__(self, activation, ffn_dim: int, embed_dim: int):
        super().__init__()
        self.activation, self.sqrt_c = activation, math.sqrt(embed_dim)
        self.s_v = nn.Parameter(torch.ones(ffn_dim))

    def forward(self, u: Tensor) -> Tensor:
        return self.activation(u * (self.s_v * self.sqrt_c).to(u.dtype))


class SphereLogits(nn.Module):
    """s_z_eff * (h E_out^T), s_z of size V (init 1, stored at 1/sqrt(C)); keeps the projection's ``weight``."""

    def __init__(self, projection: nn.Linear):
        super().__init__()
        vocab, dim = projection.weight.shape
        self.weight = projection.weight
        self.scale = dim**-0.5
        self.s_z = nn.Parameter(torch.full((vocab,), self.scale).to(projection.weight))

    def forward(self, h: Tensor) -> Tensor:
        return F.linear(h, self.weight) * (self.s_z / self.scale).to(h.dtype)


def stack_matrices(stack: nn.Module) -> list[tuple[Tensor, int]]:
    """(matrix, the dim of C it is normalised over) of every weight on the sphere in ``stack``: the embedding and
    output tables and q/k/v/fc1 per row (over dim 1, their input C), the attention output and fc2 per column (over
    dim 0, their output C); each Parameter once."""
    found, seen = [], set()

    def add(module, dim):
        weight = getattr(module, "weight", None)
        if isinstance(weight, Tensor) and weight.dim() == 2 and id(weight) not in seen:
            seen.add(id(weight))
            found.append((weight, dim))

    add(getattr(stack, "embed_tokens", None), 1)
    add(getattr(stack, "output_projection", None), 1)
    for layer in getattr(stack, "layers", None) or ():
        for attn in (getattr(layer, "self_attn", None), getattr(layer, "encoder_attn", None)):
            if attn is not None:
                for name in ("q_proj", "k_proj", "v_proj"):
                    add(getattr(attn, name), 1)
                add(attn.out_proj, 0)
        add(layer.fc1, 1)
        add(layer.fc2, 0)
    return found


@torch.no_grad()
def project_(stack: nn.Module) -> None:
    """Put every matrix of ``stack`` on the sphere along C (T:394-411), in place.

    A vector whose norm (in float64) is already 1 within its dtype's eps is left as it is: such a vector is the
    rounded result of an earlier projection (rounding moves a norm by at most eps / 2), so projecting it again
    would only move it by an ulp. This makes the projection idempotent bitwise: a repeated eval, a loaded
    checkpoint, the hub's ``eval()`` compute with exactly the weights saved. Any other vector (an optimizer step
    moves a norm by far more, and half-precision weights stay within eps of 1) is divided by its norm; a zero
    vector (a padding row) stays zero."""
    for weight, dim in stack_matrices(stack):
        norms = torch.linalg.vector_norm(weight, dim=dim, keepdim=True, dtype=torch.float64)
        off = ((norms - 1).abs() > torch.finfo(weight.dtype).eps) & (norms > 0)
        if off.any():
            weight.copy_(torch.where(off, weight.double() / norms, weight.double()).to(weight.dtype))


class SphereWeights(nn.Module):
    """The per-step weight projection of one stack, triggered by fairseq's hooks (module docstring). No
    parameters, no state_dict entries. Its stack (its parent module) is a plain attribute, not a submodule: no
    recursion, and ``copy.deepcopy`` (fairseq's EMA) maps it to the copied stack (a weakref would keep pointing
    at the original's)."""

    def __init__(self, stack: nn.Module):
        super().__init__()
        object.__setattr__(self, "_stack", stack)
        self.last_update: int | None = None

    def project(self) -> None:
        project_(self._stack)

    def set_num_updates(self, num_updates: int) -> None:
        if num_updates != self.last_update:  # once per optimizer step: the same n again changes nothing
            self.last_update = num_updates
            self.project()

    def train(self, mode: bool = True):
        if not mode and self.training:  # a switch to eval: validation, generation and EMA see unit weights
            self.project()
        return super().train(mode)


def sphere_layer_(layer: nn.Module, embed_dim: int) -> None:
    """Turn a fairseq layer (its sublayer norms already dropped) into an nGPT layer, in place."""
    for attn in (getattr(layer, "self_attn", None), getattr(layer, "encoder_attn", None)):
        if attn is None:
            continue
        attn.q_proj = SphereQK(attn.q_proj, attn.num_heads, query=True)
        attn.k_proj = SphereQK(attn.k_proj, attn.num_heads, query=False)
        attn.v_proj.bias = None
        attn.out_proj.bias = None
        attn.scaling = attn.head_dim**0.5  # M:133-135; fairseq multiplies q by it in forward
        attn._set_skip_embed_dim_check()  # the fused path would read q/k_proj.weight and skip the norms
    layer.fc1.bias = None
    layer.fc2.bias = None
    layer.activation_fn = ScaledActivation(layer.activation_fn, layer.fc1.out_features, embed_dim)


def sphere_model_(model: nn.Module) -> None:
    """The model-level parts (in the model's ``__init__``, so a loaded checkpoint has the same structure): no
    stack-final norms, ``SphereLogits``, a ``SphereWeights`` on each stack that has layers."""
    for side in ("encoder", "decoder"):
        stack = getattr(model, side, None)
        if not getattr(stack, "layers", None):
            continue
        if getattr(stack, "layer_norm", None) is not None:  # fairseq's forward skips a None final norm
            stack.layer_norm = None
        projection = getattr(stack, "output_projection", None)
        if isinstance(projection, nn.Linear):
            stack.output_projection = SphereLogits(projection)
        stack.sphere_weights = SphereWeights(stack)


@torch.no_grad()
def initialize_(model: nn.Module) -> None:
    """The authors' init (M:259-265): every matrix N(0, 1/C), then the projection (padding rows stay zero)."""
    for side in ("encoder", "decoder"):
        stack = getattr(model, side, None)
        if not getattr(stack, "layers", None):
            continue
        for weight, dim in stack_matrices(stack):
            zero_rows = weight.abs().sum(dim=1) == 0  # fairseq's padding row of an embedding
            weight.normal_(0.0, weight.shape[dim] ** -0.5)
            weight[zero_rows] = 0
        stack.sphere_weights.project()
