"""Lanes (SEMANTICS 9): the file format, condition matching, selection and order, markers, waives, errors.

Most tests drive a real inner pytest session (``pytester``) over a small project of their own, with the
machine simulated through ``--kvcm-machine``; only ISOLATION needs real subprocesses.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from pytest_kvcm.lanes import Entry, condition_mismatch, load_lane, parse_entry, pick_auto

H100 = json.dumps({"gpu_count": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 85, "sm": 90})
H200 = json.dumps({"gpu_count": 8, "gpu_name": "NVIDIA H200", "gpu_memory_gb": 143.8, "sm": 90})
CPU = json.dumps({})

TESTS_A = """
    import pytest
    def test_one(): pass
    def test_two(): pass
    @pytest.mark.parametrize("p", [1, 2])
    def test_p(p): pass
"""
TESTS_B = """
    def test_three(): pass
    def test_four(): pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester):
    """A rootdir with suites/a/test_a.py, suites/b/test_b.py and a ci/ dir; returns a lane writer."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.mkdir("suites")
    for name, body in (("a", TESTS_A), ("b", TESTS_B)):
        pytester.mkdir(f"suites/{name}")
        (pytester.path / f"suites/{name}/test_{name}.py").write_text(textwrap.dedent(body))
    pytester.mkdir("ci")

    def write_lane(name: str, body: str) -> None:
        (pytester.path / "ci" / f"{name}.yml").write_text(textwrap.dedent(body))

    return write_lane


def run(pytester: pytest.Pytester, *args: str, machine: str = CPU) -> pytest.RunResult:
    # no:hypothesispytest: its terminal summary re-imports hypothesis in every in-process run (3 s each here)
    return pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--kvcm-machine", machine, *args)


def order_of(result: pytest.RunResult) -> list[str]:
    return [line.split()[0] for line in result.outlines if " PASSED" in line or " SKIPPED" in line
            or " XFAIL" in line or " FAILED" in line or " XPASS" in line]


# ---------------------------------------------------------------- entry grammar


def test_parse_entry_all_markers_and_comment():
    e = parse_entry("suites/x.py::test_y[a b] TIMEOUT (5) ISOLATION XFAIL (bug #12 (rounding))  # see PR", "w")
    assert e == Entry("suites/x.py::test_y[a b]", "w", timeout_min=5.0, isolation=True, xfail="bug #12 (rounding)")
    assert e.path == "suites/x.py"
    assert parse_entry("./suites/managers/ SKIP(no fp8)", "w") == Entry("suites/managers", "w", skip="no fp8")
    assert parse_entry("   # only a comment", "w") is None


@pytest.mark.parametrize("line, message", [
    ("suites/x.py SLOW", "unknown marker 'SLOW'"),
    ("suites/x.py TIMEOUT", "TIMEOUT needs minutes > 0"),
    ("suites/x.py TIMEOUT (0)", "given '0'"),
    ("suites/x.py TIMEOUT (soon)", "given 'soon'"),
    ("suites/x.py SKIP", "SKIP needs a reason"),
    ("suites/x.py ISOLATION (yes)", "ISOLATION takes no argument"),
    ("suites/x.py XFAIL (open", "unbalanced brackets"),
])
def test_parse_entry_errors_name_the_problem(line, message):
    with pytest.raises(pytest.UsageError, match="^ci/l.yml block 1 entry 2: .*" + message.replace("(", r"\(")):
        parse_entry(line, "ci/l.yml block 1 entry 2")


def test_entry_matching_covers_dirs_files_params_and_classes():
    e = Entry("suites/a", "w")
    assert e.matches("suites/a/test_a.py::test_one") and not e.matches("suites/ab/test_x.py::test_one")
    f = Entry("suites/a/test_a.py::test_p", "w")
    assert f.matches("suites/a/test_a.py::test_p[1]") and not f.matches("suites/a/test_a.py::test_p2")
    assert Entry("t.py::TestK", "w").matches("t.py::TestK::test_m")


# ---------------------------------------------------------------- conditions

KEYS = {"system_gpu_count": 2, "gpu": "nvidia h100 80gb hbm3", "stage": "pre_merge"}


@pytest.mark.parametrize("cond, why", [
    ({}, None),
    ({"ranges": {"system_gpu_count": {"gte": 2, "lte": 2}}}, None),  # inclusive both ends
    ({"ranges": {"system_gpu_count": {"gte": 3}}}, "system_gpu_count 2 is not >= 3"),
    ({"ranges": {"system_gpu_count": {"lte": 1}}}, "system_gpu_count 2 is not <= 1"),
    ({"ranges": {"system_gpu_count": {"gt": 2}}}, "system_gpu_count 2 is not > 2"),
    ({"ranges": {"system_gpu_count": {"lt": 2}}}, "system_gpu_count 2 is not < 2"),
    ({"wildcards": {"gpu": ["*A100*", "*H100*"]}}, None),  # case-insensitive, any may match
    ({"wildcards": {"gpu": "*h200*"}}, "gpu 'nvidia h100 80gb hbm3' matches none of ['*h200*']"),
    ({"terms": {"stage": "pre_merge"}}, None),
    ({"terms": {"stage": "post_merge"}}, "stage 'pre_merge' is not 'post_merge'"),
    ({"terms": {"stage": ["nightly", "post_merge"]}}, "stage 'pre_merge' is not one of ['nightly', 'post_merge']"),
    ({"terms": {"rack": "a7"}, "ranges": {"numa": {"gte": 4}}}, None),  # keys the machine does not report match
])
def test_condition_matching(cond, why):
    assert condition_mismatch(cond, KEYS) == why


def test_load_lane_errors_name_file_block_and_field(tmp_path):
    bad = {
        "l0_x.yml": ("l0_y: []\n", "expected a context named 'l0_x' .*found \\['l0_y'\\]"),
        "l0_k.yml": ("l0_k:\n- {tests: [a], when: 1}\n", "l0_k.yml block 1: unknown key\\(s\\) \\['when'\\]"),
        "l0_c.yml": ("l0_c:\n- {condition: {range: {}}, tests: [a]}\n", "unknown condition section\\(s\\) \\['range'\\]"),
        "l0_b.yml": ("l0_b:\n- {condition: {ranges: {sm: {ge: 90}}}, tests: [a]}\n", "ranges.sm.ge: unknown bound"),
        "l0_t.yml": ("l0_t:\n- {tests: [a, 3]}\n", "block 1 entry 2: must be a string, got 3"),
    }
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(pytest.UsageError, match=message):
            load_lane(tmp_path / name)


def test_shipped_lane_files_parse_and_pick_by_machine(pytestconfig):
    ci = pytestconfig.rootpath / "ci"
    for lane in ("l0_cpu", "l0_h100", "l0_h200"):
        assert load_lane(ci / f"{lane}.yml").blocks, lane
    cpu = {"system_gpu_count": 0, "gpu": "none", "stage": "pre_merge"}
    assert pick_auto(ci, cpu)[0].name == "l0_cpu"
    assert pick_auto(ci, {**cpu, "system_gpu_count": 8, "gpu": "nvidia h100 80gb hbm3"})[0].name == "l0_h100"
    assert pick_auto(ci, {**cpu, "system_gpu_count": 8, "gpu": "nvidia h200"})[0].name == "l0_h200"
    with pytest.raises(pytest.UsageError, match="none of the 3 lane file.*l0_cpu block 1: stage 'nightly' is not "
                       "'pre_merge'; l0_h100 block 1: system_gpu_count 0 is not >= 1"):
        pick_auto(ci, {**cpu, "stage": "nightly"})


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
    result = run(pytester, "--kvcm-lane=l0_cpu", "-rs")
    result.assert_outcomes(passed=1, skipped=1, deselected=2)
    result.stdout.fnmatch_lines(["*1 waived*", "SKIPPED*issue 7: window (ci/waives.txt:3)"], consecutive=False)
    result = run(pytester, "-rs", "suites")  # no lane: waives still apply
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


# ---------------------------------------------------------------- ISOLATION (real subprocesses)


def test_isolation_runs_each_test_in_its_own_process(pytester, project, monkeypatch):
    monkeypatch.setenv("KVCM_TEST_PARENT_PID", str(os.getpid()))
    (pytester.path / "suites/iso").mkdir()
    (pytester.path / "suites/iso/test_iso.py").write_text(textwrap.dedent("""
        import os, pytest
        @pytest.fixture(scope="module")
        def shared(): return 1
        def test_own_process(shared):
            assert os.getpid() != int(os.environ["KVCM_TEST_PARENT_PID"])
        def test_crash(shared):
            os._exit(3)
        def test_in_parent(shared):
            assert os.getpid() == int(os.environ["KVCM_TEST_PARENT_PID"])
    """))
    project("l0_cpu", """
        l0_cpu:
        - tests:
          - suites/iso/test_iso.py::test_own_process ISOLATION
          - suites/iso/test_iso.py::test_crash ISOLATION XFAIL (crashes on purpose)
          - suites/iso/test_iso.py::test_in_parent
          - suites/a/test_a.py::test_one          # another module after isolated ones: setup state is sound
    """)
    result = run(pytester, "--kvcm-lane=l0_cpu", "-v", "-rx")
    result.assert_outcomes(passed=3, xfailed=1, deselected=3)
    assert order_of(result)[:3] == ["suites/iso/test_iso.py::test_own_process",
                                    "suites/iso/test_iso.py::test_crash", "suites/iso/test_iso.py::test_in_parent"]
    result.stdout.fnmatch_lines([
        "*2 isolated*",
        "XFAIL suites/iso/test_iso.py::test_crash - crashes on purpose (ci/l0_cpu.yml block 1 entry 2); "
        "ISOLATION: `*-m pytest * */suites/iso/test_iso.py::test_crash` exited with code 3 "
        "after 1 report(s) for suites/iso/test_iso.py::test_crash",
    ], consecutive=False)


def test_isolated_failure_is_replayed_with_its_traceback(pytester, project):
    (pytester.path / "suites/iso").mkdir()
    (pytester.path / "suites/iso/test_fail.py").write_text("def test_fail():\n    assert 40 + 2 == 43\n")
    project("l0_cpu", "l0_cpu:\n- tests: [suites/iso/test_fail.py ISOLATION]\n")
    result = run(pytester, "--kvcm-lane=l0_cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       assert (40 + 2) == 43", "suites/iso/test_fail.py:2: AssertionError"])
