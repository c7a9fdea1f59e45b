"""Progress of a long step inside a test, shown on the terminal while pytest captures the test's output.

A model gate runs for minutes; with output captured the log would sit on ``test_model_gates.py`` with no sign
of life. The ``kvcm_progress`` fixture returns a factory of tqdm bars that write past the capture (through
pytest's capture manager, the way ``capsys.disabled()`` does). On a terminal the bar redraws in place; in a
CI log (not a terminal) it writes a plain line at most every 30 seconds. Under xdist workers, whose output
never reaches the terminal, and without tqdm, the bars do nothing.
"""

from __future__ import annotations

import os
import sys

import pytest


class _TerminalFile:
    """A file that writes to the real stderr, suspending pytest's capture for each write."""

    def __init__(self, config: pytest.Config):
        self._capman = config.pluginmanager.getplugin("capturemanager")

    def write(self, text: str) -> int:
        if self._capman is None:
            return sys.__stderr__.write(text)
        with self._capman.global_and_fixture_disabled():
            n = sys.stderr.write(text)
            sys.stderr.flush()
        return n

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return sys.__stderr__ is not None and sys.__stderr__.isatty()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def terminal_progress(config: pytest.Config, *, total: int, desc: str, unit: str = "it"):
    """A tqdm bar on the terminal past pytest's capture (a no-op bar where nobody would see it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety, never a requirement
        return _NoBar()
    out = _TerminalFile(config)
    tty = out.isatty()
    out.write("\n")  # start below pytest's progress dots
    return tqdm(total=total, desc=desc, unit=unit, file=out, leave=True, mininterval=0.5 if tty else 30.0,
                ascii=not tty, dynamic_ncols=tty, ncols=None if tty else 100)


@pytest.fixture
def kvcm_progress(pytestconfig: pytest.Config):
    """``kvcm_progress(total=N, desc="...", unit="q")``: a tqdm bar seen on the terminal despite capture."""
    bars = []

    def make(*, total: int, desc: str, unit: str = "it"):
        bar = terminal_progress(pytestconfig, total=total, desc=desc, unit=unit)
        bars.append(bar)
        return bar

    yield make
    for bar in bars:
        bar.close()
