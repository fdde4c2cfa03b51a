"""Learned linear combinations of earlier layer outputs: DenseFormer's depth-weighted averages and DLCL.

Both read a per-token stack of earlier outputs (modules/depth_stack.py's ``DepthStack``: written once into a
preallocated buffer, read as windows) and return one weighted sum per layer. The layers themselves stay
fairseq's ordinary Pre-LN layers.

DenseFormer (Pagliardini et al., "DenseFormer: Enhancing Information Flow in Transformers via Depth
Weighted Averaging", arXiv:2402.02622, sections 3, 3.1-3.3). X_0 = embedding output, B_i = block i:

    X_i = B_i(Y_{i-1}),   Y_0 = X_0
    Y_i = sum_{j in S_i} a_{i,j} X_j     if i mod p = 0  (a depth-weighted average, DWA)
    Y_i = X_i                            otherwise
    S_i = {j <= i : j = i mod k}         dilation k (section 3.3)
    output = LN_final(Y_L)

DWA i has floor(i/k) + 1 weights, initialised to 0 except a_{i,i} = 1, so at initialisation Y_i = X_i and the
model is exactly its Pre-LN transformer. With period p > 1 every X_j is still stored and read (the paper's
section 3.3 example: k = p = 4, DWA 8 sees X_0, X_4, X_8); the authors' experiment code, which stores only the
DWA points' outputs, differs there. ``kxp`` = 1x1 is the full DenseFormer, the DCA paper's baseline.
One DWA set per stack (encoder and decoder each their own) is our reading; the paper is decoder-only.

DLCL (Wang et al., "Learning Deep Transformer Models for Machine Translation", ACL 2019, section 3.2; the
authors' code ``fairseq/modules/dlcl.py``), Pre-LN form. y_0 = embedding output, y_k = output of layer k:

    x_{l+1} = sum_{k=0..l} W[l,k] LN_k(y_k)          input of layer l+1; LN_0 = identity
    output  = LN_final(sum_{k=0..L} W[L,k] LN_k(y_k))

W is a learned lower-triangular (L+1) x (L+1) matrix of scalars, no softmax; init ``avg`` (row l = 1/(l+1)
on 0..l, the authors' default) or ``one`` (all 1). LN_1 .. LN_L are L new LayerNorms. DLCL is not the
identity at initialisation (the paper's design: every layer starts from the average of the earlier ones).
The upper triangle of W is stored (zero) but never read.

Each is declared to the one stack (modules/carry_stack.py) by its carry (modules/carry.py): ``DenseFormerCarry``
and ``DLCLCarry`` below, on the residual axis's layers. Incremental decoding: the combinations are per position,
so the stack is rebuilt from the current position's embedding at every step; beam search caches only attention's
keys and values, as for the baseline.
"""

import torch
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from .carry import Carry
from .depth_stack import DepthStack

DLCL_INITS = ("avg", "one")


def _combine(weights: Tensor, entries: Tensor) -> Tensor:
    """sum_j weights[j] * entries[j]; entries: (n, seq_len, batch, embed_dim)."""
    return torch.tensordot(weights.to(entries.dtype), entries, dims=1)


def dwa_points(num_layers: int, period: int) -> list[int]:
    """The blocks i (1-based) followed by a depth-weighted average."""
    return [i for i in range(1, num_layers + 1) if i % period == 0]


class DepthWeightedAverages(nn.Module):
    """DenseFormer's DWA modules of one stack (encoder or decoder).

    Args:
        num_layers: L, the blocks of the stack.
        dilation: k >= 1; DWA i reads X_j for j = i mod k, j <= i.
        period: p >= 1; a DWA follows block i only if i mod p = 0.
    """

    def __init__(self, num_layers: int, dilation: int = 1, period: int = 1):
        super().__init__()
        self.num_layers, self.dilation, self.period = num_layers, dilation, period
        self.weights = nn.ParameterDict()
        for i in dwa_points(num_layers, period):
            a = torch.zeros(i // dilation + 1)
            a[-1] = 1.0  # a_{i,i} = 1: Y_i = X_i at initialisation
            self.weights[str(i)] = nn.Parameter(a)

    # i found by arithmetic, not by its name str(i): under torch.compile a layer index can be a symbolic int,
    # which str() cannot take (a graph break); the weights of block i are the (i / p)-th, 1-based, in dwa_points
    def has(self, i: int) -> bool:
        return i % self.period == 0 and 1 <= i <= self.num_layers

    def forward(self, i: int, stack: Tensor) -> Tensor:
        """Y_i from the stack (i + 1, seq_len, batch, embed_dim) = [X_0, ..., X_i]."""
        weights = list(self.weights.values())[i // self.period - 1]
        return _combine(weights, stack[i % self.dilation :: self.dilation])


class DynamicLinearCombination(nn.Module):
    """DLCL's weights W and LayerNorms LN_1 .. LN_L of one stack (Pre-LN form).

    Args:
        num_layers: L.
        embed_dim: width of the LayerNorms.
        init: ``avg`` (row l = 1/(l+1)) or ``one`` (all ones) on the lower triangle.
    """

    def __init__(self, num_layers: int, embed_dim: int, init: str = "avg", export: bool = False):
        super().__init__()
        if init not in DLCL_INITS:
            raise ValueError(f"DLCL init must be one of {DLCL_INITS}, got {init!r}")
        w = torch.ones(num_layers + 1, num_layers + 1).tril()
        if init == "avg":
            w = w / w.sum(1, keepdim=True)
        self.weight = nn.Parameter(w)
        self.layer_norms = nn.ModuleList(LayerNorm(embed_dim, export=export) for _ in range(num_layers))

    def normalize(self, k: int, y: Tensor) -> Tensor:
        """LN_k(y_k) for a layer output (k >= 1); LN_0 is the identity."""
        return self.layer_norms[k - 1](y)

    def forward(self, row: int, stack: Tensor) -> Tensor:
        """sum_{k=0..row} W[row, k] entries[k]; stack (row + 1, seq_len, batch, embed_dim)."""
        return _combine(self.weight[row, : row + 1], stack)


class DenseFormerCarry(Carry):
    """Y_i = DWA_i(X_0 .. X_i) after the blocks i with i mod p = 0, else Y_i = X_i; the state is the DepthStack of
    every X_j, the stack's ``dwa`` its DepthWeightedAverages."""

    version = "denseformer"

    def __init__(self, dilation: int, period: int):
        self.dilation, self.period = dilation, period

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        return {"dwa": DepthWeightedAverages(layers, self.dilation, self.period)}

    def begin(self, stack: nn.Module, x: Tensor) -> DepthStack:
        return DepthStack(x, len(stack.layers))

    def layer_input(self, stack: nn.Module, idx: int, x: Tensor, state: DepthStack) -> Tensor:
        return x

    def after_layer(self, stack: nn.Module, idx: int, x: Tensor, y: Tensor, state: DepthStack):
        state.push(y)
        block = idx + 1
        return (stack.dwa(block, state.chunks()[0]) if stack.dwa.has(block) else state.last), state


class DLCLCarry(Carry):
    """Layer l+1 reads x_{l+1} = sum_k W[l,k] LN_k(y_k); the state is the DepthStack of LN_k(y_k) (y_0 = the
    embedding), the stack's ``dlcl`` its DynamicLinearCombination. ``export``: fairseq's LayerNorm choice
    (cfg.export)."""

    version = "dlcl"

    def __init__(self, init: str, export: bool = False):
        self.init, self.export = init, export

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        return {"dlcl": DynamicLinearCombination(layers, embed_dim, self.init, export=self.export)}

    def begin(self, stack: nn.Module, x: Tensor) -> DepthStack:
        return DepthStack(x, len(stack.layers))

    def layer_input(self, stack: nn.Module, idx: int, x: Tensor, state: DepthStack) -> Tensor:
        return stack.dlcl(idx, state.chunks()[0])

    def after_layer(self, stack: nn.Module, idx: int, x: Tensor, y: Tensor, state: DepthStack):
        state.push(stack.dlcl.normalize(idx + 1, y))
        return y, state

    def end(self, stack: nn.Module, x: Tensor, state: DepthStack) -> Tensor:
        return stack.dlcl(len(stack.layers), state.chunks()[0])
