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


def _run(pytester, monkeypatch, capsys, *defects):
    from pytest_kvcm import sensitivity

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(probe_lib=LIB, test_probe=PROBE)
    monkeypatch.chdir(pytester.path)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    args = argparse.Namespace(lane=None, defect=list(defects), pytest_args="", json=None, mode="fast",
                              min_catchers=2)
    code = sensitivity.main(args)
    return code, capsys.readouterr().out


def test_fast_mode_runs_the_named_catchers_and_counts_them(pytester, monkeypatch, capsys):
    code, out = _run(pytester, monkeypatch, capsys, "off-by-one")
    assert code == 0, out
    assert "clean run of the 2 named catchers: 2 tests, 0 failed" in out
    assert "off-by-one (caught by 2 test(s)" in out and "[upstream: tracker #1]" in out
    assert "test_unrelated" not in out


def test_a_defect_caught_by_one_test_fails_the_check(pytester, monkeypatch, capsys):
    code, out = _run(pytester, monkeypatch, capsys, "lonely")
    assert code == 1, out
    assert "lonely (caught by 1 test(s)" in out and "FEWER THAN 2" in out
