"""MUDDFormer (arXiv:2502.12170): eq. 5-8 per token in float64, exactly the Pre-LN transformer at
initialisation, per-position independence, options, and a 36-block stack in half precision."""

import pytest
import torch
import torch.nn.functional as F

from fairseq_plugins.modules.muddformer import MultiwayDenseConnections

from .new_ideas_common import (
    DIM,
    HALF,
    assert_finite,
    branch,
    branch_weights,
    random_input,
    randomize_,
)

L = 4


def block(ways, ws):
    """A per-position stand-in for eq. 7: X'_A = Xbar^R + F_A(LN Xbar^Q, LN Xbar^K, LN Xbar^V); X'_A + FFN(LN X'_A)."""
    q, k, v, r = ways[:4]
    ln = lambda z: F.layer_norm(z, (DIM,))
    xa = r + torch.tanh(ln(q) @ ws[0] + ln(k) @ ws[1] + ln(v) @ ws[2])
    return xa + branch(xa, ws[3])


def run(mudd, x, weights):
    state, ways = mudd.start(x)
    for i in range(1, mudd.num_layers + 1):
        ways = mudd(i, state, block(ways, weights[i - 1]))
    return ways[0]


def layer_weights(n, seed=0, dtype=torch.float64):
    return [[w.to(dtype) for w in branch_weights(4, seed=seed + i)] for i in range(n)]


def direct(mudd, x, weights):
    """A_i = GELU(RMSNorm(X_i) W1) W2 + a_i; Xbar_i^c[t] = sum_j A_i^c[t, j] X_j[t], written per token."""
    outs, ways = [x], (x,) * 4
    for i in range(1, mudd.num_layers + 1):
        outs.append(block(ways, weights[i - 1]))
        conn = mudd.connections[i - 1]
        new = []
        for c in range(conn.ways):
            agg = torch.zeros_like(x)
            for t in range(x.shape[0]):
                for b in range(x.shape[1]):
                    xi = outs[-1][t, b]
                    a = F.gelu((xi / torch.sqrt((xi**2).mean() + 1e-6)) @ conn.w1) @ conn.w2
                    a = a.view(conn.ways, i + 1)[c] + conn.static[c]
                    agg[t, b] = sum(a[j] * outs[j][t, b] for j in range(i + 1))
            new.append(agg)
        ways = tuple(new)
    return ways[0]


def test_equations():
    mudd = MultiwayDenseConnections(DIM, L).double()
    randomize_(mudd)
    weights = layer_weights(L)
    x = random_input(3, 2, DIM)
    with torch.no_grad():
        # rtol: the batched product sums in BLAS order (outputs up to ~50 here; seen once 1e-12 off absolutely)
        torch.testing.assert_close(run(mudd, x, weights), direct(mudd, x, weights), rtol=1e-12, atol=1e-12)


def test_init_is_the_pre_ln_transformer():
    mudd = MultiwayDenseConnections(DIM, L).double()
    assert all(torch.equal(c.w2, torch.zeros_like(c.w2)) for c in mudd.connections)
    weights = layer_weights(L)
    x = random_input(4, 2, DIM)
    h = x
    for ws in weights:
        h = block((h, h, h, h), ws)
    torch.testing.assert_close(run(mudd, x, weights), h, rtol=0, atol=0)


def test_shapes_options_and_errors():
    mudd = MultiwayDenseConnections(DIM, 3, ways=5, round64=True, expand_last=True)
    hidden = [c.w1.shape[1] for c in mudd.connections]
    assert hidden == [64, 64, 64] and [c.ways for c in mudd.connections] == [5, 5, 1]
    assert [c.w1.shape[1] for c in MultiwayDenseConnections(DIM, 3).connections] == [8, 12, 4]  # C(i+1), last C=1
    assert MultiwayDenseConnections(DIM, 3, expand_last=True).connections[-1].w1.shape[1] == 16
    state, ways = mudd.start(torch.zeros(2, 1, DIM))
    assert len(ways) == 5
    with pytest.raises(IndexError, match="order"):
        mudd(2, state, torch.zeros(2, 1, DIM))
    with pytest.raises(ValueError, match="ways"):
        MultiwayDenseConnections(DIM, 3, ways=3)


def test_per_position():
    mudd = MultiwayDenseConnections(DIM, L).double()
    randomize_(mudd)
    weights = layer_weights(L)
    x = random_input(5, 2, DIM)
    full = run(mudd, x, weights)
    for t in range(5):
        torch.testing.assert_close(run(mudd, x[t : t + 1], weights), full[t : t + 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", HALF)
def test_deep_stack_half_precision(dtype):
    mudd = MultiwayDenseConnections(DIM, 36).to(dtype)
    randomize_(mudd, scale=0.05)
    assert mudd.connections[0].weights(torch.ones(2, 1, DIM, dtype=dtype)).dtype == torch.float32
    weights = layer_weights(36, dtype=dtype)
    x = (random_input(6, 2, DIM) * 10).to(dtype).requires_grad_()
    out = F.layer_norm(run(mudd, x, weights), (DIM,))
    assert out.dtype == dtype
    out.float().square().mean().backward()
    assert_finite(out, x.grad, *(p.grad for p in mudd.parameters()))


def test_gradients_of_the_bank_match_the_running_sum():
    """The aggregation over the bank of block outputs (modules/muddformer.py, _Keep/_Aggregate: gradients
    accumulated in place) has the gradients of the running sum over the plain list of outputs, in float64."""
    mudd = MultiwayDenseConnections(DIM, L).double()
    randomize_(mudd)
    x = random_input(3, 2, DIM).requires_grad_()
    target = random_input(3, 2, DIM, seed=7)
    grads = []
    for banked in (True, False):
        weights = [[w.clone().requires_grad_() for w in ws] for ws in layer_weights(L)]
        mudd.zero_grad()
        x.grad = None
        state, ways = mudd.start(x)
        if not banked:
            state = [x]
        for i in range(1, L + 1):
            ways = mudd(i, state, block(ways, weights[i - 1]))
        (ways[0] * target).sum().backward()
        grads.append([x.grad.clone(), *(p.grad.clone() for p in mudd.parameters()), *(w.grad for ws in weights for w in ws)])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)  # summation order only


def test_second_backward_through_the_same_graph():
    """The gradient bank is reset once every block output has its gradient: backward twice with retain_graph
    accumulates exactly twice the gradients of one."""
    mudd = MultiwayDenseConnections(DIM, L).double()
    randomize_(mudd)
    x = random_input(3, 2, DIM).requires_grad_()
    weights = layer_weights(L)
    state, ways = mudd.start(x)
    for i in range(1, L + 1):
        ways = mudd(i, state, block(ways, weights[i - 1]))
    loss = (ways[0] * random_input(3, 2, DIM, seed=7)).sum()
    loss.backward(retain_graph=True)
    once = [x.grad.clone(), *(p.grad.clone() for p in mudd.parameters())]
    loss.backward()
    torch.testing.assert_close([x.grad, *(p.grad for p in mudd.parameters())], [2 * g for g in once])
