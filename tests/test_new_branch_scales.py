"""LayerScale (CaiT, arXiv:2103.17239) and ReZero (arXiv:2003.04887): the equations in float64, the state at
initialisation (ReZero = identity, LayerScale = eps-scaled branch), and a 36-layer stack in half precision."""

import pytest
import torch

from fairseq_plugins.modules.layer_scale import LayerScale, cait_eps
from fairseq_plugins.modules.rezero import ReZeroGate

from .new_ideas_common import (
    DIM,
    HALF,
    assert_finite,
    branch,
    branch_weights,
    random_input,
)


def test_cait_eps_rule():
    assert [cait_eps(d) for d in (1, 6, 18, 19, 24, 25, 36)] == [0.1, 0.1, 0.1, 1e-5, 1e-5, 1e-6, 1e-6]
    with pytest.raises(ValueError, match="depth"):
        cait_eps(0)


def test_layer_scale_equation_and_init():
    scale = LayerScale(DIM, init=1e-5)
    assert torch.equal(scale.scale.detach(), torch.full((DIM,), 1e-5))
    scale.double()
    with torch.no_grad():
        scale.scale.copy_(random_input(DIM, seed=3))
    x, f = random_input(5, 2, DIM, seed=1), random_input(5, 2, DIM, seed=2)
    lam = scale.scale.detach()
    expected = x + torch.diag(lam).matmul(f.unsqueeze(-1)).squeeze(-1)  # x + diag(lambda) F
    torch.testing.assert_close(scale(f, x), expected, rtol=0, atol=1e-12)


def test_rezero_is_identity_at_init_and_follows_eq1():
    gate = ReZeroGate().double()
    x, f = random_input(5, 2, DIM, seed=1), random_input(5, 2, DIM, seed=2)
    assert torch.equal(gate(f, x), x)  # alpha = 0: x_{i+1} = x_i exactly
    with torch.no_grad():
        gate.alpha.fill_(0.3)
    torch.testing.assert_close(gate(f, x), x + 0.3 * f, rtol=0, atol=1e-12)
    loss = gate(f, x).sum()
    loss.backward()
    torch.testing.assert_close(gate.alpha.grad, f.sum())  # the zero gate still learns


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("make", [lambda: LayerScale(DIM, cait_eps(36)), ReZeroGate], ids=["layerscale", "rezero"])
def test_deep_stack_half_precision(make, dtype):
    sublayers = 72  # 36 layers, 2 sublayers each
    gates = [make().to(dtype) for _ in range(sublayers)]
    for g in gates:  # trained-looking gates: ReZero's 0 would make the test trivial
        with torch.no_grad():
            next(g.parameters()).fill_(0.5)
    weights = branch_weights(sublayers)
    x = random_input(6, 2, DIM, dtype=dtype).requires_grad_()
    h = x
    for gate, w in zip(gates, weights):
        h = gate(branch(h, w), h)
    assert h.dtype == dtype
    h.float().square().mean().backward()
    assert_finite(h, x.grad, *(p.grad for g in gates for p in g.parameters()))
