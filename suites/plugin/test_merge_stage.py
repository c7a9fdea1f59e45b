"""Pre-merge and post-merge (``--kvcm-stage``): which tests each stage runs, and the explorer's budget in each."""

from __future__ import annotations

import pytest

from pytest_kvcm.options import EXHAUSTIVE_QUICK_SCALE

TESTS = """
    import pytest
    def test_quick(): pass
    @pytest.mark.post_merge
    def test_deep(): pass
    @pytest.mark.slow
    def test_model_gate(): pass
    @pytest.mark.exhaustive
    def test_explorer(request):
        from pytest_kvcm.markers import exhaustive_scale
        open("scale.txt", "w").write(str(exhaustive_scale(request.config)))
    @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.post_merge)])
    def test_param(x): pass
"""


def ran(pytester: pytest.Pytester, *args: str) -> tuple[set[str], pytest.RunResult]:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest\n")
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_inprocess("-v", *args)
    names = {line.split("::")[1].split(" ")[0] for line in result.outlines if "::" in line and " PASSED" in line}
    return names, result


def scale(pytester: pytest.Pytester) -> float:
    return float((pytester.path / "scale.txt").read_text())


def test_pre_merge_is_the_default_and_leaves_the_deep_tests_out(pytester):
    names, result = ran(pytester)
    assert names == {"test_quick", "test_explorer", "test_param[1]"}
    result.assert_outcomes(passed=3, deselected=3)
    result.stdout.fnmatch_lines(["kvcm stage pre_merge: 3 post-merge test(s) deselected*--kvcm-stage=post_merge*"])
    assert scale(pytester) == EXHAUSTIVE_QUICK_SCALE


def test_post_merge_runs_only_the_deep_tests_and_the_explorer_at_full_budget(pytester):
    names, result = ran(pytester, "--kvcm-stage=post_merge")
    assert names == {"test_deep", "test_model_gate", "test_explorer", "test_param[2]"}
    result.assert_outcomes(passed=4, deselected=2)
    result.stdout.fnmatch_lines(["kvcm stage post_merge: the tests marked post_merge or slow; 2 pre-merge*"])
    assert scale(pytester) == 1.0


def test_the_two_stages_together_run_every_test_once(pytester):
    pre, _ = ran(pytester)
    post, _ = ran(pytester, "--kvcm-stage=post_merge")
    assert pre | post == {"test_quick", "test_deep", "test_model_gate", "test_explorer", "test_param[1]",
                          "test_param[2]"}
    assert pre & post == {"test_explorer"}


def test_a_lane_files_own_stage_deselects_nothing_by_marker(pytester):
    names, result = ran(pytester, "--kvcm-stage=nightly", "--kvcm-slow")
    assert names == {"test_quick", "test_deep", "test_model_gate", "test_explorer", "test_param[1]",
                     "test_param[2]"}


def test_an_explicit_scale_wins_over_the_stage(pytester):
    ran(pytester, "--kvcm-stage=post_merge", "--kvcm-exhaustive-scale=0.5")
    assert scale(pytester) == 0.5


def test_an_empty_stage_is_a_usage_error(pytester):
    _, result = ran(pytester, "--kvcm-stage=")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-stage='': name a stage" in result.stderr.str()

