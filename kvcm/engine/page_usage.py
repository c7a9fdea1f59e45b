"""What a ``generate`` did with each layer group's pages: the most held at once and the stale ones given back.

A sliding-window or chunked-local group is where V2 differs from V1: V2 releases a request's pages as they fall
out of the window or the query's chunk (``LayerGroup.stale_range``) while V1 keeps them to the end. The two
figures here make that visible in a real run, and are what the Gemma 3 and Llama 4 gates read:
``released_stale`` > 0 only on V2's bounded groups, and ``peak_held`` there bounded by the window's (or the
chunk's) pages per request.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..protocols import StepManager


@dataclass(frozen=True)
class GroupUsage:
    index: int
    name: str
    window: int | None
    num_blocks: int                 # the pool's pages
    peak_held: int                  # most pages requests held at once since the last reset
    released_stale: int             # pages released as they left the window or chunk (V2's bounded groups only)

    def __str__(self) -> str:
        return (f"group {self.index} {self.name}: peak {self.peak_held:,} of {self.num_blocks:,} pages held, "
                f"{self.released_stale:,} released as they left the window or chunk")


def reset(manager: StepManager) -> None:
    """Start counting afresh (the manager resets its own figures)."""
    manager.reset_page_usage()


def usage(manager: StepManager) -> list[GroupUsage]:
    """Per layer group, in the manager's (first-seen) order."""
    return [GroupUsage(g.index, g.name, g.window, pool.num_blocks, max(pool.peak_held, pool.num_held),
                       manager.stale_released[i])
            for i, (g, pool) in enumerate(zip(manager.layer_groups, manager.pools))]
