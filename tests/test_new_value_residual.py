"""Value residual (ResFormer, arXiv:2410.17897): the mix in float64 inside a small causal attention stack
written out directly, incremental decoding (mix before the value cache) == full decoding, the modes and their
errors, and a 36-layer stack in half precision."""

import math

import pytest
import torch

from fairseq_plugins.modules.value_residual import ValueResidual, ValueResidualStack

from .new_ideas_common import DIM, HALF, assert_finite, random_input

HEADS = 2


def make_weights(layers, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(DIM, DIM, generator=g, dtype=torch.float64).to(dtype) / DIM**0.5 for _ in range(4)]
            for _ in range(layers)]


def attend(q, k, v, causal_offset=None):
    """Multi-head attention on (T, B, C) tensors; causal when causal_offset (the first query's position) is set."""
    t, b, _ = q.shape
    s = k.shape[0]
    split = lambda z: z.reshape(z.shape[0], b, HEADS, -1).permute(1, 2, 0, 3)
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(DIM // HEADS)
    if causal_offset is not None:
        pos = torch.arange(t).unsqueeze(1) + causal_offset
        scores = scores.masked_fill(torch.arange(s).unsqueeze(0) > pos, float("-inf"))
    out = scores.float().softmax(-1).to(q.dtype) @ split(v)
    return out.permute(2, 0, 1, 3).reshape(t, b, -1)


def run_stack(x, weights, stack, offset=0, cache=None):
    """x <- x + Attn(LN x) with V mixed by ``stack``; with ``cache`` (a list of per-layer (K, V') lists) the
    new positions are appended first, as fairseq's saved_state does."""
    state = {}
    for n, (wq, wk, wv, wo) in enumerate(weights):
        h = torch.nn.functional.layer_norm(x, (DIM,))
        q, k, v = h @ wq, h @ wk, h @ wv
        v = stack(n, v, state, h)
        if cache is not None:
            cache[n][0].append(k)
            cache[n][1].append(v)
            k, v = torch.cat(cache[n][0]), torch.cat(cache[n][1])
        x = x + attend(q, k, v, causal_offset=offset) @ wo
    return x


def direct_stack(x, weights, lambdas):
    """The paper's equations, float64: V'_n = l1 V_1 + l2 V_n for n >= 2, U_n = A_n V'_n."""
    v_first = None
    for n, (wq, wk, wv, wo) in enumerate(weights):
        h = torch.nn.functional.layer_norm(x, (DIM,))
        v = h @ wv
        if n == 0:
            v_first = v
        else:
            v = lambdas[n - 1][0] * v_first + lambdas[n - 1][1] * v
        x = x + attend(h @ wq, h @ wk, v, causal_offset=0) @ wo
    return x


@pytest.mark.parametrize("mode", ["identity", "constant", "learnable"])
def test_equations_in_a_causal_stack(mode):
    lambdas = (2.0, 1.0) if mode == "constant" else (0.5, 0.5)
    stack = ValueResidualStack(4, mode, lambdas=lambdas).double()
    if mode == "learnable":
        assert [m.lambdas.tolist() for m in stack.mixes] == [[0.5, 0.5]] * 3  # the paper's init
        with torch.no_grad():
            for i, m in enumerate(stack.mixes):
                m.lambdas.copy_(torch.tensor([0.2 * i, 1.0 - 0.1 * i]))
    weights = make_weights(4)
    x = random_input(5, 2, DIM)
    expected = direct_stack(x, weights, [m.lambdas.tolist() for m in stack.mixes])
    torch.testing.assert_close(run_stack(x, weights, stack), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["identity", "learnable", "token"])
def test_incremental_equals_full(mode):
    """Mixing before the cache append: decoding position by position == the full causal pass."""
    stack = ValueResidualStack(3, mode, DIM, HEADS).double()
    weights = make_weights(3, seed=4)
    x = random_input(6, 2, DIM, seed=5)
    full = run_stack(x, weights, stack)
    cache = [([], []) for _ in weights]
    steps = [run_stack(x[t : t + 1], weights, stack, offset=t, cache=cache) for t in range(x.shape[0])]
    torch.testing.assert_close(torch.cat(steps), full, rtol=0, atol=1e-12)


def test_token_mode_is_a_per_head_lerp():
    mix = ValueResidual("token", DIM, HEADS).double()
    v, v1, x = (random_input(4, 3, DIM, seed=s) for s in (1, 2, 3))
    gate = torch.sigmoid(x @ mix.gate.weight.t() + mix.gate.bias)  # (T, B, h)
    g = gate.repeat_interleave(DIM // HEADS, dim=-1)
    torch.testing.assert_close(mix(v, v1, x), (1 - g) * v1 + g * v, rtol=0, atol=1e-12)


def test_options_rejected():
    with pytest.raises(ValueError, match="one of"):
        ValueResidual("dense")
    with pytest.raises(ValueError, match="identity"):
        ValueResidual("identity", lambdas=(2.0, 1.0))
    with pytest.raises(ValueError, match="divisible"):
        ValueResidual("token", DIM, 3)
    with pytest.raises(ValueError, match="cross-attention"):
        ValueResidualStack(3, "token", DIM, HEADS, cross_attention=True)
    assert list(ValueResidualStack(3).state_dict()) == []  # identity: fixed lambdas, nothing in checkpoints


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["identity", "token"])
def test_deep_stack_half_precision(mode, dtype):
    stack = ValueResidualStack(36, mode, DIM, HEADS).to(dtype)
    weights = make_weights(36, seed=6, dtype=dtype)
    x = random_input(6, 2, DIM, dtype=dtype).requires_grad_()
    out = run_stack(x, weights, stack)
    assert out.dtype == dtype
    out.float().square().mean().backward()
    assert_finite(out, x.grad, *(p.grad for p in stack.parameters()))
