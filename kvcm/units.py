"""Token <-> block arithmetic shared by the managers, the planner and the engine."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers: the blocks of ``b`` tokens that ``a`` tokens occupy."""
    return -(-a // b)
