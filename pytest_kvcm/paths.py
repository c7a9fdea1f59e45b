"""Whether a file the plugin's commands will write can be written, found before the work that produces it.

``kvcm dashboard --out`` and ``kvcm sensitivity --json`` write their file at the end: the dashboard after reading
the whole store, sensitivity after hours of runs. A path that is a directory, under a file, or not writable is
reported first, in one line, with nothing created.
"""

from __future__ import annotations

import os
from pathlib import Path


def output_problem(given: str | Path) -> str | None:
    """Why ``given`` cannot be written (created or replaced), or None when it can."""
    if str(given).strip() == "":
        return "is empty; give a file's path"
    path = Path(given)
    if path.is_dir():
        return "is a directory; give a file's path"
    if path.exists():
        try:
            with open(path, "r+b"):
                pass
        except OSError as e:
            return f"cannot be written ({e.strerror or e})"
        return None
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not a writable directory"
    return None
