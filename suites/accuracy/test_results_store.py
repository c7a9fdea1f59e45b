"""The SQLite results store: concurrent writers lose nothing, a killed writer keeps what it committed."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from pytest_kvcm.results import COLUMNS, ResultsStore

WRITER = """
import sys
from pytest_kvcm.results import ResultsStore
path, who, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = ResultsStore(path, run_id="run-" + who, lane="cpu", machine="m-" + who)
for i in range(count):
    store.record(metric="accuracy.gsm8k", value=i, test_id=f"{who}::t{i}", n=i, passed=i % 2 == 0,
                 extra={"who": who, "i": i})
    print(i, flush=True)
store.close()
"""


def spawn(path, who, count):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), who, str(count)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_concurrent_processes_lose_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    procs = [spawn(path, f"w{k}", 150) for k in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with ResultsStore(path) as store:
        got = store.query()
    assert len(got) == 600
    assert {(r["extra"]["who"], r["extra"]["i"]) for r in got} == {(f"w{k}", i) for k in range(4) for i in range(150)}
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_killed_writer_keeps_its_committed_rows(tmp_path):
    path = tmp_path / "r.sqlite"
    p = spawn(path, "victim", 100_000)
    seen = -1
    deadline = time.monotonic() + 60
    while seen < 50 and time.monotonic() < deadline:
        seen = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    values = [v for (v,) in con.execute("SELECT value FROM results ORDER BY id")]
    # every row printed as committed is there, in order, nothing torn
    assert len(values) >= seen + 1
    assert values == [float(i) for i in range(len(values))]


def test_record_and_query(tmp_path):
    with ResultsStore(tmp_path / "r.sqlite", run_id="R1", git_commit="abc", lane="gpu-h100", machine="box") as s:
        a = s.record("accuracy.gsm8k", 71.5, test_id="t::a", model="m", kvcm_version="v1", threshold=70.0,
                     n=1319, passed=True, extra={"spec": {"dtype": "auto"}})
        s.record("accuracy.gsm8k", 69.0, test_id="t::a", model="m", kvcm_version="v2", threshold=70.0, n=1319,
                 passed=False)
        s.record("warmup_skipped", 0, test_id="t::w", run_id="R2")
        s.record("parity_first_diff", None, test_id="t::p")
        (row,) = s.query(kvcm_version="v1")
        assert row["id"] == a
        assert {k: row[k] for k in COLUMNS if k not in ("time", "extra")} == {
            "run_id": "R1", "git_commit": "abc", "lane": "gpu-h100", "machine": "box", "test_id": "t::a",
            "model": "m", "kvcm_version": "v1", "metric": "accuracy.gsm8k", "value": 71.5, "threshold": 70.0,
            "n": 1319, "passed": True}
        assert row["extra"] == {"spec": {"dtype": "auto"}}
        assert [r["passed"] for r in s.query(test_id="t::a")] == [True, False]
        assert [r["run_id"] for r in s.query(metric="warmup_skipped")] == ["R2"]
        assert len(s.query(metric_prefix="accuracy.")) == 2
        assert s.query(metric_prefix="parity_")[0]["value"] is None  # '_' is literal, not a wildcard
        assert len(s.query(metric_prefix="parity%")) == 0
        assert s.query(passed=False)[0]["kvcm_version"] == "v2"
        assert s.query(newest_first=True, limit=1)[0]["metric"] == "parity_first_diff"


def test_record_errors_name_the_field(tmp_path):
    with ResultsStore(tmp_path / "r.sqlite") as s:
        with pytest.raises(ValueError, match="metric name"):
            s.record("", 1.0)
        with pytest.raises(TypeError, match=r"unknown column\(s\) \['modle'\]"):
            s.record("m", 1.0, modle="x")


def test_plugin_path_option_ini_and_off(pytester):
    pytester.makepyfile("""
        def test_a(kvcm_results):
            kvcm_results.record(metric="warmup_skipped", value=0, extra={"planned": 4})
    """)
    pytester.runpytest("--kvcm-results=custom/r.db").assert_outcomes(passed=1)
    assert (pytester.path / "custom" / "r.db").is_file()
    pytester.makeini("[pytest]\nkvcm_results = from_ini.sqlite\n")
    pytester.runpytest().assert_outcomes(passed=1)
    with ResultsStore(pytester.path / "from_ini.sqlite") as s:
        (row,) = s.query()
        assert (row["metric"], row["extra"], row["test_id"]) == ("warmup_skipped", {"planned": 4},
                                                                 "test_plugin_path_option_ini_and_off.py::test_a")
    pytester.runpytest("--kvcm-results=none").assert_outcomes(passed=1)
    assert not (pytester.path / ".kvcm").exists()
