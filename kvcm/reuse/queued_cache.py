"""V1's reuse cache over ``QueuedBlockPool``: cached blocks nobody holds wait in the pool's free queue with the
empty ones, as in TensorRT-LLM's ``WindowBlockManager`` (``kvCacheManager.cpp``), instead of a separate
eviction heap that is only drawn on once no empty page is left.

What changes against ``ReuseCache``: the eviction order of a group is its pool's queue (``QueuedPages``): a page
whose last holder lets go joins the back of its priority's FIFO (``releaseBlock``); a claim takes it out
(``claimBlock``), an undone claim puts it back where it was; an allocation that reaches a cached page evicts it
and, as ``getFreeBlock``'s ``freeChildren`` does, takes every descendant in that group out of the tree (an unheld
descendant stays where it is in the queue, now empty; a held one stays with its request as a private page). A
private page goes back at the priority it was taken with.
"""

from __future__ import annotations

import functools

from ..free_queue import DEFAULT_PRIORITY
from .cache import ReuseCache
from .tree import Node, deepest_first


class QueuedPages:
    """The eviction order of one group's cached pages (``kvcm.eviction.EvictionPolicy`` over the tree's nodes):
    the pool's own free queue, which also holds the empty pages (``QueuedBlockPool.allocate`` chooses the victim).
    ``front`` is set while a rewind releases (``releaseLastBlock`` queues at the front)."""

    lazy = False

    def __init__(self, group: int, pool, cached: dict, leaf_only: bool, policy):
        self.group, self.pool, self.cached, self.policy = group, pool, cached, policy
        self.queue = pool.queue
        self.front = False

    def __len__(self) -> int:
        return len(self.queue)

    def release(self, node, priority: int) -> None:
        """``releaseBlock``: the back of its priority's FIFO, its duration's timer started (a claim's place is
        forgotten)."""
        self.pool.enqueue(node.pages[self.group], priority, node.duration_ms, front=self.front)

    def claim(self, node) -> None:
        """A held block leaves the queue, never a victim (unless the policy lets a held block be evicted)."""
        if not self.policy.may_evict(1):
            self.queue.claim(node.pages[self.group])

    def restore(self, node) -> None:
        self.queue.restore(node.pages[self.group])

    def remove(self, node) -> None:
        self.queue.remove(node.pages[self.group])

    def touch(self, node) -> None:
        """Upstream's queue orders by release, not by use."""

    def reprioritize(self, node, priority: int) -> None:
        self.queue.reprioritize(node.pages[self.group], priority)

    def victim(self, protected=()):
        raise RuntimeError("V1's queued pool evicts as it allocates")

    def clear(self) -> None:
        """Every unheld cached page leaves the queue (its page is released next, as an empty one)."""
        g = self.group
        for page, node in self.cached.items():
            if node.pages[g] == page and node.refs[g] == 0:
                self.queue.remove(page)
        self.queue.claimed.clear()

    def order(self) -> list:
        g, cached = self.group, self.cached
        return [cached[p] for p in self.queue.order() if p in cached and cached[p].pages[g] == p]


class QueuedReuseCache(ReuseCache):
    def __init__(self, pools, groups, leaf_only: list[bool], *, order=QueuedPages, policy=None):
        super().__init__(pools, groups, leaf_only, order=order, policy=policy)
        for g, pool in enumerate(pools):
            pool.evict = None
            pool.on_take = functools.partial(self._take_cached, g)
            pool.on_expire = functools.partial(self._expired, g)

    def release(self, g: int, pages, priorities=None, *, front: bool = False) -> None:
        """A request's pages, last first: tree pages lose a reference, private ones go back to the queue with
        ``priorities[i]`` = (priority, duration_ms) they were taken with ((35, None) when None); with ``front``
        each goes to the front of its FIFO (``removeToken``'s ``releaseLastBlock``), the tree keeps cached ones."""
        order = self.orders[g]
        order.front = front
        try:
            self._release(g, pages, priorities, front)
        finally:
            order.front = False

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
                self.unset_page(child, g, free=False, queued=False)
                if unheld:
                    pool.mark_empty(page)       # keeps its place in the queue, now an empty block

    def evict(self, g: int, n: int) -> None:
        raise RuntimeError("V1's queued pool evicts as it allocates")
