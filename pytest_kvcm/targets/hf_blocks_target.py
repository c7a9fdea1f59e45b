"""transformers 5.17's continuous-batching cache behind the contract: one block pool that every layer group draws
from, grown the way 5.17's own scheduler grows it.

5.17 has no sector pool (that came with transformers PR #47809, in 5.18: ``hf_target.py`` drives it). Its cache
allocates with ``PagedAttentionCache.allocate_blocks(n, request_id, allocated_blocks)`` (all or nothing: it checks
``will_allocation_be_successful`` first), and how many blocks a request asks for is the scheduler's decision,
``Scheduler._allocate_blocks_if_needed(state, len_next_tokens)``. The adapter calls that method of a real
``FIFOScheduler`` over the cache instead of computing the count itself, so the contract checks what a 5.17 engine
asks for. Relies on internal API (pinned by ``pytest_kvcm/contract/test_target_apis.py``).
"""

from __future__ import annotations

from .contract import PoolSpec
from .hf_target import HfRequests, model_config

BLOCK_COUNT_FINDING = (
    "transformers 5.17.0 scheduler.py Scheduler._allocate_blocks_if_needed asks for ((n - room + 1) // page) + 1 "
    "blocks for n new tokens, one block more than ceil((n - room) / page) when n - room is a multiple of the page "
    "or one short of it (a 16-token prompt on pages of 16 holds 2); the allocators of transformers PR #47809 (5.18) "
    "count ceil(total / page)")


class HfBlocksTarget(HfRequests):
    differences = {
        **HfRequests.differences,
        "shared_pool": "the full and the sliding-window groups take their blocks from one pool",
    }
    allocation_findings = {"block_count": BLOCK_COUNT_FINDING}

    def __init__(self, spec: PoolSpec, hf):
        super().__init__(spec)
        transformers, CBConfig, PagedAttentionCache, DistributedHelper, self._RequestState, FIFOScheduler = hf
        import torch

        cb = CBConfig(block_size=spec.page_size, num_blocks=spec.num_pages, max_batch_tokens=64,
                      allow_block_sharing=False, max_memory_percent=0.9)
        self.cache = PagedAttentionCache(model_config(spec), cb, "cpu", DistributedHelper(None, 300.0), {},
                                         dtype=torch.float32)
        self.scheduler = FIFOScheduler(self.cache, 0.0, spec.max_batch_size)
        managers = self.cache.group_cache_managers
        self.full = next(m for m in managers if not hasattr(m, "sliding_window"))
        self.window = next((m for m in managers if hasattr(m, "sliding_window")), None)
        self.page_size, self.total_pages = spec.page_size, self.cache.num_blocks

    def free_pages(self) -> int:
        return self.cache.get_num_free_blocks()

    def _store(self, state, num_tokens) -> bool:
        return self.scheduler._allocate_blocks_if_needed(state, num_tokens)

    def _free(self, rid):
        self.cache.free_blocks(rid)
        del self._states[rid]
