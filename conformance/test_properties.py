"""Property tests (case class 12): hypothesis draws cases inside each kernel's contract and the
reference is the oracle. Profiles: --oracle-profile quick (derandomized, 15 examples per kernel),
full (200), exhaustive (2000)."""

import pytest
from hypothesis import HealthCheck, given, settings

from oracle.pytest_plugin import check_case
from oracle.strategies import cases

EXAMPLES = {"quick": 15, "full": 200, "exhaustive": 2000}


@pytest.fixture
def profile_settings(request):
    profile = request.config.getoption("oracle_profile")
    return settings(max_examples=EXAMPLES[profile], derandomize=profile == "quick", deadline=None,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.function_scoped_fixture])


def test_property(request, oracle_kernel, profile_settings):
    kernel, reason = oracle_kernel
    if reason:
        pytest.skip(reason)

    @profile_settings
    @given(case=cases(kernel.contract.op, kernel.contract))
    def holds(case):
        check_case(request, (kernel, case, None))

    holds()
