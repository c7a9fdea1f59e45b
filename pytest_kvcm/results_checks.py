"""What the results store accepts: a usable file (``store_problem``) and well-typed columns, checked before
SQLite sees them, so a bad file or value is one line naming it, not a trace from ``sqlite3`` and never a row
that every later reader (the dashboard) has to refuse.
"""

from __future__ import annotations

import math
import numbers
import os
import sqlite3
import stat
import tempfile
from pathlib import Path

BUSY_TIMEOUT_S = 30.0
SQLITE_HEADER = b"SQLite format 3\x00"
# a row's columns besides its id (results.py's SCHEMA)
COLUMNS = ("run_id", "time", "git_commit", "lane", "machine", "test_id", "model", "kvcm_version", "metric",
           "value", "threshold", "n", "passed", "extra")


class StoreError(ValueError):
    """A results store that cannot be used, or a bad argument to one: one line naming the path or the field."""


def store_problem(path: Path, *, write: bool) -> str | None:
    """What makes ``path`` unusable as a results store (to read, or to write when ``write``), or None.

    Checked when a run or the dashboard starts, before any work: a directory, a FIFO or device (opening one to
    read waits for a writer for ever), a symbolic link that loops or leads nowhere, a file that is not SQLite or
    is corrupt, one whose ``results`` table lacks this schema's columns, a read-only file (permissions, a
    read-only file system, ``chattr +i``) or a directory where SQLite cannot create its WAL file. A missing file
    is fine to write when its directory can hold a new file (``/proc`` cannot; it is created on first record),
    not to read.
    """
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: said below
        st = None
    except OSError as e:  # a symlink loop, a name too long
        return f"cannot be used ({e.strerror or e})"
    if st is None:
        if path.is_symlink():
            return "is a symbolic link to a missing file; give the store's own path"
        if not write:
            return "does not exist"
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and (not parent.is_dir() or not os.access(parent, os.W_OK)):
            return f"cannot be created ({parent} is not a writable directory)"
        try:
            with tempfile.TemporaryFile(dir=parent):
                pass
        except OSError as e:
            return f"cannot be created ({parent} cannot hold a new file: {e.strerror or e})"
        return None
    if stat.S_ISDIR(st.st_mode):
        return "is a directory; give the SQLite file's path"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, device or socket); give the SQLite file's path"
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


# seconds since the epoch a row may carry: from 1970 to the end of year 9999, what time.gmtime can show
MAX_TIME = 253402300799.0


def check_time(value, field: str) -> float:
    """A row's time as a float in [0, MAX_TIME]; a ``StoreError`` naming ``field`` otherwise."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise StoreError(f"{field}={value!r:.40} must be seconds since the epoch (a number), not {type(value).__name__}")
    number = float(value)
    if not 0 <= number <= MAX_TIME:  # nan fails both
        raise StoreError(f"{field}={value!r:.40} must be seconds since the epoch in [0, {MAX_TIME:.0f}] (1970-9999)")
    return number


def _check_query(*, passed, limit, **strings) -> None:
    for name, val in strings.items():
        if val is not None and not isinstance(val, str):
            raise StoreError(f"query({name}={val!r:.40}): must be a string or None")
    if passed is not None and (isinstance(passed, (str, bytes)) or passed not in (True, False)):
        raise StoreError(f"query(passed={passed!r:.40}): must be True, False or None")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 0):
        raise StoreError(f"query(limit={limit!r:.40}): must be an integer >= 0 or None")


def _count(n, metric: str) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"record({metric!r}): n={n!r} must be an integer (the sample count) or None")
    return int(n)
