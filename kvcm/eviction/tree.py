"""V2's GPU-level order: which cached page goes when a pool runs out. Lowest retention priority first, least
recently released first within a priority, only pages no request holds, and (where the group says so) only leaves.

TensorRT-LLM's ``LRUEvictionPolicy`` keeps one FIFO per priority and only leaf blocks in them. Here one heap per
layer group orders ``(priority, release stamp)``; an entry is checked when it reaches the top (the page must
still be cached, released at that stamp, a leaf where the group needs leaves, and free of references:
the policy's ``may_evict``), so claiming a page costs nothing (the order is ``lazy``) and a claim undone restores
its place exactly. A page that becomes a leaf later (its last child evicted) enters with the stamp of its own
release. When no leaf can go but an unheld page with descendants can, that page is the victim (the policy's
``evict_with_descendants``; the cache takes its descendants with it): the one selection point of the tier.
"""

from __future__ import annotations

import heapq

from ..policy import resolve


class EvictionQueue:
    """The order of group ``group``'s cached pages (entries are the reuse tree's nodes); ``cached`` is the cache's
    page -> node map of the group, scanned only at the very edge of the pool (no leaf left to evict)."""

    lazy = True

    def __init__(self, group: int, pool, cached: dict, leaf_only: bool, policy=None):
        self.group = group
        self.pool = pool
        self.cached = cached
        self.leaf_only = leaf_only
        self.policy = resolve(policy)
        self._heap: list = []
        self._serial = 0

    def __len__(self):
        return len(self._heap)

    def release(self, node, priority: int | None = None) -> None:
        """Nobody holds the node's page now: stamped as the newest release and offered (if the group evicts
        leaves only, once it is a leaf). ``priority`` is the node's own."""
        g = self.group
        self._serial += 1
        node.stamps[g] = self._serial
        if not (self.leaf_only and node.child_pages[g]):
            # ties go by creation order: an id can be a dead node's, and two equal entries would compare nodes
            heapq.heappush(self._heap, (node.priority, self._serial, node.serial, node))
        # once the entries outnumber the reusable pages by far, keep one entry per page that can still be chosen.
        # Claims leave their entries, and a claim undone (a partial copy's source, once per few-shot admission)
        # adds a second one with the same stamp: both valid, so without keeping one the heap would stay above
        # the mark and every release would scan it again
        if len(self._heap) > 2 * self.pool.num_reusable + 64:
            seen, kept = set(), []
            for e in self._heap:
                n = e[3]
                if id(n) not in seen and n.refs[g] == 0 and self._valid(e):
                    seen.add(id(n))
                    kept.append(e)
            heapq.heapify(kept)
            self._heap = kept

    def restore(self, node) -> None:
        """Offered again at its own release stamp: a claim undone, or a page that has just become a leaf."""
        g = self.group
        if self.leaf_only and node.child_pages[g]:
            return
        heapq.heappush(self._heap, (node.priority, node.stamps[g], node.serial, node))

    def claim(self, node) -> None:
        """Nothing to do: a held page is skipped when it reaches the top."""

    def remove(self, node) -> None:
        """Nothing to do: a page that left the tree fails the check at the top."""

    def touch(self, node) -> None:
        """A hit claims the page; its place is its release's (TensorRT-LLM orders by release, not by use)."""

    def reprioritize(self, node, priority: int) -> None:
        """The node's priority is ``priority`` now: an entry at its stamp and the new priority (the old one fails
        the check)."""
        node.priority = priority
        self.restore(node)

    def _valid(self, entry) -> bool:
        priority, stamp, _, node = entry
        g = self.group
        return (node.pages[g] >= 0 and node.stamps[g] == stamp and node.priority == priority
                and not (self.leaf_only and node.child_pages[g]))

    def victim(self, protected=()):
        """The next page to evict: the heap's first valid unheld entry; else, where the policy evicts with
        descendants, the unheld cached page the order puts first, leaf or not (a scan, reached only when no leaf
        can go, at the very edge of the pool). None when no cached page can go."""
        heap, may_evict, g = self._heap, self.policy.may_evict, self.group
        while heap:
            entry = heapq.heappop(heap)
            if self._valid(entry) and may_evict(entry[3].refs[g]):
                return entry[3]
        if not self.policy.evict_with_descendants:
            return None
        unheld = [node for node in self.cached.values() if may_evict(node.refs[g])]
        return min(unheld, key=lambda node: (node.priority, node.stamps[g], node.serial), default=None)

    def clear(self) -> None:
        self._heap = []
        self._serial = 0

    def order(self) -> list:
        """The cached pages nobody holds, the next victim first (leaves first where the group needs them)."""
        g = self.group
        first: dict = {}
        for e in sorted(self._heap):
            if self._valid(e) and e[3].refs[g] == 0:
                first.setdefault(id(e[3]), e[3])
        return list(first.values())
