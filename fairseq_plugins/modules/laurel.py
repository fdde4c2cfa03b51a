"""LAuReL, the learned augmented residual connection (Menghani et al., "LAuReL: Learned Augmented Residual
Layer", arXiv:2411.07501; ICML 2025 text, sections 2.1-2.4, 3.2-3.3).

General form (eq. 2): x_{i+1} = alpha f(x_i) + g(x_i, x_{i-1}, ..., x_0), x_j the output of the j-th LAuReL
connection (x_0 = the embedding output). The variants implemented:

    RW (2.1):  x_{i+1} = alpha f(x_i) + beta x_i                                  alpha, beta learned scalars
    LR (eq. 3): x_{i+1} = f(x_i) + B A x_i + x_i                                  A: r x D, B: D x r
    PA (eq. 4): x_{i+1} = f(x_i) + x_i + sum_{j=0..k-1} g_{i,j} h_i(x_{i-j})     h_i(x) = B_i A_i x (low rank)

Placement: one LAuReL per transformer layer, around the whole layer (the paper's 1B model counts 2N RW
parameters for N layers): f(x_i) = layer(x_i) - x_i, the sum of the layer's sub-block outputs, with the
layer's inner skip (around self-attention, and cross-attention in the decoder) unchanged. A fairseq Pre-LN layer
returns y_i = x_i + f(x_i), so the variants are computed from y_i without forming the difference:
RW x_{i+1} = alpha y_i + (beta - alpha) x_i; LR x_{i+1} = y_i + B A x_i; PA x_{i+1} = y_i + B A s_i with
s_i = sum_j g_{i,j} x_{i-j} (h_i is linear, so one low-rank product per layer serves all k terms). In the
first layers PA uses the x_{i-j} that exist (j <= i).

Initialisation and choices the paper leaves open (its RW normalisation and init, PA's g init, the exact
placement: UNCONFIRMED, no authors' code):
- RW: ``--laurel-rw-norm softmax`` (default) bounds them as the paper says is needed in practice (section 2.1:
  softmax or sigmoid), (alpha, beta) = softmax(logits), logits 0: alpha = beta = 0.5 at initialisation, which
  is not the baseline; ``none`` learns alpha and beta directly from alpha = beta = 1, so the model starts as
  its Pre-LN transformer (the default until issue 26; checkpoints record their choice and keep it).
- LR and PA: B = 0 (the model starts as its Pre-LN transformer); A is the paper's LLM initialisation,
  column-orthogonal A_{j,i} = 1/sqrt(rD) if i mod r = j, else 0 (written in our r x D orientation: the paper's
  shapes in section 2.2 and eq. 3 disagree).
- PA: g_{i,j} = 1 at initialisation (with B = 0 the model is still the baseline, and B receives gradients
  from the first step; g = 0 would leave B without gradient).
"""

import math

import torch
from torch import Tensor, nn

from .carry import Carry

VARIANTS = ("rw", "lr", "pa")
RW_NORMS = ("none", "softmax")


def column_orthogonal_(down: Tensor) -> Tensor:
    """The paper's LLM init of the D x r factor, A_{j,i} = 1/sqrt(rD) if i mod r = j, as an r x D matrix."""
    rank, dim = down.shape
    with torch.no_grad():
        down.zero_()
        down[torch.arange(dim) % rank, torch.arange(dim)] = 1.0 / math.sqrt(rank * dim)
    return down


class LaurelConnection(nn.Module):
    """One LAuReL connection, around one transformer layer.

    Args:
        variant: ``rw``, ``lr`` or ``pa``.
        embed_dim: D.
        rank: r of the low-rank product B A (``lr``, ``pa``).
        pa_k: k, the earlier streams PA mixes (``pa``).
        rw_norm: ``none`` or ``softmax`` (``rw``).
    """

    def __init__(self, variant: str, embed_dim: int, rank: int = 32, pa_k: int = 3, rw_norm: str = "softmax"):
        super().__init__()
        if variant not in VARIANTS or rw_norm not in RW_NORMS:
            raise ValueError(f"LAuReL variant must be in {VARIANTS} and rw_norm in {RW_NORMS}")
        self.variant, self.rw_norm = variant, rw_norm
        if variant == "rw":
            # (alpha, beta), or their softmax logits
            self.rw = nn.Parameter(torch.zeros(2) if rw_norm == "softmax" else torch.ones(2))
        else:
            self.down = nn.Parameter(column_orthogonal_(torch.empty(rank, embed_dim)))  # A
            self.up = nn.Parameter(torch.zeros(embed_dim, rank))  # B
        if variant == "pa":
            self.gamma = nn.Parameter(torch.ones(pa_k))  # g_{i,0..k-1}, g_{i,0} for x_i itself

    def residual_weights(self) -> Tensor:
        """(alpha, beta) of RW."""
        return self.rw.softmax(0) if self.rw_norm == "softmax" else self.rw

    def low_rank(self, x: Tensor) -> Tensor:
        """B A x for x (..., D)."""
        return (x @ self.down.t()) @ self.up.t()

    def forward(self, x: Tensor, y: Tensor, history: list[Tensor]) -> Tensor:
        """x_{i+1} from the layer input x = x_i, its output y = x_i + f(x_i), both `(seq_len, batch, embed_dim)`,
        and ``history`` = [..., x_{i-1}, x_i] (at least x_i; PA reads the last k)."""
        if self.variant == "rw":
            alpha, beta = self.residual_weights().to(y.dtype).unbind(0)
            return alpha * y + (beta - alpha) * x
        if self.variant == "lr":
            return y + self.low_rank(x)
        recent = history[::-1][: self.gamma.numel()]  # x_i, x_{i-1}, ...
        s = torch.tensordot(self.gamma[: len(recent)].to(y.dtype), torch.stack(recent), dims=1)
        return y + self.low_rank(s)


class LaurelCarry(Carry):
    """One LAuReL connection around every layer of a stack (modules/carry.py), the stack's ``laurel``: layer i's
    output y_i becomes x_{i+1} = LAuReL_i(x_i, y_i, history); the state is the history of streams x_0 .. x_i that
    PA reads (its last k entries). PA's history is per position, so incremental decoding rebuilds it at every step
    and caches only attention's keys and values, as for the baseline. ``options``: LaurelConnection's keyword
    arguments but ``embed_dim``."""

    version = "laurel"

    def __init__(self, options: dict):
        self.options = options
        self.keep = options["pa_k"] if options["variant"] == "pa" else 1

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        return {"laurel": nn.ModuleList(LaurelConnection(embed_dim=embed_dim, **self.options) for _ in range(layers))}

    def begin(self, stack: nn.Module, x: Tensor) -> list[Tensor]:
        return [x]

    def layer_input(self, stack: nn.Module, idx: int, x: Tensor, state: list[Tensor]) -> Tensor:
        return x

    def after_layer(self, stack: nn.Module, idx: int, x: Tensor, y: Tensor, state: list[Tensor]):
        x = stack.laurel[idx](x, y, state)
        return x, [*state, x][-self.keep :]
