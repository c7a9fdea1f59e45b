"""Token <-> block arithmetic and byte sizes in words, shared by the managers, the planner and the engine."""

from __future__ import annotations

GiB = 2**30
"""Bytes in a gibibyte: ``kvcm plan`` takes memory in GiB, as TensorRT-LLM's and vLLM's options state it."""


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers: the blocks of ``b`` tokens that ``a`` tokens occupy."""
    return -(-a // b)


def human_bytes(n: int | float) -> str:
    """Bytes in binary units, one decimal: ``72.0 GiB``, ``3.5 MiB``, ``823.0 KiB``, ``512 B``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
