"""The clock V1's retention durations run on, and the one place a user's clock is read.

TensorRT-LLM measures a duration on ``LRUEvictionPolicy::getTime`` (steady_clock), which its tests mock; kvcm takes
the mock as ``set_clock(clock_ms)``. That callable is the user's code, so it may raise, take an argument, return a
string or NaN, or run backwards. Met in the middle of a release, each of these used to leave the manager
half-changed: the request gone, its blocks in use with no owner.

So a user's clock is checked where it is handed in (called once: a finite number of milliseconds, not below the
last reading), and a manager call that may start or check a timer reads it once, before that call changes anything
(``reads_clock``): every timer of the call uses that one reading, and a clock that fails fails the call before its
first change, as a ``UserCallbackError`` naming ``clock_ms``. Every reading is checked again (a number, finite,
never below the last), since a clock that passed once can still go wrong later.

kvcm's own clock (``monotonic_ms``, the default) cannot fail, and is read where a timer needs it, as upstream does.
"""

from __future__ import annotations

import functools
import math
import numbers
import time

from .errors import ConfigError, UserCallbackError

FIELD = "clock_ms"


def monotonic_ms() -> float:
    """The clock retention durations are measured on (``LRUEvictionPolicy::getTime``: steady_clock)."""
    return time.monotonic() * 1000.0


def _problem(value, last: float) -> str | None:
    """What is wrong with one reading, or None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return f"returned {value!r} ({type(value).__name__}): a clock must return a finite number of milliseconds"
    if value < last:
        return f"returned {value!r}, below its last reading {last!r}: a clock must never run backwards"
    return None


class RetentionClock:
    """One manager's clock, shared by its pools (GPU and host): ``clock()`` is the time in milliseconds.

    ``user`` says a user's clock is set (``replace``); then a manager call reads it once up front (``pin``) and
    ``clock()`` answers that reading until the call ends (``unpin``)."""

    def __init__(self, read=monotonic_ms):
        self._read = read
        self.user = False
        self.last = -math.inf            # the highest reading so far: every later one must be at least this
        self._pinned = None              # this call's reading, while a call runs

    def __call__(self) -> float:
        return self._pinned if self._pinned is not None else self.read()

    def read(self) -> float:
        """One reading, checked; a failure is the user's clock's, named as such."""
        try:
            value = self._read()
        except Exception as exc:
            raise UserCallbackError(FIELD, f"raised {type(exc).__name__}: {exc}") from exc
        problem = _problem(value, self.last)
        if problem:
            raise UserCallbackError(FIELD, problem)
        self.last = value
        return value

    def replace(self, clock_ms) -> None:
        """``set_clock``: call the new clock once and take it only if that reading is a finite number at or above
        the last one (timers started on the old clock keep their expiry)."""
        if not callable(clock_ms):
            raise ConfigError(FIELD, clock_ms, "must be a callable returning milliseconds")
        try:
            value = clock_ms()
        except TypeError as exc:
            raise UserCallbackError(FIELD, f"raised TypeError: {exc} when called once at set_clock (a clock takes "
                                           f"no argument and returns milliseconds)") from exc
        except Exception as exc:
            raise UserCallbackError(FIELD, f"raised {type(exc).__name__}: {exc} when called once at set_clock") \
                from exc
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ConfigError(FIELD, value, f"must return a finite number of milliseconds, not "
                                            f"{type(value).__name__} {value!r}")
        if value < self.last:
            raise ConfigError(FIELD, value, f"is the new clock's first reading, below the last reading "
                                            f"{self.last!r}: timers started on the old clock would run that much "
                                            f"longer")
        self._read, self.user, self.last = clock_ms, True, value

    def pin(self) -> None:
        self._pinned = self.read()

    def unpin(self) -> None:
        self._pinned = None


def reads_clock(method):
    """Wrap a manager call that may start or check a retention timer: with a user's clock, read it once before the
    call runs (a failure raises before anything changes) and answer that reading for the whole call. A call made
    inside another (a failed context chunk freeing its request) keeps the outer call's reading."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        clock = self.retention_clock
        if clock is None or not clock.user or clock._pinned is not None:
            return method(self, *args, **kwargs)
        clock.pin()
        try:
            return method(self, *args, **kwargs)
        finally:
            clock.unpin()

    return call
