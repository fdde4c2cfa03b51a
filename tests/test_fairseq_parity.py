"""fairseq's own translation test cases on fairseq's transformer (the control), ResiDual, Crossformer-SG and
Admin (a wiring baseline that prunes: its omegas follow their layers), and with ALL_FAMILIES=1 full DCA (CI runs
k-DCA, the same model class, in _2.py; tests/helpers.py trained_families), DeepNet and DenseFormer (both refuse
pruning; each adds ~16 s); the cases and their checks are in tests/fairseq_parity.py."""

import os

import pytest

from .fairseq_parity import CONTROL, check_case, outcomes, params  # noqa: F401  (outcomes: a fixture)

ARCHS = [CONTROL, "residual_e6d6", "crossformer_sg_e6d6", "admin_e6d6"] + (
    ["dca_e6d6", "deepnet_e6d6", "denseformer_e6d6"] if os.environ.get("ALL_FAMILIES") == "1" else []
)


@pytest.mark.parametrize("arch, case", list(params(ARCHS)))
def test_fairseq_case(outcomes, arch, case):  # noqa: F811
    check_case(outcomes, arch, case)
