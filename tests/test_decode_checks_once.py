"""A decoding step (no autograd) of an mHC, mHC-lite or dynamic hyper-connection unit checks each kernel argument
once: the check that chooses the kernel is the one that guards the call (issue 58 item 3: at a decoding step's
few tokens the second round of Python checks cost a tenth of a unit). The results are the ones of the calls
that check again (the same kernels on the same arguments), and a refused argument still takes the PyTorch code."""

import pytest
import torch

from fairseq_plugins.kernels import hc_kernel, mhc_kernel
from fairseq_plugins.modules.hyper_connections import HyperConnection
from fairseq_plugins.modules.mhc import ManifoldHyperConnection

CHECKS = ((mhc_kernel, "check_coefficients"), (mhc_kernel, "check_mix"), (mhc_kernel, "check_post"),
          (hc_kernel, "check_hc_coefficients"))  # fmt: skip

pytestmark = pytest.mark.skipif(mhc_kernel.loaded() is None, reason=f"no mHC kernel here: {mhc_kernel.failure}")


def units():
    torch.manual_seed(0)
    built = {"mhc": ManifoldHyperConnection(8, 2, 1), "mhc_lite": ManifoldHyperConnection(8, 2, 1, residual="permutations"),
             "hc_dynamic": HyperConnection(8, 2, 1, True)}  # fmt: skip
    for unit in built.values():
        with torch.no_grad():
            for p in unit.parameters():
                p.add_(0.1 * torch.randn_like(p))
        unit.eval()
    return built


def counted(monkeypatch) -> dict:
    calls: dict = {}
    for module, name in CHECKS:
        monkeypatch.setattr(module, name, counting(getattr(module, name), name, calls))
    return calls


def counting(check, name: str, calls: dict):
    def wrapper(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return check(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("name", ["mhc", "mhc_lite", "hc_dynamic"])
def test_a_decoding_unit_checks_each_argument_once(monkeypatch, name):
    unit, streams = units()[name], torch.randn(3, 2, 2, 8)
    with torch.no_grad():
        want = unit(streams, lambda u: 0.5 * u)
        calls = counted(monkeypatch)
        got = unit(streams, lambda u: 0.5 * u)
    assert torch.equal(got, want)
    coefficients = "check_hc_coefficients" if name == "hc_dynamic" else "check_coefficients"
    assert calls == {coefficients: 1, "check_mix": 1, "check_post": 1}


@pytest.mark.parametrize("name", ["mhc", "mhc_lite"])
def test_the_decoding_path_computes_what_the_checked_calls_compute(name):
    """The one-check path against the same kernels called through the entry points that check again."""
    unit, streams = units()[name], torch.randn(3, 2, 2, 8)
    n, flat = 2, streams.reshape(-1, 2, 8)
    with torch.no_grad():
        got = unit(streams, lambda u: 0.5 * u)
        coef = unit._coefficients_tokens_last(streams)[3]
        u, mixed = mhc_kernel.mix_forward(flat, coef, n)
        want = mhc_kernel.post_forward(mixed, coef[n : 2 * n], 0.5 * u, n).view_as(streams)
    assert torch.equal(got, want)


def test_a_branch_output_of_another_dtype_leaves_the_streams_float32():
    """As the autograd path does: the branch output is cast to the streams' dtype before the depth connection."""
    unit, streams = units()["mhc"], torch.randn(3, 2, 2, 8)
    with torch.no_grad():
        got = unit(streams, lambda u: (0.5 * u).double())
        want = unit(streams, lambda u: 0.5 * u)
    assert torch.equal(got, want)
