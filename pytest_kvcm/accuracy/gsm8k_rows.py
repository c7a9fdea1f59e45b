"""GSM8K rows read from a JSON Lines (or JSON array) file, every row checked, for the plugin and the benchmarks.

The plugin checks ``--kvcm-gsm8k`` at start-up with it, and the benchmarks read their prompts through it: a
file that is not UTF-8, a line that is not JSON, a row without string ``question`` and ``answer`` fields or a
file with no rows is a ``GSM8KFileError`` naming the file and line (the benchmarks used to end in a ``KeyError``
or ``JSONDecodeError`` trace, or, for a directory of the wrong files, fall back to built-in prompts silently).
"""

from __future__ import annotations

import json
from pathlib import Path


class GSM8KFileError(ValueError):
    """A GSM8K file that cannot be used: one line with the file (and line) and what is wrong."""


def gsm8k_rows(path: str | Path) -> list[dict]:
    """The rows of ``path`` (JSON Lines, or one JSON array), each a dict with string ``question`` and ``answer``."""
    return [row for _, row in numbered_rows(Path(path))]


def numbered_rows(path: Path) -> list[tuple[int, dict]]:
    """``(line, row)`` pairs of ``path``; ``GSM8KFileError`` for the first problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise GSM8KFileError(f"{path}:{line}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise GSM8KFileError(f"{path}: cannot read ({e.strerror or e})") from None
    try:  # a .json file may hold one array of rows
        whole = json.loads(text)
        rows = [(1, r) for r in whole] if isinstance(whole, list) else None
    except (json.JSONDecodeError, RecursionError):
        rows = None
    if rows is None:
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise GSM8KFileError(f"{path}:{n}: not a JSON object ({e.msg})") from None
            except RecursionError:
                raise GSM8KFileError(f"{path}:{n}: not a JSON object (nested too deeply)") from None
    if not rows:
        raise GSM8KFileError(f"{path} holds no rows")
    for n, row in rows:
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("question", "answer")):
            raise GSM8KFileError(f"{path}:{n}: a row needs string 'question' and 'answer' fields; got {str(row)[:80]}")
    return rows


def gsm8k_rows_or_exit(path: str | Path, source: str) -> list[dict]:
    """``gsm8k_rows`` for a command-line tool: a bad file ends the program with one line naming ``source`` (the
    option or variable that gave the path), not a trace."""
    try:
        return gsm8k_rows(path)
    except GSM8KFileError as e:
        raise SystemExit(f"{source}: {e}") from None
