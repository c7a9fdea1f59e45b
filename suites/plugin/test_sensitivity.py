"""kvcm sensitivity's fast mode: each defect runs only its named catchers, after a clean run of them, and must
be caught by at least two tests; a defect naming none runs the lane."""

import argparse

import pytest

pytestmark = pytest.mark.cpu_only

CONFTEST = """
import probe_lib

def pytest_kvcm_register_defects(registry):
    def off_by_one(mp):
        mp.setattr(probe_lib, "pages", lambda tokens: tokens // 16)
    registry.register("off-by-one", "pages rounded down", off_by_one, upstream="tracker #1",
                      catchers=("test_probe.py::test_exact", "test_probe.py::test_partial"))
    registry.register("lonely", "pages rounded down, one catcher", off_by_one, upstream="tracker #2",
                      catchers=("test_probe.py::test_partial",))
    registry.register("raises", "pages raises", lambda mp: mp.setattr(probe_lib, "pages", lambda tokens: 1 // 0),
                      upstream="tracker #3", catchers=("test_probe_fixture.py",))
"""
LIB = "def pages(tokens):\n    return -(-tokens // 16)\n"
PROBE = """
import probe_lib

def test_exact():
    assert probe_lib.pages(33) == 3

def test_partial():
    assert probe_lib.pages(1) == 1

def test_unrelated():
    assert probe_lib.pages(32) == 2
"""

PROBE_FIXTURE = """
import probe_lib
import pytest

@pytest.fixture
def one_token():
    return probe_lib.pages(1)

def test_one_token_takes_a_page(one_token):
    assert one_token == 1

def test_one_token_is_not_two(one_token):
    assert one_token != 2
"""


def _run(pytester, monkeypatch, capsys, *defects):
    from pytest_kvcm import sensitivity

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(probe_lib=LIB, test_probe=PROBE, test_probe_fixture=PROBE_FIXTURE)
    monkeypatch.chdir(pytester.path)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    args = argparse.Namespace(lane=None, defect=list(defects), pytest_args="", json=None, mode="fast",
                              min_catchers=2)
    code = sensitivity.main(args)
    return code, capsys.readouterr().out


@pytest.mark.post_merge
def test_fast_mode_runs_the_named_catchers_and_counts_them(pytester, monkeypatch, capsys):
    code, out = _run(pytester, monkeypatch, capsys, "off-by-one")
    assert code == 0, out
    assert "clean run of the 2 named catchers: 2 tests, 0 failed" in out
    assert "off-by-one (caught by 2 failed test(s)" in out and "[upstream: tracker #1]" in out
    assert "test_unrelated" not in out


@pytest.mark.post_merge
def test_a_defect_caught_by_one_test_fails_the_check(pytester, monkeypatch, capsys):
    code, out = _run(pytester, monkeypatch, capsys, "lonely")
    assert code == 1, out
    assert "lonely (caught by 1 failed test(s)" in out and "FEWER THAN 2" in out


def test_a_catcher_that_errors_is_broken_not_a_catch(pytester, monkeypatch, capsys):
    """Issue 55.5: an error (here in a fixture: set-up) counted as a catch, so a defect that could not reach its
    catchers passed. Both catchers error: UNCAUGHT, each listed as broken."""
    code, out = _run(pytester, monkeypatch, capsys, "raises")
    assert code == 1, out
    assert "raises (UNCAUGHT; 2 broken;" in out, out
    assert out.count("broken (errored before it could check; not a catch): test_probe_fixture::") == 2, out
    assert "ZeroDivisionError" in out, out


def test_without_defect_only_the_defects_whose_catchers_are_here_run(tmp_path, monkeypatch, capsys):
    """Issue 55.4: from a maintainer's directory the built-in catalogue (its catchers are this project's suites)
    ran and went UNCAUGHT; now it is left out with one line, and with nothing left the run says what to do."""
    from pytest_kvcm import sensitivity

    monkeypatch.chdir(tmp_path)
    (tmp_path / "test_mine.py").write_text("")
    registry = {"builtin": {"catchers": ["suites/managers/test_budget.py::test_x"]},
                "mine": {"catchers": ["test_mine.py::test_y"]},
                "pyargs": {"catchers": ["pytest_kvcm.contract.test_target_lifecycle"]}}
    args = argparse.Namespace(defect=None)
    assert sensitivity._chosen_defects(args, registry) == ["mine", "pyargs"]
    assert capsys.readouterr().err.startswith("kvcm sensitivity: 1 registered defect(s) left out, their catchers "
                                              "not here (as suites/managers/test_budget.py)")
    assert sensitivity._chosen_defects(argparse.Namespace(defect=["builtin"]), registry) == ["builtin"]
    with pytest.raises(sensitivity.InputError, match="no defect to run here: register your own"):
        sensitivity._chosen_defects(args, {"builtin": registry["builtin"]})
