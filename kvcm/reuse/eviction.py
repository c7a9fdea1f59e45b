"""Which cached page goes when a pool runs out: lowest retention priority first, least recently released first
within a priority, only pages no request holds, and (where the group says so) only leaves.

TensorRT-LLM's ``LRUEvictionPolicy`` keeps one FIFO per priority and only leaf blocks in them. Here one heap per
layer group orders ``(priority, release stamp)``; an entry is checked when it reaches the top (the page must
still be cached, released at that stamp, a leaf where the group needs leaves, and free of references:
the policy's ``may_evict``), so claiming a page costs nothing and a claim undone restores its place exactly. A page
that becomes a leaf later (its last child evicted) enters with the stamp of its own release.
"""

from __future__ import annotations

import heapq

from ..policy import resolve


class EvictionQueue:
    def __init__(self, group: int, leaf_only: bool, policy=None):
        self.group = group
        self._may_evict = resolve(policy).may_evict
        self.leaf_only = leaf_only
        self._heap: list = []
        self._serial = 0

    def __len__(self):
        return len(self._heap)

    def next_stamp(self) -> int:
        self._serial += 1
        return self._serial

    def push(self, node) -> None:
        """Offer a cached page nobody holds (if the group evicts leaves only, once it is a leaf)."""
        g = self.group
        if self.leaf_only and node.child_pages[g]:
            return
        # ties go by creation order: an id can be a dead node's, and two equal entries would compare nodes
        heapq.heappush(self._heap, (node.priority, node.stamps[g], node.serial, node))

    def _valid(self, entry) -> bool:
        priority, stamp, _, node = entry
        g = self.group
        return (node.pages[g] >= 0 and node.stamps[g] == stamp and node.priority == priority
                and not (self.leaf_only and node.child_pages[g]))

    def pop_victim(self):
        """The next page to evict, or None when no cached page can go."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            if self._valid(entry) and self._may_evict(entry[3].refs[self.group]):
                return entry[3]
        return None

    def compact(self, live: int) -> None:
        """Once the entries outnumber the ``live`` pages (reusable ones) by far, keep one entry per page that can
        still be chosen. Claims leave their entries, and a claim undone (a partial copy's source, once per
        few-shot admission) adds a second one with the same stamp: both valid, so without keeping one the heap
        would stay above the mark and every release would scan it again."""
        if len(self._heap) > 2 * live + 64:
            g, seen, kept = self.group, set(), []
            for e in self._heap:
                node = e[3]
                if id(node) not in seen and node.refs[g] == 0 and self._valid(e):
                    seen.add(id(node))
                    kept.append(e)
            heapq.heapify(kept)
            self._heap = kept
