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


# ---- one budget for a target and a draft cache (kvcm/draft_budget.py) -----------------------------------------
@seam("the draft cache's bytes of a split budget: its per-token share rounded down, the target keeping the rest "
      "(TensorRT-LLM _util.py _compute_draft_budget_shares: slope_budget * draft_slope // slope_total); rounding "
      "the target's share down instead gave the draft a byte, and at a block boundary a block, more than upstream")
def draft_budget_share(total_bytes: int, target_bytes_per_token: int, draft_bytes_per_token: int) -> int:
    return total_bytes * draft_bytes_per_token // (target_bytes_per_token + draft_bytes_per_token)

