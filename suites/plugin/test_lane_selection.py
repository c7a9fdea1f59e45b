"""Lane selection: what a lane collects and runs, in which order, with which marks and waives; its errors."""

from __future__ import annotations

import textwrap

import pytest

from _lane_project import CPU, H100, H200, order_of, run


# ---------------------------------------------------------------- selection, order, collection


def test_lane_runs_exactly_its_tests_in_lane_order(pytester, project):
    project("l0_cpu", """
        l0_cpu:
        - tests:
          - suites/b/test_b.py::test_four
          - suites/a                        # a directory keeps collection order inside it
          - suites/a/test_a.py::test_one    # already placed: keeps its first position
    """)
    result = run(pytester, "--kvcm-lane=l0_cpu", "-v")
    assert order_of(result) == [
        "suites/b/test_b.py::test_four", "suites/a/test_a.py::test_one", "suites/a/test_a.py::test_two",
        "suites/a/test_a.py::test_p[1]", "suites/a/test_a.py::test_p[2]",
    ]
    result.stdout.fnmatch_lines(["kvcm lane l0_cpu: 5 tests selected from 1 blocks (1 matched)"])
    result.assert_outcomes(passed=5, deselected=1)  # test_three: its file was collected for test_four


def test_lane_collects_only_its_paths(pytester, project):
    (pytester.path / "suites/broken").mkdir()
    (pytester.path / "suites/broken/test_broken.py").write_text("this is not python\n")
    project("l0_cpu", "l0_cpu:\n- tests: [suites/a/test_a.py::test_one]\n")
    result = run(pytester, "--kvcm-lane=l0_cpu")
    result.assert_outcomes(passed=1, deselected=3)  # suites/broken and suites/b were never imported
    assert result.ret == 0
    # paths on the command line win over the lane's paths; the lane still selects among them
    result = run(pytester, "--kvcm-lane=l0_cpu", "suites/b")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.assert_outcomes(deselected=2)


def test_ini_lane_and_lane_path(pytester, project):
    project("l0_cpu", "l0_cpu:\n- tests: [suites/b]\n")
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\nkvcm_lane = l0_cpu\n")
    run(pytester).assert_outcomes(passed=2)
    (pytester.path / "elsewhere.yml").write_text("elsewhere:\n- tests: [suites/a/test_a.py::test_two]\n")
    run(pytester, "--kvcm-lane=elsewhere.yml").assert_outcomes(passed=1, deselected=3)


def test_blocks_follow_the_machine(pytester, project):
    project("l0_h100", """
        version: 0.0.1
        l0_h100:
        - condition: {terms: {stage: pre_merge}}
          tests: [suites/b/test_b.py::test_three]
        - condition:
            ranges: {system_gpu_count: {gte: 1}}
            wildcards: {gpu: ['*h100*']}
          tests: [suites/a/test_a.py::test_one]
        - condition:
            ranges: {system_gpu_count: {gte: 16}}
          tests: [suites/a/test_a.py::test_two]
    """)
    result = run(pytester, "--kvcm-lane=l0_h100", "-v", machine=H100)
    assert order_of(result) == ["suites/b/test_b.py::test_three", "suites/a/test_a.py::test_one"]
    result.stdout.fnmatch_lines([
        "kvcm lane l0_h100 (ci/l0_h100.yml): 2 of 3 block(s) match system_gpu_count=8, "
        "gpu='nvidia h100 80gb hbm3', gpu_memory_gb=85.0, sm=90, stage='pre_merge'",
        "  block 3 (1 entries) not matched: system_gpu_count 8 is not >= 16",
        "kvcm lane l0_h100: 2 tests selected from 3 blocks (2 matched)",
    ])
    result = run(pytester, "--kvcm-lane=l0_h100", "-v")  # the CPU machine: only the first block
    assert order_of(result) == ["suites/b/test_b.py::test_three"]
    result.stdout.fnmatch_lines(["  block 2 (1 entries) not matched: system_gpu_count 0 is not >= 1"])
    result = run(pytester, "--kvcm-lane=l0_h100", "--kvcm-stage=post_merge", machine=H100)
    result.stdout.fnmatch_lines(["kvcm lane l0_h100: 1 tests selected from 3 blocks (1 matched)"])
    result = run(pytester, "--kvcm-lane=l0_h100", "--kvcm-lane-all-blocks")
    result.stdout.fnmatch_lines(["kvcm lane l0_h100 (--kvcm-lane-all-blocks): 3 tests selected*"])


def test_auto_lane_prefers_the_gpu_lane_of_this_machine(pytester, project):
    project("l0_cpu", "l0_cpu:\n- condition: {terms: {stage: pre_merge}}\n  tests: [suites/a]\n")
    for gpu in ("h100", "h200"):
        project(f"l0_{gpu}", f"""
            l0_{gpu}:
            - condition:
                ranges: {{system_gpu_count: {{gte: 1}}}}
                wildcards: {{gpu: ['*{gpu}*']}}
                terms: {{stage: pre_merge}}
              tests: [suites/b/test_b.py::test_{'three' if gpu == 'h100' else 'four'}]
        """)
    picked = {}
    for name, machine in (("cpu", CPU), ("h100", H100), ("h200", H200)):
        result = run(pytester, "--kvcm-lane=auto", machine=machine)
        line = [ln for ln in result.outlines if ln.startswith("kvcm lane l0_") and "selected" in ln][0]
        picked[name] = line.split()[2]
    assert picked == {"cpu": "l0_cpu", "h100": "l0_h100", "h200": "l0_h200"}
    result = run(pytester, "--kvcm-lane=auto", "--kvcm-stage=nightly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "none of the 3 lane file(s) in ci has a block matching this machine" in result.stderr.str()


def test_directory_without_tests_selects_nothing(pytester, project):
    (pytester.path / "suites/empty").mkdir()
    project("l0_cpu", "l0_cpu:\n- tests: [suites/empty, suites/a/test_a.py::test_two]\n")
    result = run(pytester, "--kvcm-lane=l0_cpu")
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines(["kvcm lane l0_cpu: 1 tests selected from 1 blocks (1 matched)"])


# ---------------------------------------------------------------- errors


def test_unknown_path_is_a_usage_error_with_suggestions(pytester, project):
    project("l0_cpu", """
        l0_cpu:
        - tests: [suites/a]
        - condition: {ranges: {system_gpu_count: {gte: 8}}}   # not matched here: still checked
          tests: [suites/b/test_bb.py, suites/zzz_nothing_like_it]
    """)
    result = run(pytester, "--kvcm-lane=l0_cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "lane l0_cpu: 2 unknown test id(s):" in err
    assert ("ci/l0_cpu.yml block 2 entry 1: 'suites/b/test_bb.py' is not an existing file or directory; "
            "did you mean: suites/b/test_b.py") in err
    assert "block 2 entry 2: 'suites/zzz_nothing_like_it' is not an existing file or directory; no similar id" in err


def test_unknown_node_id_is_a_usage_error_with_suggestions(pytester, project):
    project("l0_cpu", "l0_cpu:\n- tests:\n  - suites/a/test_a.py::test_onee\n  - suites/a/test_a.py::test_p[3]\n")
    result = run(pytester, "--kvcm-lane=l0_cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert ("block 1 entry 1: 'suites/a/test_a.py::test_onee' is not a collected test; "
            "did you mean: suites/a/test_a.py::test_one") in err
    assert ("'suites/a/test_a.py::test_p[3]' is not a collected test; "
            "did you mean: suites/a/test_a.py::test_p[2], suites/a/test_a.py::test_p[1]") in err


def test_unknown_lane_names_the_known_lanes(pytester, project):
    project("l0_cpu", "l0_cpu:\n- tests: [suites/a]\n")
    result = run(pytester, "--kvcm-lane=l0_gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-lane=l0_gpu: no lane file ci/l0_gpu.yml; lanes in ci: ['l0_cpu']" in result.stderr.str()


# ---------------------------------------------------------------- markers, waives


def test_skip_xfail_and_timeout_marks(pytester, project):
    (pytester.path / "suites/c").mkdir()
    (pytester.path / "suites/c/test_c.py").write_text(textwrap.dedent("""
        import time
        def test_limit(request):
            assert request.node.get_closest_marker("timeout").args == (90.0,)
        def test_broken(): assert False
        def test_slow(): time.sleep(10)
    """))
    project("l0_cpu", """
        l0_cpu:
        - tests:
          - suites/a/test_a.py::test_one SKIP (needs fp8)
          - suites/a/test_a.py::test_p XFAIL (rounding)      # both parametrizations
          - suites/c/test_c.py::test_limit TIMEOUT (1.5)
          - suites/c/test_c.py::test_broken XFAIL (known)
          - suites/c/test_c.py::test_slow TIMEOUT (0.02)
    """)
    result = run(pytester, "--kvcm-lane=l0_cpu", "-rsxX")
    result.assert_outcomes(passed=1, skipped=1, xpassed=2, xfailed=1, failed=1, deselected=1)
    result.stdout.fnmatch_lines([
        "*kvcm lane l0_cpu: 6 tests selected from 1 blocks (1 matched); 2 with TIMEOUT",
        "E   Failed: Timeout (>1.2s) from pytest-timeout.",
        "SKIPPED [[]1[]] suites/a/test_a.py*: needs fp8 (ci/l0_cpu.yml block 1 entry 1)",
        "XFAIL suites/c/test_c.py::test_broken - known (ci/l0_cpu.yml block 1 entry 4)",
        "XPASS suites/a/test_a.py::test_p[[]1[]] - rounding (ci/l0_cpu.yml block 1 entry 2)",
    ], consecutive=False)


def test_timeout_without_pytest_timeout_warns(pytester, project):
    project("l0_cpu", "l0_cpu:\n- tests: [suites/b/test_b.py::test_three TIMEOUT (1)]\n")
    result = run(pytester, "--kvcm-lane=l0_cpu", "-p", "no:timeout", "-W", "always")
    result.assert_outcomes(passed=1, deselected=1)  # other warnings (assert rewriting) depend on the install
    result.stdout.fnmatch_lines(["*1 test(s) have a lane TIMEOUT but pytest-timeout is not installed*"])


def test_waives_apply_after_selection_and_without_a_lane(pytester, project):
    (pytester.path / "ci/waives.txt").write_text(textwrap.dedent("""
        # waived until the window fix lands
        suites/a/test_a.py::test_two SKIP (issue 7: window)
        suites/b SKIP (b is flaky)   # a directory
    """))
    project("l0_cpu", "l0_cpu:\n- tests: [suites/a/test_a.py::test_two, suites/a/test_a.py::test_one]\n")
    result = run(pytester, "--kvcm-lane=l0_cpu", "-ra")
    result.assert_outcomes(passed=1, skipped=1, deselected=2)
    result.stdout.fnmatch_lines(["*1 waived*", "SKIPPED*issue 7: window (ci/waives.txt:3)"], consecutive=False)
    result = run(pytester, "-ra", "suites")  # no lane: waives still apply
    result.assert_outcomes(passed=3, skipped=3)
    result = run(pytester, "--kvcm-waives=ci/none.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-waives=ci/none.txt: no such file" in result.stderr.str()


def test_stale_waive_warns_with_nearest_id(pytester, project):
    (pytester.path / "ci/waives.txt").write_text("suites/a/test_a.py::test_too SKIP (x)\ngone/test_g.py SKIP (y)\n")
    result = run(pytester, "suites", "-W", "always")
    result.assert_outcomes(passed=6)  # the two waive warnings are matched below by text
    result.stdout.fnmatch_lines([
        "*ci/waives.txt:1: waive 'suites/a/test_a.py::test_too': matches none of the 6 selected tests; "
        "did you mean: suites/a/test_a.py::test_two*",
        "*ci/waives.txt:2: waive 'gone/test_g.py': path 'gone/test_g.py' does not exist*",
    ], consecutive=False)
    (pytester.path / "ci/waives.txt").write_text("suites/a/test_a.py::test_two TIMEOUT (1)\n")
    result = run(pytester, "suites")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ci/waives.txt:1: a waive is 'node_id SKIP (reason)'" in result.stderr.str()
