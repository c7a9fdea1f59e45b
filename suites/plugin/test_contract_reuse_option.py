"""``--kvcm-reuse`` applies to the contract suites (issue 42.2): it used to be accepted there and change nothing.
On (the default): a target with block reuse is built with it on for every test; off: the block-reuse tests skip
with the reason; both: each test twice, ids ``[<target>-reuse]`` / ``[<target>-noreuse]``."""

import pytest

pytestmark = pytest.mark.cpu_only

ARGS = ("-p", "no:randomly", "--kvcm-target=kvcm-v2,trtllm", "-v", "--pyargs",
        "pytest_kvcm.contract.test_target_lifecycle::test_no_page_leaks_after_free",
        "pytest_kvcm.contract.test_target_reuse::test_reset_refuses_while_in_use")


def test_off_skips_the_reuse_tests_with_the_reason(pytester):
    result = pytester.runpytest_inprocess("--kvcm-reuse=off", "-rs", *ARGS)
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*block reuse is off in this run (--kvcm-reuse=off*"])


def test_on_builds_a_reuse_target_with_reuse_for_every_test(pytester):
    pytester.makepyfile(test_spec="""
from pytest_kvcm.targets import PoolSpec

def test_pool(kvcm_target):
    target = kvcm_target(PoolSpec(num_pages=8))
    print("built with reuse:", target.name, target.spec.reuse)
""")
    result = pytester.runpytest_inprocess("-s", "-p", "no:randomly", "--kvcm-target=kvcm-v2,trtllm")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*built with reuse: kvcm-v2 True*", "*built with reuse: trtllm False*"])


def test_both_runs_each_test_with_reuse_on_and_off(pytester):
    result = pytester.runpytest_inprocess("--kvcm-reuse=both", "-rs", *ARGS)
    result.stdout.fnmatch_lines([
        "*test_no_page_leaks_after_free[[]kvcm-v2-reuse[]] PASSED*",
        "*test_no_page_leaks_after_free[[]kvcm-v2-noreuse[]] PASSED*",
        "*test_no_page_leaks_after_free[[]trtllm-reuse[]] SKIPPED*",
        "*test_no_page_leaks_after_free[[]trtllm-noreuse[]] PASSED*",
    ])
    result.assert_outcomes(passed=4, skipped=4)
