"""Argument checks at the manager API boundary: every bad value becomes a ``ConfigError`` before any state moves.

A manager operation either completes or raises with the manager exactly as it was; checking every argument
first is what makes the "nothing changed" half cheap. The checks here run on the per-step hot paths
(``begin_generation``, ``resize``), so the common case (a plain ``int`` in range) is one type test and one
comparison; only a value that fails it pays for the slower explanation.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Iterable

from .errors import ConfigError


def _as_int(field: str, value) -> int:
    """An integer-like value (``int``, numpy/torch integer scalars) as ``int``; bools, floats and strings are not."""
    if isinstance(value, bool):
        raise ConfigError(field, value, "must be an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(field, value, f"must be an integer, not {type(value).__name__}") from None


def count(field: str, value, low: int = 0, high: int | None = None, why: str = "") -> int:
    """``value`` as an int in ``[low, high]``; ``why`` names where ``high`` comes from (e.g. ``max_seq_len``)."""
    if type(value) is not int:
        value = _as_int(field, value)
    if value < low or (high is not None and value > high):
        if high is None:
            raise ConfigError(field, value, f"must be >= {low}")
        raise ConfigError(field, value, f"must be in [{low}, {high}]" + (f" ({why})" if why else ""))
    return value


def optional_count(field: str, value, low: int = 0, high: int | None = None, why: str = "") -> int | None:
    return None if value is None else count(field, value, low, high, why)


def finite(field: str, value, low: float | None = None, high: float | None = None, *, open_low: bool = False,
           open_high: bool = False) -> float:
    """A finite real number in the given (optionally open) bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ConfigError(field, value, f"must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(field, value, "must be a finite number")
    below = low is not None and (number <= low if open_low else number < low)
    above = high is not None and (number >= high if open_high else number > high)
    if below or above:
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ConfigError(field, value, f"must be in {'(' if open_low else '['}{lo}, {hi}{')' if open_high else ']'}")
    return number


def flag(field: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, value, f"must be True or False, not {type(value).__name__}")
    return value


def request_id(value):
    """A request id is any hashable value (ints and strings in practice)."""
    if not isinstance(value, Hashable):
        raise ConfigError("request_id", value, f"must be hashable, not {type(value).__name__}")
    try:
        hash(value)
    except TypeError:
        raise ConfigError("request_id", value, "must be hashable") from None
    return value


def request_id_list(field: str, values) -> list:
    """A list of distinct request ids. A string is one id, not a list of one-character ids."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(field, values, "must be a list of request ids (a string is not a list)")
    out = [request_id(v) for v in values]
    if len(set(out)) != len(out):
        seen: set = set()
        dup = next(v for v in out if v in seen or seen.add(v))
        raise ConfigError(field, dup, "must be distinct; this id appears twice")
    return out
