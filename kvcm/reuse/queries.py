"""What a manager with the reuse API reports and changes outside admission: block counts per level, the stats
TensorRT-LLM's ``getKvCacheStats`` and V2's ``get_statistics`` give, block ids as TensorRT-LLM names them, retention
priorities and the clock, dropping the cache, and page states for tests.

Kept apart from ``api.py`` (admission: finding, claiming and storing a request's blocks) because none of these
matches a prompt: each reads the pools and the reuse cache ``ReuseMixin`` built, and only ``refresh_blocks``,
``set_clock`` and ``reset_prefix_cache`` change anything.
"""

from __future__ import annotations

from .. import validation
from ..retention_clock import RetentionClock
from .retention import DEFAULT_RETENTION_PRIORITY
from .stats import BlockCounts, KvCacheStats, LevelStatistics, ReuseCounters, RequestReuseStats


class ReuseQueriesMixin:
    # ---- counts and stats ------------------------------------------------------------------------------
    def _reported_group(self) -> int:
        """The group ``get_num_free_blocks`` reports: the most constrained full one (any when none is full)."""
        groups = [g.index for g in self.layer_groups if g.is_full] or [g.index for g in self.layer_groups]
        return min(groups, key=lambda g: self.pools[g].num_free + self.pools[g].num_reusable)

    def get_block_counts(self, group: int | None = None) -> BlockCounts:
        """``free`` (never used or evicted), ``reusable`` (cached, unreferenced) and ``in_use`` (held by a
        request) blocks of one group (None: the group ``get_num_free_blocks`` reports)."""
        g = self._reported_group() if group is None else validation.count("group", group, 0,
                                                                           len(self.pools) - 1, "layer groups")
        if self._reuse is None:
            pool = self.pools[g]
            return BlockCounts(pool.num_free, 0, pool.num_used, pool.num_blocks)
        return self._reuse.counts(g)

    def get_num_reusable_blocks(self) -> int:
        return self.get_block_counts().reusable

    def get_kv_cache_stats(self) -> KvCacheStats:
        g = self._reported_group()
        pool, t = self.pools[g], self._reuse_totals
        free = pool.num_free + pool.num_reusable     # cached blocks nobody holds count as free (allocating evicts)
        host = getattr(self._reuse, "host", None)
        tier = {}
        if host:
            h, cache = host[g], self._reuse
            # V2 reports the host level's available pages (free + evictable) as free, as its StorageStatistics do
            # (secondary_free_num_blocks); V1 counts only empty secondary blocks free
            free_host = h.num_free + (h.num_reusable if getattr(cache, "evictable_counts_as_free", False) else 0)
            tier = dict(max_num_host_blocks=h.num_blocks, free_num_host_blocks=free_host,
                        reusable_num_host_blocks=h.num_reusable, offloaded_blocks=cache.offloaded,
                        onboarded_blocks=cache.onboarded, host_dropped_blocks=cache.host_dropped,
                        reused_host_blocks=t.reused_host_blocks)
        return KvCacheStats(pool.num_blocks, free, pool.num_blocks - free, self.tokens_per_block, t.reused_blocks,
                            t.missed_blocks, t.alloc_total_blocks, t.alloc_new_blocks, t.cache_hit_rate,
                            t.reused_tokens, t.queried_tokens, **tier)

    def get_host_block_counts(self, group: int | None = None) -> BlockCounts:
        """The host tier's pages of one group (None: the group ``get_num_free_blocks`` reports): ``free`` (empty),
        ``reusable`` (an offloaded block waits there), ``in_use`` the blocks a load in flight reads (``async_onboard``;
        otherwise 0: a request only ever holds GPU pages), as TensorRT-LLM counts its secondary level; all zeros
        without a tier."""
        g = self._reported_group() if group is None else validation.count("group", group, 0,
                                                                           len(self.pools) - 1, "layer groups")
        host = getattr(self._reuse, "host", None)
        if not host:
            return BlockCounts(0, 0, 0, 0)
        h = host[g]
        return BlockCounts(h.num_free, h.num_reusable, h.num_blocks - h.num_free - h.num_reusable, h.num_blocks)

    def get_level_statistics(self, level: int = 0, group: int | None = None) -> LevelStatistics:
        """One cache level's pages of one group as TensorRT-LLM V2's ``StorageManager.get_statistics(level)``
        gives them: ``total``, ``free``, ``evictable`` (cached, nobody holds them) and ``available`` (free +
        evictable). Level 0 is the GPU pool, level 1 the host tier (all zeros without one)."""
        level = validation.count("level", level, 0, 1, "cache levels (0: GPU, 1: host)")
        counts = self.get_block_counts(group) if level == 0 else self.get_host_block_counts(group)
        return LevelStatistics(counts.total, counts.free, counts.reusable)

    def get_cache_block_ids(self, request_id) -> list[list[int]]:
        """The request's block ids per group as TensorRT-LLM names them (``getCacheBlockIds``): the block table's
        pages, except that an offload or onboard swaps the memory behind two ids, so with a host tier a request
        can hold ids at or above the GPU pool's size."""
        seq = self._seq(request_id)
        cache = self._reuse
        if not hasattr(cache, "block_id"):
            return [list(b) for b in seq.blocks]
        return [[cache.block_id(g, p) if p >= 0 else p for p in blocks] for g, blocks in enumerate(seq.blocks)]

    def get_request_stats(self, request_id) -> RequestReuseStats:
        state = self._seq(request_id).reuse
        c = ReuseCounters() if state is None else state.counters
        return RequestReuseStats(c.reused_blocks, c.missed_blocks, c.alloc_total_blocks, c.alloc_new_blocks,
                                 c.cache_hit_rate, 0 if state is None else state.prepopulated)

    def refresh_blocks(self) -> None:
        """TensorRT-LLM's ``refreshBlocks`` (once per step): unheld blocks whose retention duration ran out fall
        back to priority 35, at the back of its queue. V1 only; V2 has no durations (its priorities come from a
        callback), so there it changes nothing."""
        for pool in self.pools:
            refresh = getattr(pool, "refresh", None)
            if refresh is not None:
                refresh()

    @property
    def retention_clock(self):
        """The ``RetentionClock`` this manager's pools share (V1), or None (V2 keeps no durations)."""
        clock = getattr(self.pools[0], "clock", None)
        return clock if isinstance(clock, RetentionClock) else None

    def set_clock(self, clock_ms) -> None:
        """The clock retention durations run on: a callable returning milliseconds (monotonic). Tests inject
        one, as TensorRT-LLM's tests mock ``LRUEvictionPolicy::getTime``. It is called once here and refused unless
        it reads a finite number at or above the last reading; from then on each call that may start or check a
        timer reads it once before changing anything (``kvcm/retention_clock.py``). V2 checks it the same way and
        keeps no durations to run on it."""
        (self.retention_clock or RetentionClock()).replace(clock_ms)

    def get_priority_by_block_id(self, block_id, group: int = 0) -> int:
        """The retention priority of a block (TensorRT-LLM ``getPriorityByBlockId``): a cached block's, or the one
        a request holding it privately took it with; 35 for an id out of range or a block nobody has."""
        g = validation.count("group", group, 0, len(self.pools) - 1, "layer groups")
        if self._reuse is None or type(block_id) is not int:
            return DEFAULT_RETENTION_PRIORITY
        node = self._reuse.page_node[g].get(block_id)
        if node is not None and node.pages[g] == block_id:
            return node.priority
        for seq in self._seqs.values():
            if seq.reuse is not None and block_id in seq.blocks[g]:
                return seq.reuse.block_retention(seq.blocks[g].index(block_id), self.tokens_per_block)[0]
        return DEFAULT_RETENTION_PRIORITY

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block; False, with nothing changed, while a live request holds any block or a copy from
        the host tier is in flight."""
        if self._loads_pending() or any(b >= 0 for seq in self._seqs.values() for blocks in seq.blocks for b in blocks):
            return False
        if self._reuse is not None:
            self._reuse.reset()
        return True

    def page_state(self, group: int, block: int) -> str:
        """V2's page states for tests: ``FREE`` (in the free list), ``DROPPABLE`` (cached, nobody holds it),
        ``HELD`` (held only by requests whose context has not begun: TensorRT-LLM's suspended cache),
        ``LOCKED`` (held by a running request)."""
        g = validation.count("group", group, 0, len(self.pools) - 1, "layer groups")
        block = validation.count("block", block, 0, self.pools[g].num_blocks - 1, "blocks of the group")
        if not self.pools[g].is_used(block):
            return "FREE"
        seqs = list(self._seqs.values()) + ([] if self._reuse is None else self._reuse.loads.held_by_aborted())
        holders = [seq for seq in seqs if block in seq.blocks[g]]
        if not holders:
            return "DROPPABLE"
        if all(seq.reuse is not None and not seq.reuse.started for seq in holders):
            return "HELD"
        return "LOCKED"
