"""Differences from TensorRT-LLM in the sizing around the managers, each put back for one run.

Second fidelity pass (docs/semantics.md 4.4, 6, 7, 10): the pools the V2 storage manager builds from a quota,
the fields the estimation step changes, the CUDA-graph warmup's sizes, and the split of one budget between a
target and a draft cache. Each replaces one named decision of ``kvcm.policy`` with the rule kvcm had before (or the
rule upstream once had); ``suites/conformance/`` restates upstream's numbers.
"""

from __future__ import annotations

from ._registry import defect

_STORAGE = "suites/conformance/test_storage_quota.py::"
_GEMMA = "suites/conformance/test_gemma3_capacity.py::"
_SIZING = "suites/conformance/test_estimation_and_warmup_sizing.py::"
_SPLIT = "suites/conformance/test_draft_budget_split.py::"
_PLAN_POOL = "suites/managers/test_budget.py::test_plan_reports_the_pool_tensorrt_llm_would_build"
_WARMUP = "suites/managers/test_warmup_sizing.py::"


@defect("storage-exact-bytes",
        upstream="TensorRT-LLM tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py "
                 "(cache_tier_granularity: GPU pools in 2 MiB << k grains; ratio_from_batch rounds slot bytes to them)",
        story="the storage plan sized pools in exact bytes: Gemma 3 270M at 1 GiB came out 1,237 / 4,733 slots "
              "where TensorRT-LLM builds 1,092 / 5,461, and floors were not rounded to whole grains",
        catchers=(_STORAGE + "test_grain_grows_with_the_quota", _GEMMA + "test_upstream_default_share_is_grain_rounded",
                  _PLAN_POOL))
def storage_exact_bytes():
    return {"pool_granularity": lambda quota_bytes: 1}


@defect("storage-floors-not-enlarged",
        upstream="TensorRT-LLM tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py "
                 "(_compute_slot_count_for_level: quota = max(min quota of the floors, rounded quota))",
        story="the storage plan kept the budget as the quota when the constraint floors needed more: the "
              "enlargement past the budget (the seed's out-of-memory) vanished from the finding",
        catchers=(_STORAGE + "test_floors_past_the_budget_enlarge_the_pool",
                  _STORAGE + "test_floors_of_two_life_cycles_in_one_pool_group_add_up", _PLAN_POOL))
def storage_floors_not_enlarged():
    return {"storage_quota": lambda rounded_budget, min_quota: rounded_budget}


@defect("estimation-keeps-user-ratio",
        upstream="TensorRT-LLM tensorrt_llm/_torch/pyexecutor/_util.py (KvCacheCreator.try_prepare_estimation: "
                 "pool_ratio = None, max_gpu_total_bytes = min(fraction x free, the user's)",
        story="the estimation cache kept the user's pool_ratio (no constraints, no typical step) and ignored the "
              "user's max_gpu_total_bytes, sizing the temporary cache from another budget than upstream's",
        catchers=(_SIZING + "test_estimation_drops_the_users_pool_ratio",
                  _SIZING + "test_estimation_budget_is_the_smaller_of_fraction_and_byte_cap"))
def estimation_keeps_user_ratio():
    return {"estimation_overrides": lambda cfg: {"max_tokens": None, "max_gpu_total_bytes": None,
                                                 "free_gpu_memory_fraction": cfg.fraction,
                                                 "avg_seq_len": None}}


@defect("warmup-past-positions",
        upstream="TensorRT-LLM tensorrt_llm/_torch/pyexecutor/model_engine.py (_create_cuda_graph_warmup_request: "
                 "token_num = min(token_num, max_position_embeddings - max_draft_loop_tokens))",
        story="the long warmup dummy was capped by max_seq_len alone: a max_seq_len beyond the model's positions "
              "warmed up a request no real one can be",
        catchers=(_SIZING + "test_long_dummy_stops_at_the_models_positions_less_reserved_drafts",
                  _WARMUP + "test_estimation_and_final_warmups_stop_at_the_models_positions"))
def warmup_past_positions():
    return {"long_dummy_cap": lambda s, e, k, positions: s - 1 - e - k}


@defect("cuda-graph-sizes-floor-log",
        upstream="TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (_generate_cuda_graph_batch_sizes: "
                 "range(8, math.floor(log2(max))) became math.ceil)",
        story="the default captured batch sizes lost the last power of two below a maximum that is not one "
              "(512 for 600): batches of 257 .. 512 ran uncaptured or padded to 600",
        catchers=(_SIZING + "test_default_captured_batch_sizes",
                  _WARMUP + "test_upstream_batch_sizes_plan_every_size_up_to_the_maximum"))
def cuda_graph_sizes_floor_log():
    import math
    return {"cuda_graph_powers_of_two": lambda top: [2**i for i in range(8, math.floor(math.log(top, 2)))]}


@defect("draft-budget-target-floored",
        upstream="TensorRT-LLM tensorrt_llm/_torch/pyexecutor/_util.py (_compute_draft_budget_shares: the draft's "
                 "share is rounded down, the target keeps the rest)",
        story="kvcm rounded the target's share down and gave the draft the rest: a byte more than upstream's "
              "draft budget, a block more at a block boundary",
        catchers=(_SPLIT + "test_the_drafts_share_is_rounded_down",
                  "suites/managers/test_draft_budget.py::test_plan_shows_the_split"))
def draft_budget_target_floored():
    return {"draft_budget_shares": lambda total, bt, bd: (total * bt // (bt + bd),
                                                          total - total * bt // (bt + bd))}

