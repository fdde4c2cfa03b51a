"""A double backward (create_graph=True, e.g. a gradient penalty) through the plugin's hand-written backwards
raises an error naming the module, instead of silently dropping terms.

AttnRes's and MUDD's backwards accumulate into buffers shared by the forward pass, outside autograd; mHC's
Sinkhorn normalisation and the RMS-scaled coefficient product treat saved forward intermediates as constants.
Each would give a wrong second derivative, so each is once-differentiable, as the fused kernels already were.
The error is reached however the second derivative is asked for: by ``.backward()``, and by
``torch.autograd.grad(penalty, params)``, which runs only the nodes that lead to ``params``. The multi-stream
kernels' message points to their twice-differentiable PyTorch code where hyper-connections have it. Every
choice that declares a once-differentiable backward (``double_backward``) has a case here naming its module.
"""

import pytest
import torch
from torch import nn

from fairseq_plugins.axes import declarations
from fairseq_plugins.kernels import grn_kernel, mhc_kernel
from fairseq_plugins.kernels.sinkhorn import sinkhorn_tokens_last
from fairseq_plugins.modules.attn_res import AttentionResiduals
from fairseq_plugins.modules.grn import GRNv3
from fairseq_plugins.modules.hyper_connections import HyperConnection
from fairseq_plugins.modules.muddformer import MultiwayDenseConnections
from fairseq_plugins.modules.skinny import rms_project_t

from .new_ideas_common import DIM, branch, branch_weights, random_input, randomize_
from .test_grn_kernel import needs_kernel
from .test_grn_kernel_modes import gated
from .test_new_muddformer import layer_weights
from .test_new_muddformer import run as run_mudd


def _attn_res(block_size):
    ar = AttentionResiduals(DIM, 4, block_size).double()
    randomize_(ar, scale=1.0)
    weights = branch_weights(4)

    def f(x):
        state = ar.start(x)
        for l, w in enumerate(weights):
            ar(l, state, lambda h, w=w: branch(h, w))
        return ar.finish(state)

    return f


def _mudd():
    mudd = MultiwayDenseConnections(DIM, 3).double()
    randomize_(mudd)
    weights = layer_weights(3)
    return lambda x: run_mudd(mudd, x, weights)


def _sinkhorn(x):
    return sinkhorn_tokens_last(x[..., :16].reshape(4, 4, -1).exp().log(), 5)


def _rms_project(x):
    return rms_project_t(x.reshape(-1, DIM), torch.linspace(-1, 1, DIM * 3, dtype=x.dtype).view(DIM, 3), 1e-6)


def _grn(kernel: bool):
    grn, norm = gated(GRNv3(DIM, 3, 3)).double(), nn.LayerNorm(DIM).double()

    def f(x):
        with grn_kernel.enabled(kernel):
            return grn([torch.stack([x, x.tanh(), x.sin()])], norm=norm)[1]

    return f


CASES = {"attnres_full": (_attn_res(1), "attn_res.py"), "attnres_block": (_attn_res(2), "attn_res.py"),
         "mudd": (_mudd(), "muddformer.py"), "mhc_sinkhorn": (_sinkhorn, "sinkhorn.py"),
         "rms_project_t": (_rms_project, "skinny.py"), "grn_kernel": (_grn(True), "grn.py"),
         "grn_pytorch": (_grn(False), "grn.py")}  # fmt: skip
# the choices each case stands for (the multi-stream kernels' case is the test of them at the end)
COVERS = {"attnres_full": ("--depth-aggregation attnres",), "attnres_block": ("--depth-aggregation attnres-block",),
          "mudd": ("--depth-aggregation mudd",), "mhc_sinkhorn": ("--depth-aggregation mhc",),
          "rms_project_t": ("--depth-aggregation mhc", "--depth-aggregation mhc-lite"),
          "grn_kernel": ("--depth-aggregation dca", "--depth-aggregation dca-k"),
          "grn_pytorch": ("--depth-aggregation dca", "--depth-aggregation dca-k"),
          "multi_stream_kernels": ("--depth-aggregation hc-static", "--depth-aggregation hc-dynamic")}  # fmt: skip
MODULE_OF = {**{name: module for name, (_, module) in CASES.items()}, "multi_stream_kernels": "mhc_ops.py"}
# a squared loss sends gradients that carry a graph; a plain sum sends constants, which must not make the
# function's own second-order term vanish
LOSSES = {"square": lambda y: y.square().sum(), "sum": lambda y: y.sum()}


def test_every_declared_once_differentiable_choice_has_a_case_naming_its_module():
    declared = {c.label(): c.double_backward for table in declarations().values() for c in table.values()}
    covered = {label for labels in COVERS.values() for label in labels}
    once = {label for label, reason in declared.items() if reason is not None}
    assert once == covered, (f"declared once-differentiable without a case: {sorted(once - covered)}; a case for "
                             f"a choice declaring a second derivative: {sorted(covered - once)}")
    for case, labels in COVERS.items():
        for label in labels:  # the declaration names the module whose backward has no second derivative
            assert MODULE_OF[case] in declared[label], (label, MODULE_OF[case])


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("name", list(CASES))
def test_double_backward_raises_an_error_naming_the_module(name, loss):
    f, module = CASES[name]
    x = random_input(3, 2, DIM).requires_grad_()
    (grad,) = torch.autograd.grad(LOSSES[loss](f(x)), x, create_graph=True)
    assert grad.requires_grad  # the function's term is tied to the error, not silently dropped
    with pytest.raises(RuntimeError, match="no second derivative") as err:
        grad.square().sum().backward()
    assert module in str(err.value)


@pytest.mark.parametrize("name", list(CASES))
def test_a_first_derivative_is_unchanged_under_create_graph(name):
    f, _ = CASES[name]
    x = random_input(3, 2, DIM).requires_grad_()
    (plain,) = torch.autograd.grad(f(x).square().sum(), x)
    (graph,) = torch.autograd.grad(f(x).square().sum(), x, create_graph=True)
    torch.testing.assert_close(graph.detach(), plain, rtol=0, atol=0)


def _penalty_grad(f, x, p, loss):
    """d/dp of |d loss(f(x p)) / dx|^2: the second derivative through f, asked for p alone."""
    (grad,) = torch.autograd.grad(LOSSES[loss](f(x * p)), x, create_graph=True)
    return torch.autograd.grad(grad.square().sum(), p, allow_unused=True)


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("name", list(CASES))
def test_a_second_derivative_asked_for_some_parameters_raises_too(name, loss):
    f, module = CASES[name]
    x = random_input(3, 2, DIM).requires_grad_()
    p = torch.linspace(0.5, 1.5, DIM, dtype=x.dtype).requires_grad_()
    with pytest.raises(RuntimeError, match="no second derivative") as err:
        _penalty_grad(f, x, p, loss)
    assert module in str(err.value)


def _hc(kernel: bool, dtype=torch.float32):
    torch.manual_seed(0)
    hc = HyperConnection(DIM, 2, 0, True).to(dtype)
    randomize_(hc, scale=0.1)

    def f(x):
        with mhc_kernel.enabled(kernel):
            return hc(x.reshape(3, 1, 2, DIM), torch.tanh)

    return f


@needs_kernel
@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_multi_stream_kernels_raise_and_point_to_the_pytorch_code(loss):
    x = random_input(3, 2, DIM).float().requires_grad_()
    p = torch.linspace(0.5, 1.5, DIM).requires_grad_()
    with pytest.raises(RuntimeError, match="no second derivative") as err:
        _penalty_grad(_hc(True), x, p, loss)
    assert "FAIRSEQ_PLUGINS_MHC_KERNEL=0" in str(err.value)
    (kernels_off,) = _penalty_grad(_hc(False), x, p, loss)  # which has one for hyper-connections
    assert kernels_off is not None and torch.isfinite(kernels_off).all()


@needs_kernel
@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_grn_kernels_raise_for_some_parameters_too(loss):
    x = random_input(3, 2, DIM).float().requires_grad_()
    p = torch.linspace(0.5, 1.5, DIM).requires_grad_()
    grn, norm = gated(GRNv3(DIM, 3, 3)), nn.LayerNorm(DIM)
    stack = lambda x: [torch.stack([x, x.tanh(), x.sin()])]
    assert grn_kernel.usable(stack(x), grn.b, grn.w, norm.weight, norm.bias)
    with pytest.raises(RuntimeError, match="no second derivative"):
        _penalty_grad(lambda x: grn(stack(x), norm=norm)[1], x, p, loss)
