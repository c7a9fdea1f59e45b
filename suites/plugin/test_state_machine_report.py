"""A failing contract state machine says what went wrong in a few lines (issue 42.5): it printed about 50 lines of
single tokens (each drawn prompt as its token ids) before the steps that mattered."""

import pytest

pytestmark = pytest.mark.cpu_only

BUGGY = """
from pytest_kvcm.targets.kvcm_targets import KvcmV2Target


class Buggy(KvcmV2Target):
    name = "buggy"

    def lookup(self, ids):
        return super().lookup(list(ids) + [0])   # the bug: the prompt's last token matched


def pytest_kvcm_register_targets(registry):
    registry["buggy"] = Buggy
"""


@pytest.mark.post_merge
def test_reuse_state_machine_failure_prints_steps_not_tokens(pytester):
    pytester.makeconftest(BUGGY)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--kvcm-target=buggy", "--pyargs",
                                           "pytest_kvcm.contract.test_target_reuse_state_machine")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    failure = out[out.index("Failing test case"):out.index("short test summary")]
    assert "state.lookup(family=" in failure and "Draw " not in failure, failure
    assert len(failure.splitlines()) < 20, failure
    result.stdout.fnmatch_lines(["E * lookup of 1 block(s) [[]*[]]: target 16, kvcm 0"])
