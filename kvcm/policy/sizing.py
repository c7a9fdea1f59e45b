"""Pool sizing: V1's blocks, generic V2's floors, V2's clamp, TensorRT-LLM's storage quota, estimation, the draft
budget, parallel ranks and vLLM's start-up check (``kvcm/manager_v1.py``, ``manager_v2.py``, ``storage_quota.py``,
``estimation.py``, ``draft_budget.py``, ``parallel.py``, ``plan_parallel.py``, ``startup.py``)."""

from __future__ import annotations

import math

from ._decisions import Decisions, rule, setting


class SizingDecisions(Decisions):
    SUBSYSTEM = "pool sizing"

    @rule("V1's blocks for kv_cache_config.max_tokens: whole blocks only, as TensorRT-LLM's "
          "calculate_max_num_blocks floors max_tokens // tokens_per_block")
    def v1_blocks_for_max_tokens(max_tokens: int, tpb: int) -> int:
        return max_tokens // tpb

    generic_v2_longest_decode = setting(
        False, "whether generic V2 has a longest-decode constraint floor: no, it is DeepSeek-V4's alone (TensorRT-LLM "
        "PR #16545 moved it into generic V2 and inflated every ordinary model's estimation pool; PR #19213 scoped it "
        "back)")

    generic_v2_context_counts_extra = setting(
        True, "whether generic V2's context (chunked-prefill) floor counts the extra KV tokens: max_num_tokens + E "
        "(TensorRT-LLM PR #16173: the DSV4 context constraint was sized without num_extra_kv_tokens)")

    pool_ratio_keeps_v4_floors = setting(
        False, "whether an explicit kv_cache_config.pool_ratio keeps DeepSeek-V4's constraint floors (those with its "
        "longest decode): no, the ratio is used as given with no floors at all (TensorRT-LLM PR #19213's explicit "
        "opt-out; before it only generic V2's floors were dropped)")

    @rule("the byte budget's split between a target's and a draft model's caches: in proportion to their KV bytes "
          "per token, so both hold as many tokens (TensorRT-LLM PR #12188: each claimed the whole budget); the "
          "draft's share rounded down, the target keeping the rest (_util.py _compute_draft_budget_shares: "
          "slope_budget * draft_slope // slope_total); rounding the target's down instead gave the draft a byte, at "
          "a block boundary a block, more")
    def draft_budget_shares(total: int, target_bytes_per_token: int, draft_bytes_per_token: int) -> tuple[int, int]:
        draft = total * draft_bytes_per_token // (target_bytes_per_token + draft_bytes_per_token)
        return total - draft, draft

    # ---- available tokens (get_num_available_tokens) ------------------------------------------------------------
    @rule("the slots beyond the answer a request of the answer's length holds: the extra KV tokens and the draft "
          "tokens (TensorRT-LLM PR #17162: drafts left out, spec-decode dummies overflowed the pool)")
    def available_extra(num_extra_kv_tokens: int, num_draft_tokens: int) -> int:
        return num_extra_kv_tokens + num_draft_tokens

    @rule("the capacity V2's clamp is asked for: the bound plus the extra slots, so a bound that fits comes back "
          "whole (TensorRT-LLM PR #13935 clamped the bound itself)")
    def clamp_bound(token_num_upper_bound: int, extra: int) -> int:
        return token_num_upper_bound + extra

    @rule("the blocks of one pool V2's clamp gives the batch's long request: the pool's total less the short "
          "requests' blocks (clamp_max_seq_len_for_mem starts from storage.num_slots; from the free blocks, "
          "warmup's short dummies were taken away twice)")
    def clamp_blocks(num_blocks: int, num_free: int, short_blocks: int) -> int:
        return num_blocks - short_blocks

    clamp_skips_stale_pages = setting(
        True, "whether the clamp's long request needs, in a sliding group, only its capacity less the window blocks "
        "already stale (its attention type's pages_needed), not every block of the sequence (vLLM PR #40946: a "
        "sliding-window gate budgeting the full sequence refused requests that fit)")

    # ---- TensorRT-LLM's V2 storage (kvcm/storage_quota.py) ------------------------------------------------------
    @rule("the grain every GPU pool is a whole number of: 2 MiB, doubled for every doubling of the quota past "
          "1 GiB, at most 32 MiB (from 16 GiB on; TensorRT-LLM _storage_manager.py cache_tier_granularity); sizing "
          "in exact bytes gives other slot counts than the pools upstream builds")
    def pool_granularity(quota_bytes: int) -> int:
        page = 2 << 20
        return page << min(4, max(0, int(math.log(quota_bytes / (page * 512), 2))))

    @rule("the quota the storage manager builds: the budget in whole grains, enlarged to the constraint floors "
          "when they need more (TensorRT-LLM _compute_slot_count_for_level: max(min quota, rounded quota)); the "
          "enlargement past the budget is the seed's out-of-memory, and a plan that leaves it out hides it")
    def storage_quota(rounded_budget: int, min_quota: int) -> int:
        return max(min_quota, rounded_budget)

    # ---- estimation (kvcm/estimation.py) ------------------------------------------------------------------------
    @rule("the config fields the estimation cache changes (TensorRT-LLM _util.py try_prepare_estimation): "
          "pool_ratio dropped, the byte budget min(fraction x free, max_gpu_total_bytes), max_tokens kept as a cap; "
          "avg_seq_len is set to max_seq_len by the caller. Keeping the user's ratio or ignoring the user's byte "
          "cap sized the temporary cache from other constraints and another budget than upstream's")
    def estimation_overrides(kv_cache_config) -> dict:
        return {"pool_ratio": None, "avg_seq_len": None, "free_gpu_memory_fraction": kv_cache_config.fraction,
                "max_gpu_total_bytes": kv_cache_config.max_gpu_total_bytes, "max_tokens": kv_cache_config.max_tokens}

    final_max_tokens_from_estimation = setting(
        False, "whether the final cache (built once the estimation cache is described and released) takes the "
        "estimation run's largest dummy workload as its max_tokens, on a version of TensorRT-LLM's estimation path: "
        "no, its config is the user's own (TensorRT-LLM PR #15881: PR #15091 did so for V2 too, the real pool was "
        "capped and a DeepSeek-V4 context server hung at startup)")

    # ---- parallel deployments (kvcm/parallel.py, kvcm/plan_parallel.py) -----------------------------------------
    @rule("KV heads one rank keeps of a layer's num_kv_heads over attn_tp attention-TP ranks: rounded up, so heads "
          "are replicated when there are fewer than ranks (TensorRT-LLM resource_manager.py KVCacheManager.__init__: "
          "(num_kv_heads + tp_size - 1) // tp_size; PR #3002 fixed a kv_head_num of 0 when the ranks outnumbered "
          "the KV heads of an MQA model)")
    def kv_heads_per_rank(num_kv_heads: int, attn_tp: int) -> int:
        return -(-num_kv_heads // attn_tp)

    latent_sharded = setting(
        False, "whether one latent entry (MLA's kv_lora_rank + rope, every DeepSeek-V4 role) is split over the "
        "attention-TP ranks: no, every rank stores all of it (TensorRT-LLM _util.py builds the MLA cache with "
        "num_kv_heads=1; tenstorrent/tt-xla #5861 budgeted the replicated latent as sharded, a tp_size-fold "
        "over-commit)")

    @rule("the tokens each rank's V1 pool is sized for, given what each rank's own budget holds: the fewest, on "
          "every rank (TensorRT-LLM calculate_max_num_blocks allreduces max_tokens with MIN; PR #4007 made "
          "AutoDeploy's ranks agree on one KV cache size after ranks had sized theirs apart)")
    def rank_tokens(own_tokens: list) -> list:
        return [min(own_tokens)] * len(own_tokens)

    # ---- start-up check (kvcm/startup.py) -----------------------------------------------------------------------
    @rule("the pages of a pool that a request can be given: all of them less those the engine holds back from "
          "every request (vLLM PR #47272: the start-up check counted the null block as usable, so a pool of exactly "
          "cdiv(max_model_len, block_size) blocks passed and a max_model_len request never scheduled)")
    def startup_usable_pages(num_pages: int, reserved_pages: int) -> int:
        return num_pages - reserved_pages
