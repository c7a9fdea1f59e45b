"""The results store: every gate, parity check and warmup report as one row of a SQLite table.

Why SQLite: one file, no server, readable from any language, and safe for several pytest-xdist workers at
once. Each row is written in its own short ``BEGIN IMMEDIATE`` transaction in WAL mode with a busy timeout,
so concurrent writers queue instead of failing, and a run that dies keeps every row committed before it.
Each record is also attached to the test's JUnit XML as a property, for CI systems that only read JUnit.

The manager version's column is ``kvcm_version``, the one name the project gives that concept (ARCHITECTURE.md),
and has been since the store's first schema: when ``version`` / ``manager_version`` were retired from the Python
API, existing result files kept working unchanged, with no migration and no mapping layer.

Options: ``--kvcm-results=PATH`` (ini ``kvcm_results``; default ``<rootdir>/.kvcm/results.sqlite``; ``none``
turns the file off, JUnit properties stay). Fixture: ``kvcm_results.record(metric=..., value=..., ...)``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

COLUMNS = ("run_id", "time", "git_commit", "lane", "machine", "test_id", "model", "kvcm_version", "metric",
           "value", "threshold", "n", "passed", "extra")
SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL,
    time         REAL NOT NULL,      -- seconds since the epoch (UTC)
    git_commit   TEXT,
    lane         TEXT,
    machine      TEXT,
    test_id      TEXT,
    model        TEXT,
    kvcm_version TEXT,               -- KV cache manager version: v1 / v2
    metric       TEXT NOT NULL,
    value        REAL,
    threshold    REAL,
    n            INTEGER,
    passed       INTEGER,            -- 1 / 0 / NULL (no verdict, e.g. measure mode)
    extra        TEXT                -- JSON object
);
CREATE INDEX IF NOT EXISTS results_by_test ON results (test_id, metric, time);
CREATE INDEX IF NOT EXISTS results_by_run ON results (run_id);
"""
BUSY_TIMEOUT_S = 30.0
from .options import RESULTS_PATH as DEFAULT_PATH  # noqa: E402  (declared with the option)
SQLITE_HEADER = b"SQLite format 3\x00"


def store_problem(path: Path, *, write: bool) -> str | None:
    """What makes ``path`` unusable as a results store (to read, or to write when ``write``), or None.

    Checked when a run or the dashboard starts, before any work: a directory, a file that is not SQLite or is
    corrupt, one whose ``results`` table lacks this schema's columns, a read-only file (permissions, a read-only
    file system, ``chattr +i``) or a directory where SQLite cannot create its WAL file. A missing file is fine to
    write (it is created on first record) but not to read.
    """
    if path.is_dir():
        return "is a directory; give the SQLite file's path"
    if not path.exists():
        if not write:
            return "does not exist"
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and (not parent.is_dir() or not os.access(parent, os.W_OK)):
            return f"cannot be created ({parent} is not a writable directory)"
        return None
    try:
        with open(path, "r+b" if write else "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        return f"cannot be opened{' for writing' if write else ''} ({e.strerror or e})"
    if not head:
        return None if write else "is empty (no results recorded)"
    if head != SQLITE_HEADER:
        return f"exists but is not an SQLite database (first bytes {head[:8]!r})"
    if write:
        try:
            with tempfile.TemporaryFile(dir=path.parent):
                pass
        except OSError as e:
            return f"its directory {path.parent} is not writable (SQLite keeps its WAL file there: {e.strerror or e})"
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            have = {r[1] for r in con.execute("PRAGMA table_info(results)")} if "results" in tables else None
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        return f"is not a readable SQLite database ({e})"
    if have is None and not write:
        return f"has no results table (tables: {', '.join(sorted(tables)) or 'none'})"
    missing = [c for c in ("id", *COLUMNS) if have is not None and c not in have]
    if missing:
        return (f"has a results table without the column(s) {', '.join(missing)}: not a kvcm results store "
                "(or one from another tool)")
    return None


def _number(field: str, value, metric: str) -> float | None:
    """A finite real number or None; anything else names the record's field."""
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real) and not hasattr(value, "__float__"):
        raise ValueError(f"record({metric!r}): {field}={value!r} must be a number or None, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"record({metric!r}): {field}={value!r} must be a finite number (None records no value)")
    return number


def _retry(fn, what: str, attempts: int = 50):
    """Run ``fn``, retrying the rare ``database is locked`` that the busy handler does not cover
    (a journal-mode switch racing another process's first connection)."""
    for i in range(attempts):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or i == attempts - 1:
                raise sqlite3.OperationalError(f"results store: {what}: {e}") from e
            time.sleep(0.02 * (i + 1))
    raise AssertionError("unreachable")


class ResultsStore:
    """One SQLite results file. Cheap to create; safe across processes and threads.

    ``defaults`` (run_id, git_commit, lane, machine) fill the columns a ``record`` call leaves out.
    """

    def __init__(self, path: str | os.PathLike, *, run_id: str | None = None, git_commit: str | None = None,
                 lane: str | None = None, machine: str | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.defaults = {"run_id": run_id or new_run_id(), "git_commit": git_commit, "lane": lane,
                         "machine": machine if machine is not None else socket.gethostname()}
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                     check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone(), "switching to WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a commit survives a killed process
        _retry(self._create_schema, "creating the schema")

    @property
    def run_id(self) -> str:
        return self.defaults["run_id"]

    def _create_schema(self) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in filter(str.strip, SCHEMA.split(";")):
                    self._conn.execute(stmt)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def record(self, metric: str, value: float | None, *, test_id: str | None = None, model: str | None = None,
               kvcm_version: str | None = None, threshold: float | None = None, n: int | None = None,
               passed: bool | None = None, extra: dict[str, Any] | None = None, **columns: Any) -> int:
        """Insert one row in its own transaction; returns its id. ``columns`` may override the defaults."""
        if not metric or not isinstance(metric, str):
            raise ValueError(f"record needs a metric name (a non-empty string): got {metric!r}")
        unknown = set(columns) - {"run_id", "git_commit", "lane", "machine", "time"}
        if unknown:
            raise TypeError(f"record got unknown column(s) {sorted(unknown)}; columns are {COLUMNS}")
        row = {**self.defaults, "time": time.time(), **columns, "test_id": test_id, "model": model,
               "kvcm_version": kvcm_version, "metric": metric,
               "value": _number("value", value, metric), "threshold": _number("threshold", threshold, metric),
               "n": _count(n, metric), "passed": None if passed is None else int(bool(passed)),
               "extra": json.dumps(extra or {}, sort_keys=True, default=str)}
        sql = f"INSERT INTO results ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"

        def insert() -> int:
            with self._lock:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    cur = self._conn.execute(sql, [row[c] for c in COLUMNS])
                    self._conn.execute("COMMIT")
                    return cur.lastrowid
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise

        return _retry(insert, f"recording {metric!r}")

    def query(self, *, test_id: str | None = None, metric: str | None = None, run_id: str | None = None,
              model: str | None = None, kvcm_version: str | None = None, passed: bool | None = None,
              metric_prefix: str | None = None, limit: int | None = None, newest_first: bool = False
              ) -> list[dict[str, Any]]:
        """Rows as dicts (``extra`` decoded, ``passed`` as bool/None), oldest first unless ``newest_first``."""
        where, args = [], []
        for col, val in (("test_id", test_id), ("metric", metric), ("run_id", run_id), ("model", model),
                         ("kvcm_version", kvcm_version)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if passed is not None:
            where.append("passed = ?")
            args.append(int(passed))
        if metric_prefix is not None:
            where.append("metric LIKE ? ESCAPE '\\'")
            args.append(metric_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        sql = "SELECT id, " + ", ".join(COLUMNS) + " FROM results"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY time {'DESC' if newest_first else 'ASC'}, id {'DESC' if newest_first else 'ASC'}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            cur = self._conn.execute(sql, args)
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r)) for r in cur.fetchall()]
        for r in rows:
            r["extra"] = json.loads(r["extra"]) if r["extra"] else {}
            r["passed"] = None if r["passed"] is None else bool(r["passed"])
        return rows

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _count(n, metric: str) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"record({metric!r}): n={n!r} must be an integer (the sample count) or None")
    return int(n)


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def git_commit(cwd: str | os.PathLike) -> str | None:
    if os.environ.get("KVCM_GIT_COMMIT"):
        return os.environ["KVCM_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# ----------------------------------------------------------------------------------------------- plugin
STORE_KEY = pytest.StashKey["ResultsStore | None"]()
RUN_ID_KEY = pytest.StashKey[str]()


def _run_id(config: pytest.Config) -> str:
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get("kvcm_run_id"):
        return workerinput["kvcm_run_id"]
    return os.environ.get("KVCM_RUN_ID") or new_run_id()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    check_results_option(config)
    config.stash[RUN_ID_KEY] = _run_id(config)
    config.stash[STORE_KEY] = None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller -> worker: all workers of one session share one run id."""
    node.workerinput["kvcm_run_id"] = node.config.stash[RUN_ID_KEY]


def results_path(config: pytest.Config) -> Path | None:
    raw = config.getoption("kvcm_results") or config.getini("kvcm_results") or DEFAULT_PATH
    if str(raw).lower() in ("none", "off", "-"):
        return None
    p = Path(os.path.expanduser(str(raw)))
    return p if p.is_absolute() else Path(config.rootpath) / p


def get_store(config: pytest.Config) -> ResultsStore | None:
    """The session's store, opened on first use (so runs that record nothing create no file)."""
    store = config.stash.get(STORE_KEY, None)
    if store is None:
        path = results_path(config)
        if path is None:
            return None
        lane = None
        try:
            lane = config.getoption("kvcm_lane")
        except ValueError:
            pass
        store = ResultsStore(path, run_id=config.stash[RUN_ID_KEY], git_commit=git_commit(config.rootpath),
                             lane=lane, machine=os.environ.get("KVCM_MACHINE") or socket.gethostname())
        config.stash[STORE_KEY] = store
    return store


def pytest_unconfigure(config: pytest.Config) -> None:
    store = config.stash.get(STORE_KEY, None)
    if store is not None:
        store.close()
        config.stash[STORE_KEY] = None


class Recorder:
    """What the ``kvcm_results`` fixture gives a test: ``record`` fills in the test id, stores the row and
    attaches it to the JUnit report."""

    def __init__(self, request: pytest.FixtureRequest):
        self._request = request
        self.records: list[dict[str, Any]] = []

    def record(self, metric: str, value: float | None, *, model: str | None = None,
               kvcm_version: str | None = None, threshold: float | None = None, n: int | None = None,
               passed: bool | None = None, extra: dict[str, Any] | None = None,
               test_id: str | None = None) -> int | None:
        node = self._request.node
        if kvcm_version is None and "kvcm_version" in self._request.fixturenames:
            try:
                kvcm_version = str(self._request.getfixturevalue("kvcm_version"))
            except pytest.FixtureLookupError:
                pass
        row = dict(metric=metric, value=value, model=model, kvcm_version=kvcm_version, threshold=threshold,
                   n=n, passed=passed, extra=extra or {}, test_id=test_id or node.nodeid)
        self.records.append(row)
        node.user_properties.append(
            (f"kvcm:{metric}", json.dumps({k: v for k, v in row.items() if k not in ("metric", "test_id")
                                           and v not in (None, {})}, sort_keys=True, default=str)))
        store = get_store(self._request.config)
        return store.record(**row) if store is not None else None


@pytest.fixture
def kvcm_results(request: pytest.FixtureRequest) -> Recorder:
    """Record a metric of this test: ``kvcm_results.record(metric="parity.first_diff", value=..., ...)``."""
    return Recorder(request)


def check_results_option(config: pytest.Config) -> None:
    """``--kvcm-results`` checked when pytest starts: a directory, a file that is not SQLite or holds another
    schema, a read-only file or a path that cannot be created is a usage error naming it (``store_problem``),
    not a trace from ``sqlite3`` at the first record."""
    path = results_path(config)
    if path is None:
        return
    problem = store_problem(path, write=True)
    if problem:
        raise pytest.UsageError(f"--kvcm-results={path}: {problem}")
