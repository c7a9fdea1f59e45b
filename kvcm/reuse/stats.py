"""The numbers reuse reports, under TensorRT-LLM's names (``KvCacheStats``, the per-request block counters).

TensorRT-LLM counts blocks: ``cache_hit_rate = reused / (reused + missed)``. vLLM counts tokens
(``prefix_cache_hits / prefix_cache_queries``); ``reused_tokens`` and ``queried_tokens`` give that rate too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockCounts:
    """One group's pool split three ways: never used or evicted (``free``), cached and referenced by no request
    (``reusable``), held by a request (``in_use``). Each block is in exactly one: the three add up to ``total``."""

    free: int
    reusable: int
    in_use: int
    total: int


@dataclass(frozen=True)
class LevelStatistics:
    """One cache level of one group in pages, as TensorRT-LLM V2's ``StorageStatistics``: what an allocation at
    that level can have is ``available``, the free pages and the cached ones nobody holds (evicted on demand)."""

    total: int
    free: int
    evictable: int

    @property
    def available(self) -> int:
        return self.free + self.evictable

    @property
    def unavailable(self) -> int:
        return self.total - self.available


@dataclass
class ReuseCounters:
    """What matching did, for one request or summed over a manager (TensorRT-LLM's ``mReusedBlocks`` ...)."""

    reused_blocks: int = 0        # context blocks taken from the cache, full or partial
    missed_blocks: int = 0        # context blocks computed afresh
    alloc_total_blocks: int = 0   # context blocks taken from the pool: missed + partial copies (getFreeBlock calls)
    alloc_new_blocks: int = 0     # of those, blocks that held no cached tokens (no cached block was evicted)
    reused_tokens: int = 0        # prompt tokens whose KV came from the cache (the prepopulated length)
    queried_tokens: int = 0       # prompt tokens looked up
    reused_host_blocks: int = 0   # of the reused blocks, those onboarded from the host tier

    def add(self, other: "ReuseCounters") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def cache_hit_rate(self) -> float:
        looked = self.reused_blocks + self.missed_blocks
        return self.reused_blocks / looked if looked else 0.0


@dataclass(frozen=True)
class RequestReuseStats:
    """One request's reuse (TensorRT-LLM's ``LlmRequest`` per-request KV cache counters)."""

    reused_blocks: int
    missed_blocks: int
    alloc_total_blocks: int
    alloc_new_blocks: int
    cache_hit_rate: float
    prepopulated_prompt_len: int


@dataclass(frozen=True)
class KvCacheStats:
    """The manager's cache statistics (TensorRT-LLM's ``KvCacheStats``, the most constrained full group for the
    block counts): ``free_num_blocks`` counts cached, unreferenced blocks as free, as upstream."""

    max_num_blocks: int
    free_num_blocks: int
    used_num_blocks: int
    tokens_per_block: int
    reused_blocks: int
    missed_blocks: int
    alloc_total_blocks: int
    alloc_new_blocks: int
    cache_hit_rate: float
    reused_tokens: int
    queried_tokens: int
    # the host tier (with host_cache_size; zeros without one): its blocks, free (V1: empty; V2: available, free +
    # evictable, as secondary_free_num_blocks) and cached there (never allocatable), and the blocks moved each way
    # and reused from it (V2's iter_offload / iter_onboard / iter_host_dropped and ReusedBlocksByLevel)
    max_num_host_blocks: int = 0
    free_num_host_blocks: int = 0
    reusable_num_host_blocks: int = 0
    offloaded_blocks: int = 0
    onboarded_blocks: int = 0
    host_dropped_blocks: int = 0
    reused_host_blocks: int = 0
