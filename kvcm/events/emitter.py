"""What the reuse cache tells about its tree, turned into events: the bridge between kvcm's nodes and pages and
the queue of ``kvcm.events.queue``.

The reuse cache calls it where its tree changes (``kvcm/reuse/cache.py``, ``queued_cache.py``, ``host_tier.py``,
``host_level.py``): a block gets a page in a group (``stored``), loses it (``removed``), moves between the GPU and
the host (``moved``), or a match sets its retention priority (``claimed``, V1 only, as upstream V2 has no
priority events). A node stands for one block in every group, so each event names its group; the hash is the
block's, computed from its tokens up to the root and the root's reuse scope (``kvcm.events.hashing``).

A manager built without ``event_buffer_max_size`` holds ``NO_EVENTS``: every call here costs one no-op call.
"""

from __future__ import annotations

import contextlib

from ..policy import Decisions, setting
from . import hashing
from .types import GPU_LEVEL, KVCacheCreatedData, KVCacheEventDiff, KVCacheStoredBlockData, KVCacheUpdatedData


class NoEvents:
    """The emitter of a manager whose events are off: every hook does nothing."""

    def created(self, *args) -> None: ...
    def stored(self, cache, node, g: int) -> None: ...
    def removed(self, cache, node, g: int) -> None: ...
    def moved(self, cache, node, g: int, old: int, new: int) -> None: ...
    def claimed(self, cache, nodes, retention) -> None: ...
    def end_store(self) -> None: ...
    def flush(self) -> None: ...

    def take(self) -> list:
        return []

    def silenced(self, flag: bool):
        return contextlib.nullcontext()


NO_EVENTS = NoEvents()


class EventEmitter(NoEvents):
    def __init__(self, queue, windows: list[int], *, priority_events: bool):
        """``windows``: the window size events report for each group; ``priority_events``: a match that changes a
        block's priority emits an updated event (V1's ``loadOrAllocateBlocks``)."""
        self.queue = queue
        self.windows = windows
        self.policy = queue.policy
        self.priority_events = priority_events
        self._silent = 0
        self._last = None                 # (node, hash) of the last block hashed: a stored chain hashes once

    # ---- hashes ---------------------------------------------------------------------------------------------
    def block_hash(self, cache, node):
        last = self._last
        if last is not None and node.parent is last[0]:
            scope = last[2]
            h = self._next_hash(last[1], node.tokens, scope)
        else:
            path = []
            while node.parent is not None:
                path.append(node)
                node = node.parent
            scope = next(s for s, root in cache.tree.roots.items() if root is node)
            h = None
            for n in reversed(path):
                h = self._next_hash(h, n.tokens, scope)
            node = path[0]
        self._last = (node, h, scope)
        return h

    def _next_hash(self, parent, tokens, scope):
        """A block's hash from its parent's (None for a root's child) in this queue's algorithm; V2 hashes keep
        their raw key while chaining (the event hash is derived from it)."""
        lora, salt = scope
        if self.queue.hash_algo == hashing.V1_BLOCK_KEY:
            return hashing.hash_v1_block_key(tokens, parent or 0, lora, hashing.cache_salt_id(salt))
        key = hashing.v2_root_key(lora, hashing.cache_salt_id(salt)) if parent is None else parent
        return hashing.v2_block_key(key, tokens)

    def _event_hash(self, h):
        return h if self.queue.hash_algo == hashing.V1_BLOCK_KEY else hashing.v2_event_hash(h, self.queue.hash_algo)

    def _parent_hash(self, cache, node):
        parent = node.parent
        if parent is None or parent.parent is None:
            return None
        return self._event_hash(self.block_hash(cache, parent))

    # ---- hooks ----------------------------------------------------------------------------------------------
    def created(self, group: int, levels: tuple[int, ...]) -> None:
        self.queue.created(self.windows[group], group, KVCacheCreatedData(tuple(levels)))

    def stored(self, cache, node, g: int) -> None:
        parent = self._parent_hash(cache, node)
        h = self._event_hash(self.block_hash(cache, node))
        block = KVCacheStoredBlockData(h, tuple(node.tokens), self._last[2][0], GPU_LEVEL, node.priority)
        self.queue.stored(self.windows[g], g, parent, block)

    def removed(self, cache, node, g: int) -> None:
        if self._silent:
            return
        h = self._event_hash(self.block_hash(cache, node))
        groups = [g] if self.policy.removed_event_names_group else self._holding(node, g)
        for group in groups:
            self.queue.removed(self.windows[group], group, h)

    @staticmethod
    def _holding(node, g: int) -> list[int]:
        """Every group in which the block is cached (on either level), ``g`` among them."""
        return sorted({g} | {i for i, (p, h) in enumerate(zip(node.pages, node.host)) if p >= 0 or h != -1})

    def moved(self, cache, node, g: int, old: int, new: int) -> None:
        h = self._event_hash(self.block_hash(cache, node))
        self.queue.updated(self.windows[g], g, KVCacheUpdatedData(h, cache_level=KVCacheEventDiff(old, new)))

    def claimed(self, cache, nodes, retention) -> None:
        """A match takes ``nodes`` with the request's per-block retention ``(priority, duration)``: each whose
        priority it changes is announced in every group that holds it (``loadOrAllocateBlocks``: the request's
        priority is set and differs from the block's)."""
        if not self.priority_events:
            return
        for i, node in enumerate(nodes):
            p = retention[i][0] if i < len(retention) else None
            if p is None or p == node.priority:
                continue
            h = self._event_hash(self.block_hash(cache, node))
            for g in range(len(node.pages)):
                if node.pages[g] >= 0 or node.host[g] >= 0:
                    data = KVCacheUpdatedData(h, priority=KVCacheEventDiff(node.priority, p))
                    self.queue.updated(self.windows[g], g, data)

    def end_store(self) -> None:
        self.queue.end_store()
        self._last = None

    @contextlib.contextmanager
    def silenced(self, flag: bool):
        """Within the block, removals are not announced when ``flag`` is true (a policy's defect)."""
        self._silent += bool(flag)
        try:
            yield
        finally:
            self._silent -= bool(flag)

    def flush(self) -> None:
        self.queue.flush()
        self._last = None

    def take(self) -> list:
        return self.queue.take()


class EventDecisions(Decisions):
    """Which changes of the reuse tree are announced: a router rebuilds its prefix index from these alone, so a removal
    not sent, or sent for the wrong group, leaves it routing to blocks the worker no longer holds."""

    SUBSYSTEM = "kv cache events"

    removed_event_for_descendants = setting(
        True, "whether the blocks an eviction takes with the block it chose (its descendants, detached from the "
        "tree: getFreeBlock's freeChildren) are announced as removed, each one; TensorRT-LLM PR #16335 fixed "
        "blockInRadixTree() testing the parent, so descendants of an evicted ancestor left silently")

    in_place_take_announced = setting(
        True, "whether a partly matched leaf a request takes over in place (it leaves the tree and the request "
        "writes into it) is announced as removed; TensorRT-LLM V1's loadOrAllocateBlocks frees the leaf with "
        "freeLeafBlock and no event (KVCacheManagerEventStreamPriority counts 1 event where it is re-stored), so "
        "a router keeps offering a block no request can match until the request releases it")

    removed_event_names_group = setting(
        True, "whether a removal names only the group that lost the block; announced for every group holding it, a "
        "router drops copies that are still cached (vLLM PR #48933: a BlockRemoved carries no count of the copies "
        "that remain, so a consumer invalidates a hash another copy still serves)")
