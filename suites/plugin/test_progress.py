"""Progress of long steps: bars that reach the terminal through pytest's capture, and sensitivity's run lines."""

from __future__ import annotations

from pytest_kvcm.sensitivity import Progress


def test_kvcm_progress_bar_shows_while_output_is_captured(pytester, monkeypatch):
    # the inner run is a plain one even when this suite runs under xdist (whose workers' bars are off)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile("""
        def test_long(kvcm_progress):
            print("captured, never shown")
            bar = kvcm_progress(total=3, desc="model gate", unit="q")
            for _ in range(3):
                bar.update(1)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "model gate: 100%" in result.stderr.str() + result.stdout.str()
    assert "3/3" in result.stderr.str()
    assert "captured, never shown" not in result.stdout.str() + result.stderr.str()


def test_sensitivity_prints_a_line_per_finished_run(capsys):
    with Progress(2, "l0_cpu") as progress:
        progress.done({"defect": None, "tests": 400, "caught_by": [], "seconds": 61.0})
        progress.done({"defect": "gen-dummy-extra-token", "tests": 400, "caught_by": ["a::t", "b::t"],
                       "seconds": 58.5})
    err = capsys.readouterr().err.splitlines()
    assert err == ["sensitivity: 2 runs of lane l0_cpu (clean, then one per defect), one at a time",
                   "[1/2] clean run: 400 tests, nothing failed (61.0 s)",
                   "[2/2] gen-dummy-extra-token: 400 tests, 2 failed (58.5 s)"]
