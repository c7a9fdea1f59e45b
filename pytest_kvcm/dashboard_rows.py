"""The rows a dashboard draws: read from a results store read-only, each checked, a bad one skipped and counted.

A store holds rows other tools (or older versions, or a hand-edited file) wrote: a time of ``1e20`` or
``'yesterday'``, a text score, an infinite threshold, an ``extra`` that is not a JSON object. Each such row is
left out of the page with its reason, and the page and the command's last line say how many were left out, so
one bad row no longer costs the whole dashboard (it used to refuse the store, or end in a traceback).
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from .results_checks import COLUMNS, StoreError, check_time, store_problem

# (column, accepted types, what the message says is accepted)
_NUMBERS = (("value", (int, float, type(None)), "a finite number or NULL"),
            ("threshold", (int, float, type(None)), "a finite number or NULL"),
            ("n", (int, type(None)), "an integer or NULL"),
            ("passed", (int, type(None)), "0, 1 or NULL"))


def load_rows(store_path: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """``(rows, skipped)``: the usable rows, oldest first, and one reason per row left out. Read-only
    (rendering never creates or changes a store); a store that cannot be read at all is a ``StoreError``."""
    path = Path(store_path)
    problem = store_problem(path, write=False)
    if problem:
        raise StoreError(f"results store {path}: {problem}")
    try:
        raw = _read(path)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"results store {path}: cannot be read ({e})") from None
    rows, skipped = [], []
    for r in raw:
        reason = row_problem(r)
        if reason:
            skipped.append(f"row id {r['id']} ({str(r['metric'])[:40]!r}): {reason}")
        else:
            rows.append(_normalized(r))
    rows.sort(key=lambda r: (r["time"], r["id"]))
    return rows, skipped


def row_problem(r: dict[str, Any]) -> str | None:
    """Why a row cannot be drawn, or None."""
    try:
        check_time(r["time"], "time")
    except StoreError as e:
        return str(e)
    for col, kinds, accepted in _NUMBERS:
        v = r[col]
        if not isinstance(v, kinds) or isinstance(v, float) and not math.isfinite(v) \
                or col == "passed" and v not in (0, 1, None):
            return f"{col}={v!r:.40} is not {accepted}"
    return None


def _read(path: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        cur = con.execute(f"SELECT id, {', '.join(COLUMNS)} FROM results ORDER BY id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()


def _normalized(r: dict[str, Any]) -> dict[str, Any]:
    """Text columns as text, ``extra`` a dict (anything else kept under ``unparsed``), ``passed`` a bool."""
    for col in ("run_id", "git_commit", "lane", "machine", "test_id", "model", "kvcm_version", "metric"):
        if r[col] is not None and not isinstance(r[col], str):
            r[col] = str(r[col])
    r["metric"] = r["metric"] or ""
    try:
        extra = json.loads(r["extra"]) if r["extra"] else {}
    except (ValueError, TypeError, RecursionError):
        extra = {"unparsed": r["extra"]}
    r["extra"] = extra if isinstance(extra, dict) else {"unparsed": extra}
    r["passed"] = None if r["passed"] is None else bool(r["passed"])
    r["time"] = float(r["time"])
    return r
