"""What a ``generate`` did with each layer group's pages: the most held at once and the stale ones given back.

A sliding-window group is where V2 differs from V1: V2 releases a request's pages as they fall out of the
window (``LayerGroup.stale_range``) while V1 keeps them to the end. The two figures here make that visible in
a real run, and are what the Gemma 3 gates read: ``released_stale`` > 0 only on V2's sliding group, and
``peak_held`` there bounded by the window's pages per request.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupUsage:
    index: int
    name: str
    window: int | None
    num_blocks: int                 # the pool's pages
    peak_held: int                  # most pages requests held at once since the last reset
    released_stale: int             # pages released because they left the window (V2's sliding groups only)

    def __str__(self) -> str:
        return (f"group {self.index} {self.name}: peak {self.peak_held:,} of {self.num_blocks:,} pages held, "
                f"{self.released_stale:,} released as they left the window")


def _held(pool) -> int:
    return pool.num_used - pool.num_reusable


def reset(manager) -> None:
    """Start counting afresh: peaks from what is held now (the engine's own pad pages), no releases."""
    for pool in manager.pools:
        pool.peak_held = _held(pool)
    if hasattr(manager, "stale_released"):
        manager.stale_released = [0] * len(manager.pools)


def usage(manager) -> list[GroupUsage]:
    """Per layer group, in the manager's (first-seen) order."""
    released = getattr(manager, "stale_released", None) or [0] * len(manager.pools)
    return [GroupUsage(g.index, g.name, g.window, pool.num_blocks, max(pool.peak_held, _held(pool)), released[i])
            for i, (g, pool) in enumerate(zip(manager.layer_groups, manager.pools))]
