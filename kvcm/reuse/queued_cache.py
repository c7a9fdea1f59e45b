"""V1's reuse cache over ``QueuedBlockPool``: cached blocks nobody holds wait in the pool's free queue with the
empty ones, as in TensorRT-LLM's ``WindowBlockManager`` (``kvCacheManager.cpp``), instead of a separate
eviction heap that is only drawn on once no empty page is left.

What changes against ``ReuseCache``: a page whose last holder lets go joins the back of its priority's FIFO
(``releaseBlock``); a claim takes it out (``claimBlock``), an undone claim puts it back where it was; an
allocation that reaches a cached page evicts it and, as ``getFreeBlock``'s ``freeChildren`` does, takes every
descendant in that group out of the tree (an unheld descendant stays where it is in the queue, now empty; a held
one stays with its request as a private page). A private page goes back at the priority it was taken with.
"""

from __future__ import annotations

import functools

from .cache import ReuseCache
from .tree import Node, deepest_first

DEFAULT_PRIORITY = 35


class QueuedReuseCache(ReuseCache):
    def __init__(self, pools, groups, leaf_only: list[bool], *, policy=None):
        super().__init__(pools, groups, leaf_only, policy=policy)
        self._claimed_keys: list[dict[int, tuple[int, int]]] = [{} for _ in pools]
        for g, pool in enumerate(pools):
            pool.evict = None
            pool.on_take = functools.partial(self._take_cached, g)
            pool.on_expire = functools.partial(self._expired, g)

    # ---- references ---------------------------------------------------------------------------------------
    def claim(self, node: Node, g: int) -> int:
        page = node.pages[g]
        if node.refs[g] == 0 and not self.policy.may_evict(1):     # a held block leaves the queue: never a victim
            self._claimed_keys[g][page] = self.pools[g].unqueue(page)
        return super().claim(node, g)

    def unclaim(self, node: Node, g: int) -> None:
        node.refs[g] -= 1
        if node.refs[g] == 0:
            page = node.pages[g]
            self.referenced[g] -= 1
            self.pools[g].num_reusable += 1
            key = self._claimed_keys[g].pop(page, None)
            if key is not None:
                self.pools[g].queue.restore(page, key)

    def drop(self, node: Node, g: int) -> None:
        if node.refs[g] <= 0:
            raise RuntimeError(f"block {node.pages[g]} released twice")
        node.refs[g] -= 1
        left = node.refs[g]
        self.pools[g].num_reusable += self.policy.reusable_gain(left)
        if left == 0:
            self.referenced[g] -= 1
            self._claimed_keys[g].pop(node.pages[g], None)
            self.pools[g].queue_cached(node.pages[g], node.priority, node.duration_ms, front=self._front)

    _front = False                     # set while a rewind releases (``releaseLastBlock`` queues at the front)

    def release(self, g: int, pages, priorities=None, *, front: bool = False) -> None:
        """A request's pages, last first: tree pages lose a reference, private ones go back to the queue with
        ``priorities[i]`` = (priority, duration_ms) they were taken with ((35, None) when None); with ``front``
        each goes to the front of its FIFO (``removeToken``'s ``releaseLastBlock``), the tree keeps cached ones."""
        self._front = front
        try:
            self._release(g, pages, priorities, front)
        finally:
            self._front = False

    def _release(self, g: int, pages, priorities, front: bool) -> None:
        pool, owners = self.pools[g], self.page_node[g]
        for i in reversed(range(len(pages))):
            page = pages[i]
            if page < 0:
                continue
            node = owners.get(page)
            if node is not None and node.pages[g] == page:
                self.drop(node, g)
            elif front:
                pool.release([page], None if priorities is None else [priorities[i]], front=True)
            else:
                pool.release_priority, pool.release_duration = ((DEFAULT_PRIORITY, None) if priorities is None
                                                                else priorities[i])
                try:
                    self.policy.release_block(pool, page)
                finally:
                    pool.release_priority, pool.release_duration = DEFAULT_PRIORITY, None

    # ---- the tree's pages -----------------------------------------------------------------------------------
    def unset_page(self, node: Node, g: int, *, free: bool, queued: bool = True) -> int:
        """As ``ReuseCache.unset_page``; an unheld page leaves the queue first unless ``queued`` is False (the
        allocation that evicts it has popped it already)."""
        if node.refs[g] == 0 and queued:
            self.pools[g].unqueue(node.pages[g])
        return super().unset_page(node, g, free=free)

    def _expired(self, g: int, page: int) -> None:
        """A queued page's duration ran out: a cached one's block is at priority 35 from now on."""
        node = self.page_node[g].get(page)
        if node is not None and node.pages[g] == page:
            node.priority = DEFAULT_PRIORITY
            node.duration_ms = None

    def _take_cached(self, g: int, page: int) -> None:
        """An allocation took a queued page that may be cached: evict it and its descendants in group g."""
        node = self.page_node[g].get(page)
        if node is None or node.pages[g] != page:
            return
        if node.child_pages[g] and not self.policy.evict_with_descendants:
            raise RuntimeError(f"layer group {g}: no cached block can be evicted")
        self._detach_subtree(node, g)
        self.unset_page(node, g, free=False, queued=False)

    def _detach_subtree(self, node: Node, g: int) -> None:
        """``detachDescendantsFromLookupTree`` for one group, deepest first."""
        pool = self.pools[g]
        with self.events.silenced(not self.policy.removed_event_for_descendants):
            for child in deepest_first(node):
                page = child.pages[g]
                if page < 0:
                    continue
                unheld = child.refs[g] == 0
                super().unset_page(child, g, free=False)
                if unheld:
                    pool.mark_empty(page)       # keeps its place in the queue, now an empty block

    def evict(self, g: int, n: int) -> None:
        raise RuntimeError("V1's queued pool evicts as it allocates")

    def reset(self) -> None:
        for g, pool in enumerate(self.pools):
            for page, node in self.page_node[g].items():
                if node.pages[g] == page and node.refs[g] == 0:
                    pool.unqueue(page)
            self._claimed_keys[g].clear()
        super().reset()
