"""fairseq's own translation test cases on fairseq's transformer (the control), ResiDual, Crossformer-SG and DCA;
the cases and their checks are in tests/fairseq_parity.py."""

import pytest

from .fairseq_parity import CONTROL, check_case, outcomes, params  # noqa: F401  (outcomes: a fixture)


@pytest.mark.parametrize("arch, case", list(params([CONTROL, "residual_e6d6", "crossformer_sg_e6d6", "dca_e6d6"])))
def test_fairseq_case(outcomes, arch, case):  # noqa: F811
    check_case(outcomes, arch, case)
