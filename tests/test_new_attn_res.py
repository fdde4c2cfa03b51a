"""Attention Residuals (arXiv:2603.15031), Full and Block: eq. 1-6 written out in float64, the uniform
average at initialisation, per-position independence, and a 36-layer stack in half precision."""

import pytest
import torch
import torch.nn.functional as F

from fairseq_plugins.modules.attn_res import AttentionResiduals

from .new_ideas_common import (
    DIM,
    HALF,
    assert_finite,
    branch,
    branch_weights,
    random_input,
    randomize_,
)

L = 7


def run(ar, x, weights):
    state = ar.start(x)
    for l, w in enumerate(weights):
        ar(l, state, lambda h, w=w: branch(h, w))
    return ar.finish(state)


def direct_alpha(q, g, l, values):
    """Eq. 2-3: alpha_{i->l} = softmax_i(w_l^T RMSNorm(v_i)), (sources, *token dims)."""
    keys = [v / torch.sqrt((v**2).mean(-1, keepdim=True) + 1e-6) * g[l] for v in values]
    return torch.softmax(torch.stack([k @ q[l] for k in keys]), 0)


def direct(ar, x, weights, block_size, detach=True):
    """Eq. 5-6 (eq. 1-4 for S = 1) per token: sources b_0 = embedding, completed block sums, current partial."""
    q, g = (ar.queries.detach(), ar.key_gains.detach()) if detach else (ar.queries, ar.key_gains)

    def aggregate(l, values):
        return sum(a.unsqueeze(-1) * v for a, v in zip(direct_alpha(q, g, l, values), values))

    blocks, partial = [x], []
    for l, w in enumerate(weights):
        sources = blocks + ([sum(partial)] if partial else [])
        out = branch(aggregate(l, sources), w)
        partial.append(out)
        if len(partial) == block_size:
            blocks, partial = blocks + [sum(partial)], []
    return aggregate(len(weights), blocks + ([sum(partial)] if partial else []))


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_equations(block_size):
    ar = AttentionResiduals(DIM, L, block_size).double()
    randomize_(ar, scale=1.0)
    weights = branch_weights(L)
    x = random_input(4, 2, DIM)
    torch.testing.assert_close(run(ar, x, weights), direct(ar, x, weights, block_size), rtol=0, atol=1e-12)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("block_size", [1, 3])
def test_weights_are_the_direct_alphas(block_size, grad):
    """``weights`` (read by scripts/analysis/attnres_weights.py) gives eq. 2-3's alpha over the sources in order,
    the embedding first and the partial sum last, in training and in decoding (which keeps a bank of blocks)."""
    ar = AttentionResiduals(DIM, L, block_size).double()
    randomize_(ar, scale=1.0)
    q, g = ar.queries.detach(), ar.key_gains.detach()
    weights = branch_weights(L)
    x = random_input(4, 2, DIM)
    with torch.set_grad_enabled(grad):
        state = ar.start(x)
        blocks, partial = [x], []
        for l in range(L + 1):
            sources = [v.detach() for v in blocks + ([sum(partial)] if partial else [])]
            expected = direct_alpha(q, g, l, sources).reshape(len(sources), -1).t()  # (tokens, sources)
            torch.testing.assert_close(ar.weights(l, state), expected, rtol=0, atol=1e-12)
            if l == L:
                break
            partial.append(ar(l, state, lambda h, w=weights[l]: branch(h, w)))
            if len(partial) == block_size:
                blocks, partial = blocks + [sum(partial)], []


@pytest.mark.parametrize("block_size", [1, 3])
def test_uniform_average_at_init(block_size):
    ar = AttentionResiduals(DIM, L, block_size).double()
    weights = branch_weights(L)
    x = random_input(4, 2, DIM)
    state = ar.start(x)
    blocks, partial = [x], []  # Full: the sources are the embedding and every output
    for l, w in enumerate(weights):
        out = ar(l, state, lambda h, w=w: branch(h, w))
        partial.append(out)
        if len(partial) == block_size:
            blocks, partial = blocks + [sum(partial)], []
        sources = blocks + ([sum(partial)] if partial else [])  # h_{l+1} = their plain mean
        torch.testing.assert_close(ar.read(l + 1, state), torch.stack(sources).mean(0), rtol=0, atol=1e-12)
    assert len(state.blocks) == 1 + L // block_size and state.count == L % block_size


def test_per_position_and_errors():
    ar = AttentionResiduals(DIM, L, 2).double()
    randomize_(ar, scale=1.0)
    weights = branch_weights(L)
    x = random_input(5, 2, DIM)
    full = run(ar, x, weights)
    for t in range(5):
        torch.testing.assert_close(run(ar, x[t : t + 1], weights), full[t : t + 1], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="block_size"):
        AttentionResiduals(DIM, L, 0)
    with pytest.raises(IndexError, match="outside"):
        ar(L, ar.start(x), lambda h: h)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("block_size", [1, 6])
def test_deep_stack_half_precision(block_size, dtype):
    sublayers = 72
    ar = AttentionResiduals(DIM, sublayers, block_size).to(dtype)
    randomize_(ar, scale=1.0)
    x = (random_input(6, 2, DIM) * 10).to(dtype).requires_grad_()
    out = F.layer_norm(run(ar, x, branch_weights(sublayers, gain=2.0)), (DIM,))
    assert out.dtype == dtype
    out.float().square().mean().backward()
    assert_finite(out, x.grad, *(p.grad for p in ar.parameters()))


def test_logits_in_float32_under_float16():
    """w^T v alone would overflow float16 here (|v| ~ 300, |w| ~ 300: 8 * 9e4 > 65504); divided by rms(v) in
    float32 it is ~2400 and the softmax is finite."""
    ar = AttentionResiduals(DIM, 2).half()
    with torch.no_grad():
        ar.queries.fill_(300.0)
    x = torch.full((2, 1, DIM), 300.0, dtype=torch.float16)
    state = ar.start(x)
    ar(0, state, lambda h: -h)
    out = ar.read(1, state)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_gradients_match_the_direct_equations(block_size):
    """The reads' backward accumulates into the bank of completed blocks (modules/attn_res.py, _Store/_Read):
    gradients of the input, the pseudo-queries, the key gains and the branches equal autograd's through the
    direct float64 equations."""
    ar = AttentionResiduals(DIM, L, block_size).double()
    randomize_(ar, scale=1.0)
    x = random_input(4, 2, DIM).requires_grad_()
    target = random_input(4, 2, DIM, seed=5)
    grads = []
    for compute in (lambda w: run(ar, x, w), lambda w: direct(ar, x, w, block_size, detach=False)):
        weights = [w.clone().requires_grad_() for w in branch_weights(L)]
        ar.zero_grad()
        x.grad = None
        (compute(weights) * target).sum().backward()
        grads.append([x.grad.clone(), ar.queries.grad.clone(), ar.key_gains.grad.clone(), *(w.grad for w in weights)])
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("block_size", [1, 3])
def test_second_backward_through_the_same_graph(block_size):
    """The reads' accumulators are consumed by each block's backward: backward twice with retain_graph gives
    exactly twice the gradients of one."""
    ar = AttentionResiduals(DIM, L, block_size).double()
    randomize_(ar, scale=1.0)
    x = random_input(4, 2, DIM).requires_grad_()
    loss = (run(ar, x, branch_weights(L)) * random_input(4, 2, DIM, seed=5)).sum()
    loss.backward(retain_graph=True)
    once = [x.grad.clone(), ar.queries.grad.clone(), ar.key_gains.grad.clone()]
    loss.backward()
    torch.testing.assert_close([x.grad, ar.queries.grad, ar.key_gains.grad], [2 * g for g in once])
