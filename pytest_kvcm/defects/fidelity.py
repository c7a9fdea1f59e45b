"""Differences from TensorRT-LLM's KV cache manager V2 that kvcm once had, each put back for one run.

Every defect here is a place where kvcm's numbers left TensorRT-LLM's; the fix made them agree and
``suites/conformance/`` holds the cases that restate the upstream numbers (docs/semantics.md, deviations).
"""

from __future__ import annotations

from ._registry import defect


@defect("available-tokens-from-free-blocks",
        upstream="TensorRT-LLM tensorrt_llm/runtime/kv_cache_manager_v2/_core/_kv_cache_manager.py "
                 "(clamp_max_seq_len_for_mem starts from storage.num_slots)",
        story="get_num_available_tokens counted from the free blocks: warmup's long dummy came out bs - 1 blocks "
              "short of what the short dummies leave",
        catchers=("suites/managers/test_page_boundary.py",))
def available_tokens_from_free_blocks(mp):
    """V2's clamp took the batch's short requests away from the *free* blocks, which already lacked them."""
    from kvcm.layer_groups import ceil_div
    from kvcm.manager_v2 import KVCacheManagerV2

    def clamp(self, batch_size, upper, extra):
        tpb = self.tokens_per_block
        avail = [pool.num_free - (batch_size - 1) for pool in self.pools]
        if any(a < 1 for a in avail):
            return 0

        def fits(capacity):
            history = max(0, capacity - extra - 1)
            return all(g.blocks_needed(capacity, history, tpb) <= a for g, a in zip(self.layer_groups, avail))

        if fits(upper):
            return upper
        return max((b * tpb for b in range(ceil_div(upper, tpb)) if fits(b * tpb)), default=0)

    mp.setattr(KVCacheManagerV2, "_clamp", clamp)
