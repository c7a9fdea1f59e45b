"""V2's host level, ``host_eviction_policy="lru"`` (the default): TensorRT-LLM KVCacheManagerV2's
``PrioritizedLRUEvictionPolicy`` (``_eviction_controller``): the lowest retention priority first, the page that
arrived first within a priority. A hit does not move a page (a hit migrates it back to the GPU level).

One heap of ``(priority, arrival)`` with lazy deletion: an entry is live while ``_key`` still maps its block to it.
"""

from __future__ import annotations

import heapq
import itertools


class PrioritizedLRU:
    """The order of one group's host pages; entries are the blocks (tree nodes) resident there."""

    lazy = False

    def __init__(self, capacity: int, policy=None):
        self.capacity = capacity
        self._key: dict = {}               # block -> (priority, arrival): its place
        self._heap: list = []
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return len(self._key)

    def release(self, node, priority: int) -> None:
        """A block arrived (fell from the GPU level): the newest of its priority."""
        key = (priority, next(self._arrivals))
        self._key[node] = key
        heapq.heappush(self._heap, (*key, node.serial, node))

    def claim(self, node) -> None:
        """A claimed host page stays where it is; the level passes it as ``protected`` while it is migrated."""

    def restore(self, node) -> None:
        """Nothing moved on a claim."""

    def remove(self, node) -> None:
        self._key.pop(node, None)

    def touch(self, node) -> None:
        """A hit migrates the block back up; its place here is its arrival's."""

    def reprioritize(self, node, priority: int) -> None:
        if node in self._key:
            key = (priority, self._key[node][1])
            self._key[node] = key
            heapq.heappush(self._heap, (*key, node.serial, node))

    def victim(self, protected=()):
        """The block the order puts first that is not ``protected`` (a page a match is migrating: its entry is set
        aside and put back), taken out of the order; None when every block is protected or none is there."""
        heap, keys, skipped = self._heap, self._key, []
        found = None
        while heap:
            entry = heapq.heappop(heap)
            node = entry[3]
            if keys.get(node) != entry[:2]:
                continue
            if node in protected:
                skipped.append(entry)
                continue
            del keys[node]
            found = node
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def clear(self) -> None:
        self._key.clear()
        self._heap.clear()

    def order(self) -> list:
        return sorted(self._key, key=self._key.get)


HOST_LEVEL = PrioritizedLRU
