"""ISOLATION: a lane entry in a subprocess of its own (real subprocesses), its reports replayed in the parent."""

from __future__ import annotations

import os
import textwrap

from _lane_project import order_of, run


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
