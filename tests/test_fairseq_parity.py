"""fairseq's own translation test cases on fairseq's transformer (the control), ResiDual and Crossformer-SG,
and full DCA with ALL_FAMILIES=1 (CI runs k-DCA, the same model class, in _2.py; tests/helpers.py
trained_families); the cases and their checks are in tests/fairseq_parity.py."""

import os

import pytest

from .fairseq_parity import CONTROL, check_case, outcomes, params  # noqa: F401  (outcomes: a fixture)

ARCHS = [CONTROL, "residual_e6d6", "crossformer_sg_e6d6"] + (["dca_e6d6"] if os.environ.get("ALL_FAMILIES") == "1" else [])


@pytest.mark.parametrize("arch, case", list(params(ARCHS)))
def test_fairseq_case(outcomes, arch, case):  # noqa: F811
    check_case(outcomes, arch, case)
