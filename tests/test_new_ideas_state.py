"""Every new-idea module: its state_dict round trip (a fresh instance loading it strictly computes the same
output) and the parameter names and counts a checkpoint holds (the sheet's section 8 counts where it gives
one); every 2024-26 choice whose preset adds parameters has a case for the module holding them."""

import math

import pytest
import torch
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from fairseq_plugins.axes import declarations
from fairseq_plugins.models.families import NEW_IDEAS
from fairseq_plugins.modules.attn_res import AttentionResiduals
from fairseq_plugins.modules.derf import DynamicErf
from fairseq_plugins.modules.dyt import DynamicTanh
from fairseq_plugins.modules.frac_connections import FracConnection
from fairseq_plugins.modules.hybrid_norm import HeadNorm
from fairseq_plugins.modules.layer_scale import LayerScale
from fairseq_plugins.modules.mhc import ManifoldHyperConnection, expand_streams
from fairseq_plugins.modules.muddformer import MultiwayDenseConnections
from fairseq_plugins.modules.orthogonal_residual import OrthogonalResidual
from fairseq_plugins.modules.rezero import ReZeroGate
from fairseq_plugins.modules.site_layers import PeriOutput
from fairseq_plugins.modules.value_residual import ValueResidual

from .helpers import build_model
from .new_ideas_common import DIM, branch, branch_weights, random_input, randomize_

W = branch_weights(4)
X = random_input(3, 2, DIM)
F_ = lambda u: branch(u, W[0])


def attn_res_out(m):
    state = m.start(X)
    for i in range(3):
        m(i, state, lambda h, i=i: branch(h, W[i]))
    return m.finish(state)


def mudd_out(m):
    state, ways = m.start(X)
    for i in (1, 2):
        ways = m(i, state, branch(ways[-1], W[i]))
    return ways[0]


# name -> (constructor, call, expected parameter count for C = DIM)
CASES = {
    "layer_scale": (lambda: LayerScale(DIM), lambda m: m(F_(X), X), DIM),
    "rezero": (ReZeroGate, lambda m: m(F_(X), X), 1),
    "dyt": (lambda: DynamicTanh(DIM), lambda m: m(X), 2 * DIM + 1),
    "derf": (lambda: DynamicErf(DIM), lambda m: m(X), 2 * DIM + 2),
    "value_residual_learnable": (lambda: ValueResidual("learnable"), lambda m: m(X, 2 * X), 2),
    "value_residual_token": (lambda: ValueResidual("token", DIM, 2), lambda m: m(X, 2 * X, X), DIM * 2 + 2),
    "orthogonal": (OrthogonalResidual, lambda m: m(F_(X), X), 0),
    "peri_output": (lambda: PeriOutput(DIM), lambda m: m(F_(X), X), 2 * DIM),
    "head_norm": (lambda: HeadNorm(2, DIM // 2), lambda m: m(X), DIM // 2),
    # section 8: nC(n^2 + 2n) + (n^2 + 2n) + 3 (+ nC gain)
    "mhc": (lambda: ManifoldHyperConnection(DIM, 4), lambda m: m(expand_streams(X, 4), F_),
            4 * DIM * 24 + 24 + 3 + 4 * DIM),
    "mhc_lite": (lambda: ManifoldHyperConnection(DIM, 4, residual="permutations"),
                 lambda m: m(expand_streams(X, 4), F_), 4 * DIM * 32 + 32 + 3 + 4 * DIM),
    # section 8: (C/m)(2m + 1) + m(2m + 1) + 2 + norm (2 C/m); B and [Y|A] are m + 2m^2
    "frac": (lambda: FracConnection(DIM, 4), lambda m: m(X, F_), (DIM // 4) * 9 + 4 + 32 + 2 + 2 * (DIM // 4)),
    "attn_res": (lambda: AttentionResiduals(DIM, 3, 2), attn_res_out, 2 * DIM * 4),
    "mudd": (lambda: MultiwayDenseConnections(DIM, 2), mudd_out, DIM * 8 + 8 * 8 + 8 + DIM * 3 + 3 * 3 + 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_round_trip_and_size(name):
    make, call, count = CASES[name]
    torch.manual_seed(0)
    src = make().double()
    randomize_(src, seed=1, scale=0.1)
    assert sum(p.numel() for p in src.parameters()) == count
    torch.manual_seed(5)
    dst = make().double()
    dst.load_state_dict(src.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(call(dst), call(src), rtol=0, atol=0)


MODULES = "fairseq_plugins.modules."
# layers and stacks (modules/carry_stack.py's among them) are no idea modules
LAYERS = (TransformerEncoderLayerBase, TransformerDecoderLayerBase, TransformerEncoderBase, TransformerDecoderBase)
NEW_CHOICES = [c for table in declarations().values() for c in table.values() if c.preset in NEW_IDEAS]


def state_owners(model, baseline) -> set[type]:
    """The innermost plugin module (fairseq_plugins/modules/) holding each parameter of ``model`` that the Pre-LN
    ``baseline`` of the same shape does not have; a parameter no such module holds (a plain LayerNorm a layer
    adds, as MUDD's key and value norms: a layer or stack class is no idea module) needs no case of its own, nor a stack's
    version buffers."""
    owners = set()
    for key in dict(model.named_parameters()).keys() - dict(baseline.named_parameters()).keys():
        path = key.split(".")[:-1]
        modules = (model.get_submodule(".".join(path[:n])) for n in range(len(path), 0, -1))
        owners.add(next((type(m) for m in modules if type(m).__module__.startswith(MODULES)
                         and not isinstance(m, LAYERS)), None))  # fmt: skip
    return owners - {None}


@pytest.mark.parametrize("choice", NEW_CHOICES, ids=[c.label() for c in NEW_CHOICES])
def test_every_new_idea_with_parameters_has_a_case(choice):
    shape = ["--encoder-layers", "2", "--decoder-layers", "2"]
    owners = state_owners(build_model(f"{choice.preset}_e6d6", shape), build_model("transformer_preln_e6d6", shape))
    covered = {type(m) for make, _, _ in CASES.values() for m in make().modules()}
    missing = sorted(o.__name__ for o in owners - covered)
    assert not missing, f"{choice.label()} adds parameters held by {missing}: add a case to CASES"


def test_mhc_lite_permutation_count():
    assert math.factorial(4) == ManifoldHyperConnection(DIM, 4, residual="permutations").bias.numel() - 8
