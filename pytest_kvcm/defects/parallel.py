"""Parallel deployments: how much of a layer's KV one rank stores (``kvcm.policy``'s ``kv_heads_per_rank`` and
``latent_sharded``) and how many tokens the ranks' pools agree on (``rank_tokens``). Each
defect is a bug engines shipped when they first split KV over ranks; the conformance cases restate TensorRT-LLM's
rule (docs/semantics.md section 12)."""

from __future__ import annotations

from ._registry import defect

_MAPPING = "suites/conformance/test_parallel_mapping.py::"
_PLAN = "suites/conformance/test_parallel_plan.py::"


@defect("kv-heads-floored-by-tp",
        upstream="TensorRT-LLM PR #3002 (fix for cp > kvHeadNum: kv_head_num became 0 when the ranks outnumbered "
                 "an MQA model's KV heads); resource_manager.py KVCacheManager.__init__ rounds up: "
                 "(num_kv_heads + tp_size - 1) // tp_size",
        story="KV heads a rank divided by tp and rounded down: a model with fewer KV heads than ranks got 0 heads "
              "a rank (and 8 heads over 3 ranks 2, a third of the cache missing) instead of replicated heads",
        catchers=(_MAPPING + "test_kv_heads_round_up_and_replicate",
                  "suites/managers/test_plan_parallel.py::test_fewer_kv_heads_than_ranks_are_replicated"))
def kv_heads_floored_by_tp():
    return {"kv_heads_per_rank": lambda num_kv_heads, attn_tp: num_kv_heads // attn_tp}


@defect("mla-latent-split-by-tp",
        upstream="tenstorrent/tt-xla #5861 (the MLA latent cache, replicated on every chip, budgeted as sharded: a "
                 "tp_size-fold over-commit); vllm-project/tpu-inference #1847; TensorRT-LLM _util.py builds MLA "
                 "caches with num_kv_heads=1 and get_cache_size_per_token's MLA branch never divides by tp",
        story="an MLA latent (and DeepSeek-V4's roles) counted as split over the TP ranks like K/V heads: each rank "
              "planned tp times the tokens its memory holds",
        catchers=(_MAPPING + "test_mla_latent_is_replicated",
                  _PLAN + "test_deepseek_v4_flash_at_tp8_without_attention_dp_replicates_the_latent",
                  "suites/managers/test_parallel_managers.py::test_deepseek_v4_rank_without_attention_dp_is_one_gpu"))
def mla_latent_split_by_tp():
    return {"latent_sharded": True}


@defect("ranks-size-kv-apart",
        upstream="TensorRT-LLM PR #4007 ([AutoDeploy] make all ranks agree on kv-cache size); resource_manager.py "
                 "calculate_max_num_blocks allreduces max_tokens with ReduceOp.MIN",
        story="each pipeline stage sized its V1 pool from its own budget: a stage with fewer layers allocated "
              "tokens no request could use, since every request needs room on every stage",
        catchers=(_PLAN + "test_the_stage_with_the_fewest_tokens_binds",
                  "suites/managers/test_plan_parallel.py::test_pipeline_stages_share_v1_tokens"))
def ranks_size_kv_apart():
    return {"rank_tokens": lambda own_tokens: list(own_tokens)}
