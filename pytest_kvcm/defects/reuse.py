"""The field's block-reuse bugs (prefix caching), put back into kvcm's reuse cache through its policy.

Each one replaces one decision of ``kvcm.policy`` (docs/semantics.md 11): what is looked up, what a key is, what
counts as free or reusable, what an admission credits, which window length a hybrid hit takes, whether partial
reuse is allowed, what may be evicted, how a page goes back to its pool. The catchers run at two levels at least:
the manager tests (``suites/managers/test_reuse_*``), the ported upstream numbers (``suites/conformance``), the
contract suites every target runs, or the engine's greedy parity.
"""

from __future__ import annotations

from ._registry import defect

_MATCH = "suites/managers/test_reuse_matching.py::"
_BOOKS = "suites/managers/test_reuse_accounting.py::"
_CONTRACT = "pytest_kvcm/contract/test_target_reuse.py::"
_V1 = "suites/conformance/test_reuse_v1_block_manager.py::"
_STATS = "suites/conformance/test_reuse_stats.py::"



@defect("reuse-last-token-matched", upstream="nano-vllm #144 / PR #199 (a full hit left seqlen_q = 0: no token to "
        "compute, no logits)",
        story="a request was looked up on its whole prompt: a prompt cached in full reused every token and the "
              "forward that must produce the first logits had nothing to run on",
        catchers=(_MATCH + "test_last_token_is_never_reused",
                  _V1 + "test_one_token_prompt_reuses_nothing",
                  _CONTRACT + "test_last_token_is_always_recomputed"))
def reuse_last_token_matched():
    return {"lookup_length": lambda num_tokens: num_tokens}


@defect("reuse-admission-credits-free-cached-blocks", upstream="TensorRT-LLM PR #11490 / #13095 "
        "(countReusableBlocks(onlyAllocated); dynamo PR #10193's mocker made the same double count)",
        story="an admission credited every cached block of a prompt's prefix, those nobody holds too: they are in "
              "the free count already, so the scheduler counted them twice and admitted what did not fit",
        catchers=(_BOOKS + "test_count_reusable_blocks_credits_only_held_blocks",
                  _CONTRACT + "test_failed_allocation_with_a_hit_changes_nothing"))
def reuse_admission_credits_free_cached_blocks():
    return {"reusable_credit": lambda matched_refs, only_allocated: len(matched_refs)}


@defect("reuse-evictable-double-counted", upstream="SGLang #35270 (evictable_size() counted a page shared by "
        "two requests once per holder: available + evictable exceeded the pool and the idle check killed the "
        "scheduler)",
        story="a shared cached block became reusable once per request that let go of it: reusable + in use "
              "exceeded the pool, and the free count an engine reads with it",
        catchers=(_MATCH + "test_concurrent_identical_prompts_keep_one_copy",
                  _BOOKS + "test_a_held_block_is_never_evicted",
                  _V1 + "test_shorter_and_longer_prompts_reuse_what_they_share",
                  _CONTRACT + "test_prefill_hit_shares_pages_and_cached_blocks_count_as_free"))
def reuse_evictable_double_counted():
    return {"reusable_gain": lambda refs_left: 1}


@defect("reuse-double-free-inflates-free", upstream="vLLM #42571 (free_blocks([b, b]) put one block in the free "
        "queue twice: num_free_blocks grew by two; fix proposed in PR #42615)",
        story="a page released twice went into the free list twice: the free count grew past the pool and two "
              "requests were later handed the same page",
        catchers=(_BOOKS + "test_a_page_released_twice_is_refused",
                  _BOOKS + "test_a_block_table_listing_a_page_twice_is_refused_on_free",
                  "suites/robustness/test_bad_manager_calls.py::"
                  "test_a_block_table_the_engine_wrote_to_cannot_free_a_page_twice"))
def reuse_double_free_inflates_free():
    return {"release_block": lambda pool, block: pool.push_free(block)}


@defect("window-reuse-length-max", upstream="TensorRT-LLM PR #10875 (nvbugs 5674665: prepopulatedPromptLen set "
        "per window; fixed to the minimum) / PR #2983 (VSWA reuse cut at the max window)",
        story="a hybrid model's hit took the longest length any window group had cached: the groups that lacked "
              "those blocks attended over pages never written for this prompt",
        catchers=("suites/managers/test_reuse_accounting.py::test_sliding_window_reuse_is_the_minimum_over_groups",
                  _CONTRACT + "test_hybrid_hit_is_the_shortest_over_its_groups"))
def window_reuse_length_max():
    return {"window_reuse_length": max}


@defect("v4-partial-reuse-on-compressed", upstream="TensorRT-LLM DeepseekV4CacheManager (_supports_partial_reuse "
        "= False: with partial reuse the second call diverged at decode step 2)",
        story="DeepSeek-V4 kept partial reuse on: a compressed group took a block matched mid-way, whose rows "
              "compress tokens the request does not share",
        catchers=(_MATCH + "test_dsv4_forces_partial_reuse_off_and_reuses_whole_blocks",
                  _STATS + "test_dsv4_reuses_whole_blocks_whatever_partial_reuse_says",
                  _CONTRACT + "test_reuse_is_whole_blocks_only"))
def v4_partial_reuse_on_compressed():
    return {"partial_reuse_allowed": lambda enable_partial_reuse, compress_ratios: enable_partial_reuse}


@defect("reuse-evicts-referenced-block", upstream="TensorRT-LLM #17926 / PR #18095 (nvbugs 6625710: a commit "
        "evicted and detached radix blocks a live request still read)",
        story="eviction took the oldest cached page whether or not a running request held it: that request's "
              "blocks left the tree and their pages were handed to another request",
        catchers=(_BOOKS + "test_eviction_skips_blocks_a_live_request_holds",
                  "suites/conformance/test_reuse_scopes_and_holds.py::"
                  "test_churn_never_detaches_blocks_a_live_request_holds",
                  "suites/engine/test_reuse_parity.py::test_reuse_after_preemption"))
def reuse_evicts_referenced_block():
    return {"may_evict": lambda refs: True}


@defect("reuse-keys-weak-hash", upstream="vLLM GHSA-rm76-4mrf-v9r8 / PR #12621 (predictable block-hash "
        "collisions let one prompt read another's blocks; sha256 since v0.8.3, the default since v0.10.2)",
        story="blocks were filed and found under a weak digest of their tokens (their sum) and compared by it "
              "alone: a block with the same digest and other tokens was a hit",
        catchers=(_MATCH + "test_blocks_with_the_same_digest_share_nothing",
                  _CONTRACT + "test_colliding_digest_is_not_a_hit"))
def reuse_keys_weak_hash():
    return {"block_key_hash": lambda tokens: (len(tokens), sum(tokens))}
