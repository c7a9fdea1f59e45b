"""Files the plugin's commands write: checked before the work that produces them, never an input, never a file
the command did not write itself, and never left half-written.

``kvcm dashboard --out`` and ``kvcm sensitivity --json`` write their file at the end: the dashboard after reading
the whole store, sensitivity after hours of runs. A path that is a directory, under a file, in a directory that
does not exist, or not writable is reported first, in one line, with nothing created. So is a path that names
one of the command's inputs (``--out`` equal to ``--results`` once replaced the results store with HTML) or an
existing file the command did not write (``ours`` tells its own output apart): a typo must not cost a user a file.
The text is written to a temporary file beside the target and renamed over it, so a full disk or a killed
process leaves the old file, never half of the new one.

The same rule holds for the shell scripts that delete directories (``ci/owned_dir.sh``): a directory is removed
only when the script stamped it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable


def output_problem(given: str | Path, *, inputs: Iterable[str | Path] = (),
                   ours: Callable[[Path], bool] | None = None) -> str | None:
    """Why ``given`` cannot be written (created or replaced), or None when it can.

    ``inputs`` are the paths the command reads (the same file under another name counts); ``ours``, when given,
    says whether an existing file is one this command wrote (it may be replaced; any other file is refused).
    """
    if str(given).strip() == "":
        return "is empty; give a file's path"
    path = Path(given)
    for source in inputs:
        if _same_file(path, Path(source)):
            return f"is the input {source}; writing it would destroy it (give another path)"
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: said below
        st = None
    except OSError as e:  # a symlink loop, a name too long
        return f"cannot be used ({e.strerror or e})"
    if st is None and path.is_symlink():
        return "is a symbolic link to a missing file; give the file's own path"
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return "is a directory; give a file's path"
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file (a FIFO, device or socket); give a file's path"
        try:
            with open(path, "r+b"):
                pass
        except OSError as e:
            return f"cannot be written ({e.strerror or e})"
        if ours is not None and st.st_size and not _is_ours(path, ours):
            return "exists and was not written by this command; it is never replaced (remove it or give another path)"
    parent = path.parent
    if not parent.exists():
        above = next((p for p in parent.parents if p.exists()), Path("."))
        if not above.is_dir():
            return f"cannot be created: {above} is a file, not a directory"
        return f"cannot be created: the directory {parent} does not exist (create it first)"
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not a writable directory"
    return None


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path`` (an ``OSError`` leaves the
    old file, or none, and no temporary file behind). A symbolic link is replaced by the file, not followed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing: compare the names they resolve to
        try:
            return a.resolve() == b.resolve()
        except (OSError, RuntimeError):
            return False


def _is_ours(path: Path, ours: Callable[[Path], bool]) -> bool:
    try:
        return bool(ours(path))
    except (OSError, ValueError):
        return False
