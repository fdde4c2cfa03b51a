"""The coefficient maths of mHC, frac-connections, AttnRes and MUDD stays float32 under torch.autocast (the
plugin's ``--autocast-dtype``, fairseq_plugins/precision.py), as it does for half-precision weights: autocast
would otherwise run their matrix products (v phi, Hbar W, w^T v, the weight MLP) in bfloat16/float16."""

import pytest
import torch

from fairseq_plugins.modules.attn_res import AttentionResiduals
from fairseq_plugins.modules.frac_connections import FracConnection
from fairseq_plugins.modules.mhc import ManifoldHyperConnection, expand_streams
from fairseq_plugins.modules.muddformer import MultiwayDenseConnections

from .new_ideas_common import random_input

WIDTH = 64  # wide enough that a bfloat16 product differs visibly from the float32 one
AUTOCAST = [torch.bfloat16, torch.float16]


def randomized(module, scale=0.5):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return module


def same_under_autocast(fn, dtype, *args):
    expected = fn(*args)
    with torch.autocast("cpu", dtype=dtype):
        got = fn(*args)
    as_tuple = lambda t: t if isinstance(t, tuple) else (t,)
    for g, e in zip(as_tuple(got), as_tuple(expected)):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", AUTOCAST)
@pytest.mark.parametrize("residual", ["sinkhorn", "permutations"])
def test_mhc_coefficients(residual, dtype):
    unit = randomized(ManifoldHyperConnection(WIDTH, 4, residual=residual))
    streams = expand_streams(random_input(5, 2, WIDTH, dtype=torch.float32), 4) * torch.arange(1.0, 5.0)[:, None]
    same_under_autocast(unit.coefficients, dtype, streams)


@pytest.mark.parametrize("dtype", AUTOCAST)
def test_frac_coefficients(dtype):
    unit = randomized(FracConnection(WIDTH, 4))
    same_under_autocast(unit.coefficients, dtype, random_input(10, 4, WIDTH // 4, dtype=torch.float32))


@pytest.mark.parametrize("dtype", AUTOCAST)
def test_mudd_weights(dtype):
    conn = randomized(MultiwayDenseConnections(WIDTH, 3)).connections[1]
    same_under_autocast(conn.weights, dtype, random_input(5, 2, WIDTH, dtype=torch.float32))


@pytest.mark.parametrize("dtype", AUTOCAST)
def test_attn_res_logits(dtype):
    """Under float16 autocast w^T v = 8 * 9e4 overflowed to inf and the softmax gave NaN."""
    ar = AttentionResiduals(8, 2)
    with torch.no_grad():
        ar.queries.fill_(300.0)
    x = torch.full((2, 1, 8), 300.0) * torch.linspace(0.5, 1.5, 8)

    def aggregate():
        state = ar.start(x)
        ar(0, state, lambda h: -0.5 * h)
        return ar.read(1, state)

    same_under_autocast(aggregate, dtype)


@pytest.mark.parametrize("dtype", AUTOCAST)
def test_mhc_streams_stay_float32(dtype):
    """The streams are the residual stream: under autocast they stay float32 (as the plugin's residual stream
    does by promotion), only the sublayer runs in half precision; H_res x and H_post^T F are mixed in float32."""
    unit = randomized(ManifoldHyperConnection(WIDTH, 4))
    streams = expand_streams(random_input(5, 2, WIDTH, dtype=torch.float32), 4) * torch.arange(1.0, 5.0)[:, None]
    branch_out = random_input(5, 2, WIDTH, seed=3, dtype=torch.float32).to(dtype)  # what a half sublayer returns
    expected = unit(streams, lambda u: branch_out.float())
    with torch.autocast("cpu", dtype=dtype):
        got = unit(streams, lambda u: branch_out)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", AUTOCAST)
@pytest.mark.parametrize("dynamic", [False, True])
def test_frac_residual_stays_float32(dynamic, dtype):
    """A^T H is the residual path: under autocast it is mixed in float32, not rounded to half each sublayer."""
    unit = randomized(FracConnection(WIDTH, 4, dynamic))
    x = random_input(5, 2, WIDTH, dtype=torch.float32)
    branch_out = random_input(5, 2, WIDTH, seed=3, dtype=torch.float32).to(dtype)
    expected = unit(x, lambda u: branch_out.float())
    with torch.autocast("cpu", dtype=dtype):
        got = unit(x, lambda u: branch_out)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_orthogonal_update_keeps_the_stream_precision():
    """Under autocast the branch output is bfloat16 and the stream float32: the projection scale must not be
    rounded to bfloat16 (that left ~1e-3 of the parallel part in the float32 stream)."""
    from fairseq_plugins.modules.orthogonal_residual import OrthogonalResidual

    stream = random_input(6, 2, WIDTH, dtype=torch.float32)
    branch_out = (random_input(6, 2, WIDTH, seed=2, dtype=torch.float32) + stream).to(torch.bfloat16)
    update = OrthogonalResidual(eps=0.0)(branch_out, stream) - stream
    assert update.dtype == torch.float32
    cosine = (update * stream).sum(-1) / (branch_out.float().norm(dim=-1) * stream.norm(dim=-1))
    assert cosine.abs().max() < 1e-6
