"""fairseq's own translation test cases on Crossformer-HG, Crossformer-All and k-DCA (the second half of
tests/test_fairseq_parity.py, in its own file so that CI's two workers run both halves side by side)."""

import pytest

from .fairseq_parity import CONTROL, check_case, outcomes, params  # noqa: F401  (outcomes: a fixture)


@pytest.mark.parametrize("arch, case", list(params(["crossformer_hg_e6d6", "crossformer_all_e16d6", "dca_k2_e6d6"])))
def test_fairseq_case(outcomes, arch, case):  # noqa: F811
    check_case(outcomes, arch, case)
