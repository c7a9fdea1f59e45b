"""The field's host-tier, retention and rewind bugs, put back into V1's free queue, host tier and retention
(``kvcm/free_queue.py``, ``kvcm/reuse/host_tier.py``, ``kvcm/reuse/retention.py``) through their decisions (each
module's ``Decisions``).

Each is caught at two levels at least: the ported upstream cases (``suites/conformance/test_v1_*``) and the
manager or pool tests (``suites/managers/test_host_tier.py``, ``test_retention_rewind.py``, ``test_free_queue.py``).
"""

from __future__ import annotations

from ._registry import defect

_TIER = "suites/conformance/test_v1_host_tier.py::"
_RET = "suites/conformance/test_v1_retention.py::"
_M_TIER = "suites/managers/test_host_tier.py::"
_M_RET = "suites/managers/test_retention_rewind.py::"



@defect("offload-threshold-exclusive", upstream="TensorRT-LLM evictionPolicy.cpp getFreeBlock (level >= "
        "mSecondaryOffloadMinPriority) against KvCacheConfig's docstring ('greater than')",
        story="a block at exactly secondary_offload_min_priority was dropped instead of offloaded: the default "
              "minimum 30 and a retention of 30 lost the prefix the user asked to keep",
        catchers=(_TIER + "test_lru_policy_priority_test_offload_threshold",
                  _M_TIER + "test_a_block_at_exactly_the_minimum_priority_is_offloaded"))
def offload_threshold_exclusive():
    return {"offloadable": lambda priority, min_priority: priority > min_priority}


@defect("offload-loses-priority", upstream="TensorRT-LLM kvCacheManager.cpp getFreeBlock ('maintaining its "
        "priority'); the brief's 'priorities lost on the way down'",
        story="a block offloaded to the host waited there at the default priority: once the host filled, a long-kept "
              "system prompt went before a one-off answer",
        catchers=(_TIER + "test_an_offloaded_block_maintains_its_priority",
                  _M_TIER + "test_an_offloaded_block_keeps_its_priority_in_the_host_queue"))
def offload_loses_priority():
    return {"offload_keeps_priority": False}


@defect("offload-updates-the-wrong-level", upstream="TensorRT-LLM PR #12834 / PR #12297 (issue #11879: claimBlock "
        "after swapMemoryPoolBlockOffset erased from the other level's queue; free > max, used < 0)",
        story="an offload counted the block as still reusable on the GPU as well as on the host: the GPU tier's "
              "counts no longer added up to its pool",
        catchers=(_TIER + "test_claim_after_swap_keeps_each_level_counted",
                  _M_TIER + "test_offloads_keep_each_tier_counted_once"))
def offload_updates_the_wrong_level():
    return {"tier_counts_after_offload": lambda gpu, host: (gpu, host + 1)}


@defect("expired-block-to-front", upstream="TensorRT-LLM evictionPolicy.cpp LRUEvictionPolicy::refresh "
        "(addToFreeBlockQueue(block, /*toFront*/ false))",
        story="a block whose retention duration ran out went to the front of the default queue: it was the next "
              "victim although default blocks released before it had waited longer",
        catchers=(_RET + "test_kv_cache_manager_decode_timed_eviction_test",
                  _M_RET + "test_an_expired_block_waits_behind_the_default_blocks_released_before_it"))
def expired_block_to_front():
    return {"expired_to_front": True}


@defect("stale-retention-timer", upstream="TensorRT-LLM evictionPolicy.cpp claimBlock (mExpiringBlockHeap.erase "
        "when a block leaves the free queue) / releaseBlock (a new expiration at each release)",
        story="the timer of an earlier release still ran after the block was reused and released again: its "
              "priority fell back to 35 long before its new duration was up",
        catchers=(_M_RET + "test_a_reused_block_restarts_its_timer_when_released_again",
                  _M_RET + "test_a_timer_entry_from_an_earlier_release_does_not_fire"))
def stale_retention_timer():
    return {"timer_live": lambda started_key, current_key: current_key is not None}


@defect("retention-range-by-last-token", upstream="TensorRT-LLM kvCacheRetentionConfig.cpp "
        "getPerBlockRetentionPriorityDuration (a block's range is the one holding its first token; "
        "KvCacheRetentionConfigTest.BlockConfigTest)",
        story="a block straddling two token ranges took the later range's priority: a system prompt ending "
              "mid-block lost its high priority on its last block",
        catchers=(_RET + "test_retention_config_block_config_test",
                  _M_RET + "test_a_block_straddling_two_ranges_takes_the_range_of_its_first_token"))
def retention_range_by_last_token():
    return {"retention_by_first_token": False}


@defect("matched-block-keeps-old-retention", upstream="TensorRT-LLM kvCacheManager.cpp loadOrAllocateBlocks "
        "(claimBlock(matchingBlock, perBlockRetentions[bi].retentionPriority, durationMs); "
        "KVCacheManagerEventStreamPriority: 50 -> 10)",
        story="a request reusing a cached prefix could not change its retention: the prefix kept the priority of "
              "whoever stored it first",
        catchers=(_RET + "test_kv_cache_manager_event_stream_priority",
                  _M_RET + "test_a_hit_with_its_own_range_changes_the_shared_prefix_priority"))
def matched_block_keeps_old_retention():
    return {"claim_sets_retention": False}


@defect("rewind-released-to-back", upstream="TensorRT-LLM kvCacheManager.cpp removeToken -> releaseLastBlock "
        "(releaseBlock(block, toFront=true)); KVCacheManagerRewindTokensTest",
        story="blocks a rewind gave back (rejected draft tokens) went to the back of the free queue: each "
              "speculative step took a fresh block and pushed cached blocks out of the queue's front",
        catchers=(_RET + "test_kv_cache_manager_rewind_tokens_test",
                  _M_RET + "test_rejected_draft_slots_go_back_to_the_front_of_the_queue"))
def rewind_released_to_back():
    return {"rewind_to_front": False}


@defect("tier-copy-skipped", upstream="TensorRT-LLM #8813 (with host_cache_size a hit returned other prompts' "
        "tokens: the offload/onboard copy was not synchronized with its use)",
        story="a block moved between the GPU and host tiers without its KV: a hit from the host tier attended over "
              "another prompt's keys and values",
        catchers=(_M_TIER + "test_offloaded_kv_comes_back_byte_for_byte",
                  "suites/engine/test_host_tier_parity.py::test_host_tier_on_equals_off_equals_hf"))
def tier_copy_skipped():
    return {"tier_copy": lambda dst, dst_row, src, src_row: None}
