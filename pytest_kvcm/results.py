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
import os
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .results_checks import (BUSY_TIMEOUT_S, COLUMNS, MAX_TIME, SQLITE_HEADER, StoreError, _check_query, _count,  # noqa: F401
                             _number, check_time, store_problem)

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
from .options import RESULTS_PATH as DEFAULT_PATH  # noqa: E402  (declared with the option)


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
        problem = store_problem(self.path, write=True)
        if problem:
            raise StoreError(f"results store {self.path}: {problem}")
        self.path.parent.mkdir(parents=True, exist_ok=True)  # the default .kvcm/ is made on first use
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
        when = columns.pop("time", None)
        when = time.time() if when is None else check_time(when, f"record({metric!r}): time")
        if "run_id" in columns and not (isinstance(columns["run_id"], str) and columns["run_id"]):
            raise ValueError(f"record({metric!r}): run_id={columns['run_id']!r} must be a non-empty string; leave it "
                             f"out for this store's run id {self.run_id!r}")
        for col in ("git_commit", "lane", "machine"):
            if columns.get(col) is not None and not isinstance(columns[col], str):
                raise ValueError(f"record({metric!r}): {col}={columns[col]!r} must be a string or None")
        for col, val in (("test_id", test_id), ("model", model), ("kvcm_version", kvcm_version)):
            if val is not None and not isinstance(val, str):
                raise ValueError(f"record({metric!r}): {col}={val!r} must be a string or None")
        if passed is not None and (isinstance(passed, (str, bytes)) or passed not in (True, False)):
            raise ValueError(f"record({metric!r}): passed={passed!r} must be True, False or None")
        if extra is not None and not isinstance(extra, dict):
            raise ValueError(f"record({metric!r}): extra={extra!r:.60} must be a dict (a JSON object) or None")
        row = {**self.defaults, "time": when, **columns, "test_id": test_id, "model": model,
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
        _check_query(test_id=test_id, metric=metric, run_id=run_id, model=model, kvcm_version=kvcm_version,
                     passed=passed, metric_prefix=metric_prefix, limit=limit)
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
        try:
            with self._lock:
                cur = self._conn.execute(sql, args)
                names = [d[0] for d in cur.description]
                rows = [dict(zip(names, r)) for r in cur.fetchall()]
        except sqlite3.DatabaseError as e:  # the file was replaced or damaged since it was opened
            raise StoreError(f"results store {self.path}: cannot be read ({e})") from None
        for r in rows:
            try:
                r["extra"] = json.loads(r["extra"]) if r["extra"] else {}
            except (ValueError, TypeError):  # a row another tool wrote
                r["extra"] = {"unparsed": r["extra"]}
            r["passed"] = None if r["passed"] is None else bool(r["passed"])
        return rows

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
