"""The results store and its dashboard with files they cannot use: one line naming the path and the problem,
before any work (pytest start-up; the dashboard before it reads a row), never a traceback, and no row whose
numbers are not numbers.

Before, the dashboard raised ``IsADirectoryError``/``PermissionError`` tracebacks for its output, reported a
corrupt or foreign store as ``file is not a database`` or ``no such column: id`` without the path, rendered a
text score as if it were one; pytest started a run on a store of another schema or one it could not write, and
``record(value="abc")`` failed with ``could not convert string to float``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kvcm.dashboard import main as dashboard
from pytest_kvcm.results import ResultsStore

from _robustness import shared_tmp, unprivileged_prefix

ROOT = Path(__file__).resolve().parents[2]


def _good(path: Path) -> Path:
    with ResultsStore(path, run_id="r1") as store:
        store.record("accuracy.gsm8k", 71.5, test_id="t::a", model="m", kvcm_version="v1", threshold=70.0, n=10)
    return path


def _edit(path: Path, sql: str) -> Path:
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    return path


def _stores(d: Path) -> dict[str, Path]:
    (d / "garbage.db").write_text("garbage")
    (d / "header_then_garbage.db").write_bytes(b"SQLite format 3\x00" + b"garbage" * 200)
    (d / "empty.db").write_bytes(b"")
    (d / "a_dir.db").mkdir()
    return {
        "good": _good(d / "good.db"),
        "foreign_schema": _edit(d / "foreign.db", "CREATE TABLE results (a, b)"),
        "other_tables": _edit(d / "other.db", "CREATE TABLE foo (a)"),
        "text_score": _edit(_good(d / "text.db"), "UPDATE results SET value = 'abc'"),
        "text_time": _edit(_good(d / "time.db"), "UPDATE results SET time = 'yesterday'"),
        "infinite_score": _edit(_good(d / "inf.db"), "UPDATE results SET value = 9e999"),
        "text_count": _edit(_good(d / "n.db"), "UPDATE results SET n = 'ten'"),
        "garbage": d / "garbage.db", "header_then_garbage": d / "header_then_garbage.db", "empty": d / "empty.db",
        "directory": d / "a_dir.db",
    }


# (case id, the store, the --out path relative to tmp_path, a fragment of the one line)
DASHBOARD = [
    ("out_is_a_directory", "good", ".", "--out {tmp}: is a directory; give a file's path"),
    ("out_is_empty", "good", "", "--out : is empty; give a file's path"),
    ("out_under_a_file", "good", "good.db/x.html", "cannot be created: {tmp}/good.db is a file, not a directory"),
    ("out_checked_before_the_store", "garbage", ".", "is a directory"),
    ("store_garbage", "garbage", "o.html", "results store {tmp}/garbage.db: exists but is not an SQLite database"),
    ("store_header_then_garbage", "header_then_garbage", "o.html",
     "header_then_garbage.db: is not a readable SQLite database (file is not a database)"),
    ("store_empty", "empty", "o.html", "results store {tmp}/empty.db: is empty (no results recorded)"),
    ("store_foreign_schema", "foreign_schema", "o.html", "foreign.db: has a results table without the column(s) id, "
                                                         "run_id"),
    ("store_other_tables", "other_tables", "o.html", "other.db: has no results table (tables: foo)"),
    ("store_is_a_directory", "directory", "o.html", "a_dir.db: is a directory"),
]
# a row whose numbers are not numbers is skipped and counted (it used to refuse the whole store)
SKIPPED = [("text_score", "row id 1 ('accuracy.gsm8k'): value='abc' is not a finite number or NULL"),
           ("text_time", "row id 1 ('accuracy.gsm8k'): time='yesterday' must be seconds since the epoch"),
           ("infinite_score", "row id 1 ('accuracy.gsm8k'): value=inf is not a finite number or NULL"),
           ("text_count", "row id 1 ('accuracy.gsm8k'): n='ten' is not an integer or NULL")]


@pytest.mark.parametrize("store, out, fragment", [c[1:] for c in DASHBOARD], ids=[c[0] for c in DASHBOARD])
def test_dashboard_bad_store_or_output_is_one_line(tmp_path, capsys, store, out, fragment):
    stores = _stores(tmp_path)
    out_path = str(tmp_path / out) if out not in ("", ".") else ("" if out == "" else str(tmp_path))
    assert dashboard(["--results", str(stores[store]), "--out", out_path]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert fragment.format(tmp=tmp_path) in captured.err
    assert not (tmp_path / "o.html").exists()  # nothing written


@pytest.mark.parametrize("store, fragment", SKIPPED, ids=[c[0] for c in SKIPPED])
def test_dashboard_skips_and_counts_a_row_that_holds_no_numbers(tmp_path, capsys, store, fragment):
    stores = _stores(tmp_path)
    assert dashboard(["--results", str(stores[store]), "--out", str(tmp_path / "o.html")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "(1 row(s) skipped that hold no usable numbers; first: " + fragment in out
    page = (tmp_path / "o.html").read_text()
    assert "<b>1</b>rows skipped" in page and "<b>0</b>results recorded" in page   # the one row is not counted


def test_dashboard_takes_no_prefix_of_an_option(tmp_path, capsys):
    """``--res`` used to be read as ``--results``."""
    with pytest.raises(SystemExit) as exc:
        dashboard(["--res", str(_good(tmp_path / "s.db")), "--out", str(tmp_path / "o.html")])
    assert exc.value.code == 2 and "unrecognized arguments: --res" in capsys.readouterr().err


# record() with values that are not numbers: a ValueError naming the field (a silent int(1.5) or a bare
# "could not convert" before)
RECORDS = [("value_text", {"value": "abc"}, "record('m'): value='abc' must be a number or None, not str"),
           ("value_bool", {"value": True}, "value=True must be a number or None, not bool"),
           ("value_nan", {"value": float("nan")}, "value=nan must be a finite number"),
           ("value_inf", {"value": float("inf")}, "value=inf must be a finite number"),
           ("threshold_text", {"value": 1.0, "threshold": "70"}, "threshold='70' must be a number or None"),
           ("n_float", {"value": 1.0, "n": 1.5}, "n=1.5 must be an integer"),
           ("n_text", {"value": 1.0, "n": "3"}, "n='3' must be an integer")]


@pytest.mark.parametrize("kwargs, fragment", [c[1:] for c in RECORDS], ids=[c[0] for c in RECORDS])
def test_record_refuses_a_non_numeric_score_naming_the_field(tmp_path, kwargs, fragment):
    with ResultsStore(tmp_path / "s.db") as store:
        with pytest.raises(ValueError) as exc:
            store.record("m", **kwargs)
        assert fragment in str(exc.value)
        assert store.query() == []


# pytest start-up: a store it cannot write is a usage error before any test runs
STARTUP = [("foreign_schema", "foreign_schema", "has a results table without the column(s) id, run_id"),
           ("header_then_garbage", "header_then_garbage", "is not a readable SQLite database")]


@pytest.mark.parametrize("store, fragment", [c[1:] for c in STARTUP], ids=[c[0] for c in STARTUP])
def test_pytest_refuses_a_store_it_cannot_use(pytester, store, fragment):
    pytester.makepyfile("def test_ok():\n    pass\n")
    path = _stores(pytester.path)[store]
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", f"--kvcm-results={path}")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"--kvcm-results={path}: {fragment}" in text and "1 passed" not in text


def _as_user(*args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "HOME": str(cwd)}
    return subprocess.run([*unprivileged_prefix(), sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def readonly():
    """A world-writable directory with a read-only store, a read-only HTML file and a read-only subdirectory."""
    prefix = unprivileged_prefix()  # skips first where no unprivileged user can be had
    d = Path(shared_tmp("kvcm-readonly-"))
    _good(d / "ro.db").chmod(0o444)
    (d / "ro.html").write_text("old")
    (d / "ro.html").chmod(0o444)
    (d / "locked").mkdir()
    _good(d / "locked" / "s.db").chmod(0o666)
    (d / "locked").chmod(0o555)
    (d / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (d / "good.db").write_bytes((d / "ro.db").read_bytes())
    (d / "good.db").chmod(0o644)
    yield d, prefix
    (d / "locked").chmod(0o755)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("store, fragment", [("ro.db", "ro.db: cannot be opened for writing (Permission denied)"),
                                             ("locked/s.db", "is not writable (SQLite keeps its WAL file there")],
                         ids=["read_only_file", "read_only_directory"])
def test_pytest_refuses_a_store_it_cannot_write(readonly, store, fragment):
    d, _ = readonly
    proc = _as_user("-m", "pytest", "-p", "pytest_kvcm.plugin", "-p", "no:cacheprovider", "-p", "no:randomly",
                    "-q", "test_ok.py", f"--kvcm-results={d / store}", cwd=d)
    text = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, text
    assert fragment in text and "1 passed" not in text and "Traceback" not in text


def test_dashboard_refuses_a_read_only_output_before_reading(readonly):
    d, _ = readonly
    proc = _as_user("-m", "pytest_kvcm.cli", "dashboard", "--results", str(d / "good.db"), "--out", str(d / "ro.html"),
                    cwd=d)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"pytest-kvcm dashboard: --out {d / 'ro.html'}: cannot be written (Permission denied)\n"
