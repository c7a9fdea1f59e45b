"""Named seams: the small decisions of the managers and the engine that a historic bug lived in.

Code that makes one of these decisions calls it through this module (``seams.NAME(...)``), never through a
private method, so that a defect of ``pytest_kvcm.defects`` replaces exactly one named function with
``seams.replace(monkeypatch, "NAME", fn)`` and says in a few lines what changes, without copying a body or
reaching into private names. Each seam is a plain function of what it is passed (no hidden manager state), and
``SEAMS`` lists them all, so a test can check that every defect names a seam that exists.

A seam is looked up at call time (an attribute of this module), which costs one dictionary lookup: cheap enough
for the per-step paths, where the engine calls them.
"""

from __future__ import annotations

import sys

from .units import ceil_div

SEAMS: dict[str, str] = {}   # name -> what the decision is, filled by ``seam``


def seam(what: str):
    """Decorator: register a module-level function of this module as the seam named after it."""

    def wrap(fn):
        SEAMS[fn.__name__] = what
        return fn

    return wrap


def replace(monkeypatch, name: str, fn) -> None:
    """Put ``fn`` in place of the seam ``name`` for as long as ``monkeypatch`` lives (a defect's patch)."""
    if name not in SEAMS:
        raise KeyError(f"{name!r} is not a seam of kvcm.seams (known: {', '.join(sorted(SEAMS))})")
    monkeypatch.setattr(sys.modules[__name__], name, fn)


# ---- layer groups (kvcm/layer_groups.py) --------------------------------------------------------------------------
@seam("the life cycle a layer belongs to, which layers sharing one pool must agree on: its window and its sink "
      "tokens in whole blocks, as TensorRT-LLM's AttnLifeCycle keys it (keyed by raw sink tokens, layers whose "
      "sinks fill the same blocks got a pool each; vLLM PR #14097: windows dropped, sliding layers kept every page)")
def life_cycle(window: int | None, sink_tokens: int, tpb: int) -> tuple:
    return window, ceil_div(sink_tokens, tpb)


@seam("the order life cycles are numbered in: first seen first, as TensorRT-LLM's LifeCycleRegistry numbers them, "
      "so a pool_ratio copied from a real config weights the same groups")
def life_cycle_order(keys: list) -> list:
    return keys


@seam("the oldest token a future query of a sliding layer reads at this history: the in-flight token's window "
      "(TensorRT-LLM PR #6768; docs/semantics.md 2.1: a block released one token early is read after it is freed)")
def window_first_token(history: int, window: int) -> int:
    return history + 1 - window


@seam("the most blocks of a window one request holds, sinks aside: an unaligned window plus one block, one batch "
      "in flight (vLLM issue #49878: a second in-flight batch charged to every sliding pool)")
def window_bound_blocks(window: int, tpb: int) -> int:
    return ceil_div(window, tpb) + 1


# ---- pool sizing (kvcm/manager_v1.py, manager_v2.py) ------------------------------------------------------------
@seam("V1's blocks for kv_cache_config.max_tokens: whole blocks only, as TensorRT-LLM's calculate_max_num_blocks "
      "floors max_tokens // tokens_per_block")
def v1_blocks_for_max_tokens(max_tokens: int, tpb: int) -> int:
    return max_tokens // tpb


@seam("generic V2's constraint floors: the context (chunked-prefill) one of max_num_tokens + E, and no longest "
      "decode, which is DeepSeek-V4's alone (TensorRT-LLM PR #16173 / PR #19213)")
def generic_v2_constraints(limits) -> list:
    from .constraints import generic_constraints

    return generic_constraints(limits)


@seam("the constraint floors kept when kv_cache_config.pool_ratio is set: none, the ratio is used as given "
      "(TensorRT-LLM PR #19213's explicit opt-out)")
def pool_ratio_floors(named: list) -> list:
    return []


@seam("the byte budget's split between a target's and a draft model's caches: in proportion to their KV bytes per "
      "token, so both hold as many tokens (TensorRT-LLM PR #12188: each claimed the whole budget); the draft's share "
      "rounded down, the target keeping the rest (_util.py _compute_draft_budget_shares: slope_budget * draft_slope "
      "// slope_total); rounding the target's down instead gave the draft a byte, at a block boundary a block, more")
def draft_budget_shares(total: int, target_bytes_per_token: int, draft_bytes_per_token: int) -> tuple[int, int]:
    draft = total * draft_bytes_per_token // (target_bytes_per_token + draft_bytes_per_token)
    return total - draft, draft


# ---- DeepSeek-V4's cached layers (kvcm/deepseek_v4.py; TensorRT-LLM's deepseek_v4/cache_manager.py) -------------
@seam("how many MTP layers DeepSeek-V4 caches beside its own: max_draft_len - 1, repeating the last layer's ratio "
      "(DeepseekV4CacheManager.__init__)")
def v4_mtp_layers(max_draft_len: int) -> int:
    return max(0, max_draft_len - 1)


@seam("how much wider a compressor's fp32 states are than its head: twice for the overlapping ratio-4 one "
      "(get_attn_dim: state_factor 2 for is_overlap_compressor)")
def v4_state_factor(ratio: int) -> int:
    return 2 if ratio == 4 else 1


@seam("the bytes of one compressed indexer key: fp8 values and an fp32 scale per 128 (fp4: packed E2M1 values and "
      "a byte per 32), get_token_bytes for INDEXER_COMPRESS")
def v4_indexer_entry_bytes(index_head_dim: int, indexer_k_dtype: str) -> int:
    ihd = index_head_dim
    return ihd + ihd // 128 * 4 if indexer_k_dtype == "fp8" else ihd // 2 + ihd // 32


# ---- available tokens (get_num_available_tokens) ----------------------------------------------------------------
@seam("the slots beyond the answer a request of the answer's length holds: the extra KV tokens and the draft "
      "tokens (TensorRT-LLM PR #17162: drafts left out, spec-decode dummies overflowed the pool)")
def available_extra(num_extra_kv_tokens: int, num_draft_tokens: int) -> int:
    return num_extra_kv_tokens + num_draft_tokens


@seam("the capacity V2's clamp is asked for: the bound plus the extra slots, so a bound that fits comes back "
      "whole (TensorRT-LLM PR #13935 clamped the bound itself)")
def clamp_bound(token_num_upper_bound: int, extra: int) -> int:
    return token_num_upper_bound + extra


@seam("the blocks of one pool V2's clamp gives the batch's long request: the pool's total less the short "
      "requests' blocks (clamp_max_seq_len_for_mem starts from storage.num_slots; from the free blocks, warmup's "
      "short dummies were taken away twice)")
def clamp_blocks(num_blocks: int, num_free: int, short_blocks: int) -> int:
    return num_blocks - short_blocks


@seam("the blocks the clamp's long request needs in one group: its capacity less the window blocks already stale "
      "(vLLM PR #40946: a sliding-window gate budgeting the full sequence refused requests that fit)")
def clamp_blocks_needed(group, capacity: int, history: int, tpb: int) -> int:
    return group.blocks_needed(capacity, history, tpb)


# ---- dummy requests (add_dummy_requests, kvcm/warmup.py) ---------------------------------------------------------
@seam("a dummy call checked whole before anything is placed: (request_ids, token_nums, is_gen, drafts, reserve) "
      "as lists and counts, or a ConfigError naming the field")
def checked_dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens,
                       max_seq_len: int) -> tuple:
    from .validation import dummy_call

    return dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens, max_seq_len)


@seam("the dummies a failed call releases, raised or out of pages: every one it made (TensorRT-LLM PR #17162 "
      "leaked those before the failing one)")
def dummies_released(made: list, raised: bool) -> list:
    return made


@seam("the draft slots a dummy holds beyond token_num + E: the reservation asked, none more (TensorRT-LLM PR "
      "#19213: generation dummies one token too large skipped page-boundary shapes)")
def dummy_draft_slots(reserve: int, is_gen: bool) -> int:
    return reserve


@seam("the draft slots warmup's dummies reserve: the shape's draft length unless the caller says otherwise "
      "(vLLM PR #50531 / #51438: warmup without the spec-decode lookahead)")
def warmup_draft_reserve(draft_len: int, kv_reserve_draft_tokens: int | None) -> int:
    return draft_len if kv_reserve_draft_tokens is None else kv_reserve_draft_tokens


@seam("the final cache's config once the estimation cache is described and released: the user's own (TensorRT-LLM "
      "PR #15881: V2's max_tokens capped by the estimation run's dummy tokens)")
def final_cache_config(kv_cache_config, estimation: dict | None, report):
    return kv_cache_config


# ---- the engine's scheduler and drafter (kvcm/engine) ------------------------------------------------------------
@seam("whether preempting a request frees its pages in the draft model's cache too (TensorRT-LLM PR #18093: "
      "target and draft released together)")
def preempt_frees_draft(has_draft_cache: bool) -> bool:
    return has_draft_cache


@seam("where the draft model's first forward of a step starts: its own history, so it is fed every committed "
      "token it lacks (vllm-metal PR #716 fed only the last one)")
def draft_catch_up_start(history: int, num_tokens: int) -> int:
    return history


@seam("where the refill of a draft request made after steps without speculation stops: at the end of its "
      "context, every token the target committed while the drafter was idle (TensorRT-LLM "
      "test_min_runtime_draft_len.py: with a draft length of 0 the drafter's KV was not refreshed while the target "
      "committed tokens, and later drafts attended to positions allocated but never written)")
def draft_refill_stop(context_len: int, prompt_len: int) -> int:
    return context_len


@seam("whether a step speculates: under the batch cut-off and the acceptance gate still open, a closed gate "
      "winning over the cut-off (TensorRT-LLM PR #7283, whose fixes list 'permanent-disable takes precedence over "
      "dynamic drafting')")
def speculate_step(under_cutoff: bool, gate_closed: bool) -> bool:
    return under_cutoff and not gate_closed


@seam("whether a request is retired when its step is committed, before its token is read: when the token "
      "reaches max_new_tokens or max_seq_len (vLLM PR #27922: async scheduling ran one step past max_tokens)")
def retire_at_commit(num_outputs: int, max_new_tokens: int, num_tokens: int, max_seq_len: int) -> bool:
    return num_outputs >= max_new_tokens or num_tokens >= max_seq_len


# ---- block reuse (kvcm/reuse) ------------------------------------------------------------------------------------
@seam("how many of a request's tokens are looked up in the cache: all but the last, whose logits must come out "
      "of a forward (nano-vllm #144 looked up all of them: a full hit left nothing to compute)")
def lookup_length(num_tokens: int) -> int:
    return max(0, num_tokens - 1)


@seam("the key a block is filed and found under among its parent's children: its tokens themselves, compared "
      "exactly (vLLM GHSA-rm76-4mrf-v9r8 / PR #12621: a weak hash let one prompt read another's blocks)")
def block_key(tokens: tuple) -> object:
    return tokens


@seam("the free count an engine reads: truly free blocks plus cached, unreferenced ones (TensorRT-LLM and vLLM "
      "count the latter as free, since allocating evicts them)")
def free_blocks(truly_free: int, reusable: int) -> int:
    return truly_free + reusable


@seam("how many blocks a dropped reference adds to the reusable count: one when the last reference goes, none "
      "while another request holds the block (SGLang #35270 counted a shared block once per holder)")
def reusable_gain(refs_left: int) -> int:
    return 1 if refs_left == 0 else 0


@seam("the admission credit for a request's cached prefix: with only_allocated, matched blocks some request "
      "holds; cached blocks nobody holds are already in the free count (TensorRT-LLM PR #11490 "
      "countReusableBlocks(onlyAllocated))")
def reusable_credit(matched_refs: list, only_allocated: bool) -> int:
    if not only_allocated:
        return len(matched_refs)
    return sum(1 for refs in matched_refs if refs > 0)


@seam("the reused length when groups (windows) reuse different lengths: the shortest, which every group has "
      "(TensorRT-LLM PR #10875 / PR #2983 took a per-window or the longest one)")
def window_reuse_length(lengths: list) -> int:
    return min(lengths)


@seam("whether a manager may reuse a partly matched block: only when asked and when no group stores compressed "
      "entries (DeepSeek-V4's _supports_partial_reuse = False: a mid-block prefix hands over rows of tokens the "
      "request does not own)")
def partial_reuse_allowed(enable_partial_reuse: bool, compress_ratios: tuple) -> bool:
    return enable_partial_reuse and all(r == 1 for r in compress_ratios)


@seam("whether a cached page at the head of the eviction order may be evicted: only when no request holds it "
      "(TensorRT-LLM #17926: blocks were detached under a live request)")
def may_evict(refs: int) -> bool:
    return refs == 0


@seam("whether an allocation that finds no unheld leaf to evict (in a group that evicts leaves first) evicts an "
      "unheld block with descendants, taking its descendants' pages in that group out of the tree, as TensorRT-LLM's "
      "getFreeBlock does (kvCacheManager.cpp freeBlockAndAllDescendants / detachDescendantsFromLookupTree). Leaves "
      "only, a pool counted a cached block it could not evict as available: V1 with a window group and reuse raised "
      "RuntimeError from the block pool with another group's page already taken (issue 39). Both the eviction "
      "heap (V2) and V1's queued pool ask it")
def evict_with_descendants() -> bool:
    return True


@seam("whether a request made by add_sequence counts as started (its pages LOCKED, not HELD) after its first "
      "context chunk was refused: as it was before the call, since a refused call changes nothing "
      "(docs/semantics.md 11.2; V2 marked it started before it knew the chunk fit, issue 39)")
def started_after_refused_chunk(started_before: bool) -> bool:
    return started_before


@seam("whether a warmup batch that cannot fit is refused before its first dummy is placed when placing would "
      "evict cached blocks: an eviction is not undone by releasing the dummies, so placing first left a refused "
      "add_dummy_requests with fewer cached blocks than before (found by the exhaustive explorer, issue 39)")
def dummy_batch_checked_first() -> bool:
    return True


@seam("return one page to its pool; a page that is already free is refused, never listed twice in the free "
      "list (vLLM #42571: free_blocks([b, b]) grew the free count by two)")
def release_block(pool, block: int) -> None:
    if not pool.is_used(block):
        raise RuntimeError(f"block {block} released twice")
    pool.push_free(block)


# ---- block reuse in the engine (kvcm/engine/reuse.py) ----------------------------------------------------------
@seam("where the prefill of a request admitted with a cached prefix starts: the prepopulated prompt length the "
      "manager returned, of num_tokens known tokens (vLLM #5543 / #7845 and TensorRT-LLM #8813 / #15503: an "
      "engine whose computed-token count disagreed with the cached blocks skipped or misplaced prompt tokens and "
      "greedy outputs changed on repeat)")
def prefill_start(prepopulated: int, num_tokens: int) -> int:
    return prepopulated


# ---- parallel deployments (kvcm/parallel.py) ---------------------------------------------------------------------
@seam("KV heads one rank keeps of a layer's num_kv_heads over attn_tp attention-TP ranks: rounded up, so heads are "
      "replicated when there are fewer than ranks (TensorRT-LLM resource_manager.py KVCacheManager.__init__: "
      "(num_kv_heads + tp_size - 1) // tp_size; PR #3002 fixed a kv_head_num of 0 when the ranks outnumbered the "
      "KV heads of an MQA model)")
def kv_heads_per_rank(num_kv_heads: int, attn_tp: int) -> int:
    return -(-num_kv_heads // attn_tp)


@seam("how many ways one latent entry (MLA's kv_lora_rank + rope, every DeepSeek-V4 role) is split over attention-TP "
      "ranks: none, every rank stores all of it (TensorRT-LLM _util.py builds the MLA cache with num_kv_heads=1; "
      "tenstorrent/tt-xla #5861 budgeted the replicated latent as sharded, a tp_size-fold over-commit)")
def latent_ways(attn_tp: int) -> int:
    return 1


@seam("the tokens each rank's V1 pool is sized for, given what each rank's own budget holds: the fewest, on every "
      "rank (TensorRT-LLM calculate_max_num_blocks allreduces max_tokens with MIN; PR #4007 made AutoDeploy's "
      "ranks agree on one KV cache size after ranks had sized theirs apart)")
def rank_tokens(own_tokens: list) -> list:
    return [min(own_tokens)] * len(own_tokens)


# ---- start-up check (kvcm/startup.py) ----------------------------------------------------------------------------
@seam("the pages of a pool that a request can be given: all of them less those the engine holds back from every "
      "request (vLLM PR #47272: the start-up check counted the null block as usable, so a pool of exactly "
      "cdiv(max_model_len, block_size) blocks passed and a max_model_len request never scheduled)")
def startup_usable_pages(num_pages: int, reserved_pages: int) -> int:
    return num_pages - reserved_pages


# ---- TensorRT-LLM's V2 storage (kvcm/storage_quota.py) ---------------------------------------------------------
@seam("the grain every GPU pool is a whole number of: 2 MiB, doubled for every doubling of the quota past 1 GiB, "
      "at most 32 MiB (TensorRT-LLM _storage_manager.py cache_tier_granularity); sizing in exact bytes gives "
      "other slot counts than the pools upstream builds")
def pool_granularity(quota_bytes: int) -> int:
    from .storage_quota import gpu_granularity

    return gpu_granularity(quota_bytes)


@seam("the quota the storage manager builds: the budget in whole grains, enlarged to the constraint floors when "
      "they need more (TensorRT-LLM _compute_slot_count_for_level: max(min quota, rounded quota)); the enlargement "
      "past the budget is the seed's out-of-memory, and a plan that leaves it out hides it")
def storage_quota(rounded_budget: int, min_quota: int) -> int:
    return max(min_quota, rounded_budget)


# ---- estimation (kvcm/estimation.py) -------------------------------------------------------------------------
@seam("the config fields the estimation cache changes (TensorRT-LLM _util.py try_prepare_estimation): pool_ratio "
      "dropped, the byte budget min(fraction x free, max_gpu_total_bytes), max_tokens kept as a cap; avg_seq_len is "
      "set to max_seq_len by the caller. Keeping the user's ratio or ignoring the user's byte cap sized the "
      "temporary cache from other constraints and another budget than upstream's")
def estimation_overrides(kv_cache_config) -> dict:
    return {"pool_ratio": None, "avg_seq_len": None, "free_gpu_memory_fraction": kv_cache_config.fraction,
            "max_gpu_total_bytes": kv_cache_config.max_gpu_total_bytes, "max_tokens": kv_cache_config.max_tokens}


# ---- CUDA-graph warmup (kvcm/warmup.py) -------------------------------------------------------------------------
@seam("the most tokens the long warmup dummy may hold before the free blocks are counted: max_seq_len - 1 - E - K, "
      "and never past the model's positions less the K reserved draft slots (TensorRT-LLM model_engine.py "
      "_create_cuda_graph_warmup_request: min(token_num, max_position_embeddings - max_draft_loop_tokens)); "
      "without it a max_seq_len beyond the model's positions warmed up positions no request can reach")
def long_dummy_cap(max_seq_len: int, extra_kv_tokens: int, reserve: int, max_position_embeddings: int | None) -> int:
    cap = max_seq_len - 1 - extra_kv_tokens - reserve
    if max_position_embeddings is not None:
        cap = min(cap, max_position_embeddings - reserve)
    return cap


@seam("the powers of two TensorRT-LLM adds to its default CUDA-graph batch sizes: 256, 512, ... below the maximum "
      "(llm_args.py _generate_cuda_graph_batch_sizes, range(8, ceil(log2(max)))); the floor that range once used "
      "dropped the last power below a maximum that is not one (512 for a maximum of 600)")
def cuda_graph_powers_of_two(max_batch_size: int) -> list[int]:
    import math

    return [2**i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]




# ---- V1's host tier, retention durations, rewinds (kvcm/reuse/host_tier.py, kvcm/free_queue.py) -----------------
@seam("whether a cached block an allocation evicts may go to the host tier: at a priority at least "
      "secondary_offload_min_priority (evictionPolicy.cpp getFreeBlock tests level >= min; the docstring of "
      "KvCacheConfig says '>', and a block at exactly the minimum was then dropped)")
def offloadable(priority: int, min_priority: int) -> bool:
    return priority >= min_priority


@seam("the priority an offloaded block waits at in the host queue: its own ('Update the block as a secondary "
      "block (maintaining its priority)', kvCacheManager.cpp getFreeBlock); priorities lost on the way down let a "
      "long-kept system prompt go before a one-off answer once the host filled")
def offloaded_priority(priority: int) -> int:
    return priority


@seam("the reusable counts (GPU, host) after a block moves to the host tier: one fewer on the GPU, one more on the "
      "host (TensorRT-LLM PR #12834 / #12297, issue #11879: the claim after the memory swap updated the other "
      "level's list, free > max and used < 0)")
def tier_counts_after_offload(gpu_reusable: int, host_reusable: int) -> tuple[int, int]:
    return gpu_reusable - 1, host_reusable + 1


@seam("copy one block's KV between the GPU and host tiers, synchronously (TensorRT-LLM #8813: with host_cache_size "
      "a hit returned other prompts' tokens, the offload/onboard copy not synchronized with its use)")
def tier_copy(dst_storage, dst_row: int, src_storage, src_row: int) -> None:
    dst_storage[dst_row].copy_(src_storage[src_row])


@seam("where a block whose retention duration ran out goes: to the back of the default (35) queue "
      "(LRUEvictionPolicy::refresh addToFreeBlockQueue(block, toFront=false)); at the front it was the next victim "
      "although other default-priority blocks had waited longer")
def expired_to_front() -> bool:
    return False


@seam("whether a duration timer still applies to a queued block: only the entry of the release that started it "
      "(claimBlock erases the block from the expiring heap, so a block reused and released again starts anew); a "
      "stale timer dropped a just-released block's priority early")
def timer_live(started_key, current_key) -> bool:
    return started_key == current_key


@seam("the token of a context block that picks its token range: its first (KvCacheRetentionConfig "
      "getPerBlockRetentionPriorityDuration walks block starts); by its last token a block straddling two ranges "
      "took the later one")
def retention_token(block_start: int, tokens_per_block: int) -> int:
    return block_start


@seam("whether a matched block takes the priority and duration of the request that reuses it (claimBlock(block, "
      "priority, duration) in loadOrAllocateBlocks; KVCacheManagerEventStreamPriority sees 50 -> 10); without it a "
      "request could not lower or raise a shared prefix's retention")
def claim_sets_retention() -> bool:
    return True


@seam("whether a rewound block goes to the front of its queue (removeToken -> releaseLastBlock(toFront=true)), so "
      "the next token takes it again; at the back a speculative step's rejected drafts pushed cached blocks out")
def rewind_to_front() -> bool:
    return True


# ---- chunked local attention (kvcm/attention_types.py ChunkedLocal) -------------------------------------------------
@seam("the first token of the chunk a chunked-local query reads at this history: the in-flight token's own chunk "
      "(vLLM ChunkedLocalAttentionManager.get_num_skipped_tokens: n // chunk * chunk); mlx-lm PR #1673: Llama 4's "
      "ChunkedKVCache trimmed by its padded buffer length and dropped the current chunk's live tokens")
def chunk_first_token(history: int, chunk: int, page_size: int) -> int:
    return history // chunk * chunk


# ---- V2's host level (kvcm/reuse/host_level.py; TensorRT-LLM kv_cache_manager_v2 _storage_manager.py, _page.py) --
@seam("whether a host page a match is migrating back to the GPU is out of the host level's eviction while GPU slots "
      "are prepared for it (batched_lock_to_gpu excludes the pages from eviction first); without it the host "
      "evicted, for the pages the GPU pushed down, the very page being onboarded (SGLang PR #27631: a re-entrant "
      "evict_host freed pages being loaded)")
def onboard_source_protected() -> bool:
    return True


@seam("whether a page dropped at the last level takes its block's descendants with it in a full-attention group "
      "(Block.clear_stale_blocks_after_page_unlink -> remove_subtree): descendants left behind are unreachable and "
      "keep host and GPU pages counted as cached")
def host_drop_takes_descendants() -> bool:
    return True


@seam("whether a request committing a block that the tree holds on the host level installs its GPU page beside "
      "the host one (no: a block holds one page a life cycle, and an equal coverage does not replace it, "
      "Block.can_replace_page); beside it the block was counted on both levels")
def store_beside_host_copy() -> bool:
    return False
