"""DyT (arXiv:2503.10622) and Derf (arXiv:2512.10938) as LayerNorm replacements: the equations in float64,
the authors' initialisation, LayerNorm's constructor signature, and a 36-layer Pre-LN stack in half precision."""

import pytest
import torch
from fairseq.modules import LayerNorm

from fairseq_plugins.modules.derf import DynamicErf
from fairseq_plugins.modules.dyt import DynamicTanh

from .new_ideas_common import DIM, HALF, assert_finite, branch_weights, random_input

NORMS = [DynamicTanh, DynamicErf]


def direct(norm, x):
    """The papers' equations with the module's parameters, float64."""
    a, g, b = norm.alpha.double(), norm.weight.double(), norm.bias.double()
    if isinstance(norm, DynamicTanh):
        return g * torch.tanh(a * x) + b
    return g * torch.erf(a * x + norm.shift.double()) + b


@pytest.mark.parametrize("cls", NORMS)
def test_equation_and_init(cls):
    norm = cls(DIM)
    assert norm.alpha.item() == 0.5
    assert torch.equal(norm.weight, torch.ones(DIM)) and torch.equal(norm.bias, torch.zeros(DIM))
    if cls is DynamicErf:
        assert norm.shift.item() == 0.0
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(random_input(*p.shape, seed=p.numel()) * 0.3)
    x = random_input(5, 2, DIM)
    torch.testing.assert_close(norm.double()(x), direct(norm, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", NORMS)
def test_output_is_contiguous_like_layer_norm(cls):
    """fairseq's (time, batch, C) stream is a transposed view; the linear layers after a norm need a contiguous
    input for one addmm (else matmul copies, multiplies and adds the bias apart: 0.93 of Pre-LN's speed)."""
    norm = cls(DIM).double()
    x = random_input(2, 5, DIM).transpose(0, 1)
    y = norm(x)
    assert not x.is_contiguous() and y.is_contiguous()
    torch.testing.assert_close(y, direct(norm, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", NORMS)
def test_layer_norm_signature(cls):
    """Built like fairseq's LayerNorm / nn.LayerNorm: positional shape, eps, affine flags, export."""
    norm = cls(DIM, 1e-5, True, export=False)
    assert norm(torch.randn(3, DIM)).shape == (3, DIM)
    bare = cls((DIM,), elementwise_affine=False)
    assert list(bare.parameters()) == [p for p in bare.parameters() if p.numel() == 1]  # alpha (and shift) only
    no_bias = cls(DIM, bias=False)  # the DyT LLaMA variant (no beta)
    assert no_bias.bias is None and no_bias(torch.zeros(2, DIM)).abs().max() == 0  # tanh(0) = erf(0 + s0) = 0
    own = sorted(k for k in cls(DIM).state_dict() if k not in ("alpha", "shift"))
    assert own == sorted(LayerNorm(DIM).state_dict())  # weight, bias: a LayerNorm checkpoint's names


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cls", NORMS)
def test_deep_pre_norm_stack_half_precision(cls, dtype):
    sublayers = 72
    norms = [cls(DIM).to(dtype) for _ in range(sublayers + 1)]
    weights = branch_weights(sublayers, gain=2.0)
    x = (random_input(6, 2, DIM) * 10).to(dtype).requires_grad_()
    h = x
    for norm, w in zip(norms, weights):
        h = h + torch.nn.functional.gelu(norm(h) @ w.to(dtype))
    out = norms[-1](h)
    assert out.dtype == dtype and out.abs().max() <= 1.0 + 1e-2  # bounded by |gamma| + |beta| at init
    out.float().sum().backward()
    assert_finite(h, out, x.grad, *(p.grad for n in norms for p in n.parameters()))
