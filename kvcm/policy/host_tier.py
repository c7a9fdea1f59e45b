"""V1's host tier, V2's host level, retention durations and rewinds (``kvcm/reuse/host_tier.py``,
``kvcm/reuse/host_level.py``, ``kvcm/reuse/retention.py``, ``kvcm/free_queue.py``, ``kvcm/manager_v1.py``)."""

from __future__ import annotations

from ._decisions import Decisions, rule, setting


class HostTierDecisions(Decisions):
    SUBSYSTEM = "host tier and retention"

    @rule("whether a cached block an allocation evicts may go to the host tier: at a priority at least "
          "secondary_offload_min_priority (evictionPolicy.cpp getFreeBlock tests level >= min; the docstring of "
          "KvCacheConfig says '>', and a block at exactly the minimum was then dropped)")
    def offloadable(priority: int, min_priority: int) -> bool:
        return priority >= min_priority

    offload_keeps_priority = setting(
        True, "whether an offloaded block waits in the host queue at its own priority ('Update the block as a "
        "secondary block (maintaining its priority)', kvCacheManager.cpp getFreeBlock); at the default (35), "
        "priorities lost on the way down let a long-kept system prompt go before a one-off answer once the host "
        "filled")

    @rule("the reusable counts (GPU, host) after a block moves to the host tier: one fewer on the GPU, one more on "
          "the host (TensorRT-LLM PR #12834 / #12297, issue #11879: the claim after the memory swap updated the "
          "other level's list, free > max and used < 0)")
    def tier_counts_after_offload(gpu_reusable: int, host_reusable: int) -> tuple[int, int]:
        return gpu_reusable - 1, host_reusable + 1

    @rule("copy one block's KV between the GPU and host tiers, synchronously (TensorRT-LLM #8813: with "
          "host_cache_size a hit returned other prompts' tokens, the offload/onboard copy not synchronized with its "
          "use)")
    def tier_copy(dst_storage, dst_row: int, src_storage, src_row: int) -> None:
        dst_storage[dst_row].copy_(src_storage[src_row])

    expired_to_front = setting(
        False, "whether a block whose retention duration ran out goes to the front of the default (35) queue: no, "
        "to its back (LRUEvictionPolicy::refresh addToFreeBlockQueue(block, toFront=false)); at the front it was "
        "the next victim although other default-priority blocks had waited longer")

    @rule("whether a duration timer still applies to a queued block: only the entry of the release that started it "
          "(claimBlock erases the block from the expiring heap, so a block reused and released again starts anew); "
          "a stale timer dropped a just-released block's priority early")
    def timer_live(started_key, current_key) -> bool:
        return started_key == current_key

    retention_by_first_token = setting(
        True, "whether the token range a context block takes its retention from is its first token's "
        "(KvCacheRetentionConfig getPerBlockRetentionPriorityDuration walks block starts); by its last token a "
        "block straddling two ranges took the later one")

    claim_sets_retention = setting(
        True, "whether a matched block takes the priority and duration of the request that reuses it "
        "(claimBlock(block, priority, duration) in loadOrAllocateBlocks; KVCacheManagerEventStreamPriority sees 50 "
        "-> 10); without it a request could not lower or raise a shared prefix's retention")

    # ---- V2's host level (kvcm/reuse/host_level.py; TensorRT-LLM kv_cache_manager_v2 _storage_manager.py, _page.py)
    onboard_source_protected = setting(
        True, "whether a host page a match is migrating back to the GPU is out of the host level's eviction while "
        "GPU slots are prepared for it (batched_lock_to_gpu excludes the pages from eviction first); without it the "
        "host evicted, for the pages the GPU pushed down, the very page being onboarded (SGLang PR #27631: a "
        "re-entrant evict_host freed pages being loaded)")

    evicted_page_falls = setting(
        True, "whether a committed page V2 evicts from the GPU falls to the host level (_prepare_free_slots migrates "
        "it down) rather than leaving the cache; SGLang #33713: nodes evicted from the device were pruned instead of "
        "downgraded to their host copy, and the host tier's load-back never ran")

    demotion_frees_gpu_copy = setting(
        True, "whether a block kvcm's lower-tier-only mode moves to the host gives its GPU page back (one page a "
        "block, on one level); SGLang PR #34046 / #33777: write-back kept a host copy of a component that stayed "
        "resident on the device, the block held pages on both levels and exhausted the host pool")

    host_drop_takes_descendants = setting(
        True, "whether a page dropped at the last level takes its block's descendants with it in a full-attention "
        "group (Block.clear_stale_blocks_after_page_unlink -> remove_subtree): descendants left behind are "
        "unreachable and keep host and GPU pages counted as cached")

    store_beside_host_copy = setting(
        False, "whether a request committing a block that the tree holds on the host level installs its GPU page "
        "beside the host one (no: a block holds one page a life cycle, and an equal coverage does not replace it, "
        "Block.can_replace_page); beside it the block was counted on both levels")

    rewind_to_front = setting(
        True, "whether a rewound block goes to the front of its queue (removeToken -> releaseLastBlock(toFront=true)), "
        "so the next token takes it again; at the back a speculative step's rejected drafts pushed cached blocks out")
