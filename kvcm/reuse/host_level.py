"""V2's host level: TensorRT-LLM KVCacheManagerV2's cache levels (``_storage_manager.py`` ``StorageManager``,
``HostCacheTierConfig``), the GPU level and one host level of ``host_cache_size`` bytes behind it.

A page evicted from the GPU falls to the host level instead of leaving the cache (``_prepare_free_slots``): the
block keeps its place in the tree and its priority, now resident on the host. The host level is the last one, so
to take fallen pages it first evicts pages of its own, in the order of its ``host_eviction_policy`` (a module of
``kvcm.eviction``; by default ``lru``, TensorRT-LLM's ``PrioritizedLRUEvictionPolicy``: lowest priority first, least
recently arrived first), and fallen pages it still has no room for are dropped, the ones that fell last kept. A page dropped at the last level leaves the cache; for a full-attention group its block's descendants go
with it (``Block.clear_stale_blocks_after_page_unlink`` -> ``remove_subtree``), a sliding group drops just that
page. A match reaches host-resident blocks like GPU ones; taking it migrates them back up (``batched_lock_to_gpu``):
the host pages are excluded from eviction first, GPU slots are prepared (which may push other GPU pages down),
the KV is copied and the host slots freed. A block is resident on one level at a time (``Block.storage`` holds
one page a life cycle).

What V2 does not have, unlike V1's secondary pool (``host_tier.py``): no minimum priority to offload (every
evicted committed page falls), no ``onboard_blocks`` switch, no block ids beyond the GPU pool (pages migrate, slot
ids are per level). Its counts are ``StorageStatistics`` per level: ``free``, ``evictable`` (cached pages nobody
holds) and ``available = free + evictable``.
"""

from __future__ import annotations

from collections import deque

from ..config import HOST_EVICTION_POLICIES
from ..eviction import host_level
from ..free_queue import DEFAULT_PRIORITY
from .cache import ReuseCache
from .host_tier import _host_storage, check_host_memory
from .tree import Node, deepest_first
from ..policy import Decisions, setting


def host_level_blocks(host_cache_size: int | None, pools) -> list[int]:
    """Host pages per group for ``host_cache_size`` bytes, split between the groups as the GPU level's bytes are
    (upstream computes every level's slot counts from one ratio, ``_compute_slot_count_for_level``): whole pages,
    floored, at least one a group when the size is not 0 (upstream's floor of one slot per life cycle)."""
    if not host_cache_size:
        return [0] * len(pools)
    total = sum(p.nbytes for p in pools)
    if total <= 0:
        return [0] * len(pools)
    return [max(1, int(host_cache_size) * p.num_blocks // total) for p in pools]


class HostSlots:
    """The host level's slots of one group, handed out as TensorRT-LLM V2's ``SlotAllocator`` does
    (``_storage/_core.py``): recycled slots first, in the order they were freed, then never-used ones (a freed slot
    comes back before a fresh one: ``test_storage_manager.py::test_recycled_slot_preserves_offset_slot_id``).
    ``num_reusable`` counts the slots whose cached page nobody holds (the level's evictable pages)."""

    def __init__(self, num_blocks: int, bytes_per_block: int):
        self.num_blocks = int(num_blocks)
        self.bytes_per_block = int(bytes_per_block)
        self._recycled: deque[int] = deque()
        self._fresh = 0
        self._used: set[int] = set()
        self.num_reusable = 0
        self.storage = None

    @property
    def num_free(self) -> int:
        return len(self._recycled) + self.num_blocks - self._fresh

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"host level has {self.num_free} free slots, {n} asked")
        out = []
        for _ in range(n):
            if self._recycled:
                row = self._recycled.popleft()
            else:
                row, self._fresh = self._fresh, self._fresh + 1
            self._used.add(row)
            out.append(row)
        return out

    def release(self, rows) -> None:
        for row in rows:
            if row not in self._used:
                raise RuntimeError(f"host slot {row} released twice")
            self._used.remove(row)
            self._recycled.append(row)

    def is_used(self, row: int) -> bool:
        return row in self._used

    def free_order(self) -> list[int]:
        """The free slots in the order ``allocate`` hands them out."""
        return list(self._recycled) + list(range(self._fresh, self.num_blocks))


class LeveledReuseCache(ReuseCache):
    """``ReuseCache`` (V2's GPU level) with a host level per group behind it."""

    host_eviction_policies = HOST_EVICTION_POLICIES   # any of kvcm.eviction's host-level orders
    evictable_counts_as_free = True       # KvCacheStats.free_num_host_blocks is available (secondary_free_num_blocks)
    migration_is_new_allocation = True    # a page migrated back is in alloc_new too (_record_migrated_slots)

    def __init__(self, pools, groups, leaf_only: list[bool], *, order, num_host_blocks: list[int],
                 host_eviction_policy: str = "lru", policy=None):
        """``host_eviction_policy``: the host level's order (the name of its module of ``kvcm.eviction``)."""
        super().__init__(pools, groups, leaf_only, order=order, policy=policy)
        self.host: list[HostSlots] = []
        for pool, n in zip(pools, num_host_blocks):
            host = HostSlots(n, pool.bytes_per_block)
            host.storage = _host_storage(n, pool.bytes_per_block, pool.device)
            self.host.append(host)               # host.num_reusable: its evictable pages
        self.host_node: list[dict[int, Node]] = [{} for _ in pools]
        host_order = host_level(host_eviction_policy)
        self.host_orders = [host_order(n, self.policy) for n in num_host_blocks]    # per group: the order its blocks leave in
        self._excluded: list[set[Node]] = [set() for _ in pools]      # blocks a match is migrating: not evictable
        self.offloaded = 0
        self.onboarded = 0
        self.host_dropped = 0

    @classmethod
    def sized(cls, pools, groups, leaf_only, cfg, *, order, policy=None) -> "LeveledReuseCache | None":
        """The host level ``cfg.host_cache_size`` makes (``HostCacheTierConfig(quota=host_cache_size)``), split as
        the GPU level's bytes are; None when it has no page (kvcm builds none when it is unset, semantics.md 11.7)."""
        counts = host_level_blocks(cfg.host_cache_size, pools)
        if not any(counts):
            return None
        check_host_memory(cfg.host_cache_size, counts, pools)
        return cls(pools, groups, leaf_only, order=order, num_host_blocks=counts,
                   host_eviction_policy=cfg.host_eviction_policy, policy=policy)

    @staticmethod
    def plan(manager, host_bytes: int) -> dict:
        """``kvcm plan --host-cache-size``'s figures of this level for ``manager``: its pages a group, split as the
        GPU level's bytes are (the fewest of them reported as the level's blocks)."""
        per_group = host_level_blocks(host_bytes, manager.pools)
        return {"host_blocks": min(per_group), "host_blocks_per_group": per_group}

    # ---- eviction from the GPU level: pages fall to the host level -------------------------------------------
    def evict(self, g: int, n: int) -> None:
        """Free at least ``n`` GPU pages of group g (an allocation asks): the victims fall to the host level."""
        pool, order = self.pools[g], self.orders[g]
        target = pool.num_free + n
        fallen: list[tuple[Node, int]] = []
        while pool.num_free < target:
            victim = order.victim()           # a middle block (no leaf left) keeps its descendants reachable here
            if victim is None:
                raise RuntimeError(f"layer group {g}: no cached block can be evicted")
            if self.policy.evicted_page_falls:
                fallen.append((victim, self._leave_gpu(victim, g)))
            else:
                self._drop(victim, g, victim=False)   # out of the cache, as with no host level
        self._fall(g, fallen)

    # ---- lower-tier-only mode: every unheld cached page leaves the GPU at once ---------------------------------
    def demote_unheld(self) -> None:
        """Every cached GPU page nobody holds falls to the host level now, in the GPU level's eviction order, as an
        allocation's eviction would push it (``evict``): the host takes it, evicting its own, or drops it."""
        for g, pool in enumerate(self.pools):
            if not self.policy.demotion_frees_gpu_copy:
                self._copy_down(g)
            elif pool.num_reusable:
                self.evict(g, pool.num_reusable)

    def _copy_down(self, g: int) -> None:
        """Host copies of unheld cached pages that keep their GPU pages too (only a defect does this: blocks on both
        levels), while the host level has free slots."""
        host = self.host[g]
        for page, node in list(self.page_node[g].items()):
            if node.pages[g] == page and node.refs[g] == 0 and node.host[g] < 0 and host.num_free:
                row = host.allocate(1)[0]
                node.host[g] = row
                self.host_node[g][row] = node
                host.num_reusable += 1
                self.host_orders[g].release(node, node.priority)
                self.offloaded += 1

    def _leave_gpu(self, node: Node, g: int) -> int:
        """The node's GPU page goes back to the pool; the node keeps its place in the tree (pending until the host
        level takes it or drops it) and, until then, its count as reusable. The page's rows stay as they were
        until ``_fall`` returns: nothing allocates in between."""
        page = node.pages[g]
        del self.page_node[g][page]
        node.pages[g] = -1
        node.host[g] = _PENDING
        self.policy.release_block(self.pools[g], page)
        self._unlink_from_parent(node, g)
        return page

    def _fall(self, g: int, fallen: list[tuple[Node, int]]) -> None:
        """The host level (the last one) takes the fallen pages: it evicts as many of its own evictable pages as
        they need, then keeps the ones that fell last and drops the rest (``_prepare_free_slots`` at the last
        level: ``accepted = fallen[-num_accepted:]``)."""
        host, order, excluded = self.host[g], self.host_orders[g], self._excluded[g]
        for node, _ in reversed(fallen):     # a store's misses first: an adaptive order learns from its ghosts
            order.touch(node)
        for _ in range(max(0, min(len(fallen) - host.num_free, host.num_reusable))):
            # a page a match is onboarding is excluded (``batched_lock_to_gpu`` excludes it from eviction before it
            # prepares GPU slots, whose fallen pages may make the host evict)
            victim = order.victim(excluded)
            if victim is None:
                break
            self._drop(victim, g)
        alive = [(node, page) for node, page in fallen if node.host[g] == _PENDING]
        keep = min(host.num_free, len(alive))
        for node, _ in alive[:len(alive) - keep]:
            self._drop(node, g, victim=False)
        for node, page in alive[len(alive) - keep:]:
            if node.host[g] == _PENDING:          # a drop above can take a pending descendant with it
                self._accept(node, g, page)

    def _accept(self, node: Node, g: int, page: int) -> None:
        host, pool = self.host[g], self.pools[g]
        row = host.allocate(1)[0]
        if host.storage is not None and pool.storage is not None:
            self.policy.tier_copy(host.storage, row, pool.storage, page)
        node.host[g] = row
        self.host_node[g][row] = node
        pool.num_reusable, host.num_reusable = self.policy.tier_counts_after_offload(pool.num_reusable,
                                                                                     host.num_reusable)
        priority = node.priority if self.policy.offload_keeps_priority else DEFAULT_PRIORITY
        self.host_orders[g].release(node, priority)
        self.offloaded += 1
        self.events.moved(self, node, g, 0, 1)

    def _drop(self, node: Node, g: int, *, victim: bool = True) -> None:
        """The block's page in group g leaves the last level, and so the cache; in a full-attention group every
        descendant's page in g goes with it (a held GPU page stays with its request, private). Only the host's own
        victims count as dropped (``iter_host_dropped_blocks``: the last level's direct LRU victims, not the
        fallen pages it had no room for nor the descendants the tree lets go)."""
        if self.groups[g].is_full and self.policy.host_drop_takes_descendants:
            with self.events.silenced(not self.policy.removed_event_for_descendants):
                for child in deepest_first(node):
                    self._forget(child, g)
        self._forget(node, g)
        self.host_dropped += victim

    def _forget(self, node: Node, g: int) -> None:
        """Whatever the node holds in group g, on either level or pending between them, leaves the tree."""
        if node.host[g] != -1:              # a GPU page is announced by unset_page
            self.events.removed(self, node, g)
        if node.host[g] == _PENDING:
            node.host[g] = -1
            self.pools[g].num_reusable -= 1
            self._prune(node)
        elif node.host[g] >= 0:
            self._free_host_row(node, g)
            self._prune(node)
        elif node.pages[g] >= 0:
            self.unset_page(node, g, free=node.refs[g] == 0)

    def _free_host_row(self, node: Node, g: int) -> None:
        row, host = node.host[g], self.host[g]
        del self.host_node[g][row]
        self.host_orders[g].remove(node)
        node.host[g] = -1
        if node in self._excluded[g]:
            self._excluded[g].discard(node)
        else:
            host.num_reusable -= 1
        host.release([row])

    # ---- migration back to the GPU level: a match takes host-resident blocks ----------------------------------
    def claim_host(self, node: Node, g: int) -> None:
        """Hold a host page for a match before any GPU slot is prepared: it leaves the host's eviction (and its
        evictable count) until it is migrated or the match is given up."""
        if node.refs[g] == 0:
            self.host_orders[g].touch(node)        # a hit (the order may move it: it stays if the match is given up)
        if node.refs[g] == 0 and self.policy.onboard_source_protected:
            self._excluded[g].add(node)
            self.host[g].num_reusable -= 1
        node.refs[g] += 1

    def unclaim_host(self, node: Node, g: int) -> None:
        """Undo ``claim_host``: the page is evictable again, at its place in the host queue."""
        node.refs[g] -= 1
        if node.refs[g] == 0 and node in self._excluded[g]:
            self._excluded[g].discard(node)
            self.host[g].num_reusable += 1

    def onboard(self, node: Node, g: int, page: int) -> int:
        """Copy a claimed host page into ``page`` (a fresh GPU slot): the block is on the GPU level again, held by
        the claiming request, and its host slot is free."""
        host, pool, row = self.host[g], self.pools[g], node.host[g]
        if row < 0:
            raise RuntimeError(f"layer group {g}: the host page of a block being migrated to the GPU was evicted "
                               "while its GPU slot was prepared")
        if host.storage is not None and pool.storage is not None:
            self.policy.tier_copy(pool.storage, page, host.storage, row)
        del self.host_node[g][row]
        self.host_orders[g].remove(node)
        if node in self._excluded[g]:
            self._excluded[g].discard(node)
        else:
            host.num_reusable -= 1
        node.host[g] = -1
        host.release([row])
        return self.onboarded_to(node, g, page)

    # ---- storing a block that is resident on the host ----------------------------------------------------------
    def set_page(self, node: Node, g: int, page: int) -> None:
        """A block the tree holds on the host level keeps that page: a request committing the same tokens again
        keeps its own GPU page private (``Block.can_replace_page``: an equal coverage does not replace)."""
        if node.host[g] >= 0 and not self.policy.store_beside_host_copy:
            return
        super().set_page(node, g, page)

    def reset(self) -> None:
        for g, host in enumerate(self.host):
            for row in list(self.host_node[g]):
                self.events.removed(self, self.host_node[g][row], g)
                host.release([row])
                self.host_node[g][row].host[g] = -1
            self.host_node[g].clear()
            self.host_orders[g].clear()
            self._excluded[g].clear()
            host.num_reusable = 0
        super().reset()


_PENDING = -2
"""``Node.host`` of a block whose GPU page has just been evicted and that the host level has not taken yet."""


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class HostLevelDecisions(Decisions):
    SUBSYSTEM = "V2's host level"

    evicted_page_falls = setting(
        True, "whether a committed page V2 evicts from the GPU falls to the host level (_prepare_free_slots migrates "
        "it down) rather than leaving the cache; SGLang #33713: nodes evicted from the device were pruned instead of "
        "downgraded to their host copy, and the host tier's load-back never ran")

    onboard_source_protected = setting(
        True, "whether a host page a match is migrating back to the GPU is out of the host level's eviction while "
        "GPU slots are prepared for it (batched_lock_to_gpu excludes the pages from eviction first); without it the "
        "host evicted, for the pages the GPU pushed down, the very page being onboarded (SGLang PR #27631: a "
        "re-entrant evict_host freed pages being loaded)")

    host_drop_takes_descendants = setting(
        True, "whether a page dropped at the last level takes its block's descendants with it in a full-attention "
        "group (Block.clear_stale_blocks_after_page_unlink -> remove_subtree): descendants left behind are "
        "unreachable and keep host and GPU pages counted as cached")

    store_beside_host_copy = setting(
        False, "whether a request committing a block that the tree holds on the host level installs its GPU page "
        "beside the host one (no: a block holds one page a life cycle, and an equal coverage does not replace it, "
        "Block.can_replace_page); beside it the block was counted on both levels")
