"""Differences from TensorRT-LLM's KV cache manager V2 that kvcm once had, each put back for one run.

Every defect here is a place where kvcm's numbers left TensorRT-LLM's; the fix made them agree and
``suites/conformance/`` holds the cases that restate the upstream numbers (docs/semantics.md, deviations).
"""

from __future__ import annotations

from kvcm.units import ceil_div

from ._registry import defect


@defect("available-tokens-from-free-blocks",
        upstream="TensorRT-LLM tensorrt_llm/runtime/kv_cache_manager_v2/_core/_kv_cache_manager.py "
                 "(clamp_max_seq_len_for_mem starts from storage.num_slots)",
        story="get_num_available_tokens counted from the free blocks: warmup's long dummy came out bs - 1 blocks "
              "short of what the short dummies leave",
        catchers=("suites/managers/test_page_boundary.py", "suites/conformance/test_conformance_available_tokens.py"))
def available_tokens_from_free_blocks():
    """V2's clamp took the batch's short requests away from the *free* blocks, which already lacked them."""
    return {"clamp_blocks": lambda num_blocks, num_free, short_blocks: num_free - short_blocks}


@defect("v4-compressor-not-overlapped",
        upstream="TensorRT-LLM tensorrt_llm/_torch/attention/backends/sparse/deepseek_v4/cache_manager.py "
                 "(get_attn_dim: state_factor 2 for is_overlap_compressor)",
        story="DeepSeek-V4's ratio-4 compressor sized as a plain one: its fp32 states half as wide, the window-8 "
              "pool half the bytes TensorRT-LLM gives it",
        catchers=("suites/conformance/test_deepseek_v4_bytes.py", "suites/managers/test_formulas_deepseek_v4.py"))
def v4_compressor_not_overlapped():
    return {"v4_state_factor": lambda ratio: 1}


@defect("v4-indexer-keys-bf16",
        upstream="TensorRT-LLM tensorrt_llm/_torch/attention/backends/sparse/deepseek_v4/cache_manager.py "
                 "(get_token_bytes: INDEXER_COMPRESS is fp8 plus index_head_dim // 128 fp32 scales)",
        story="DeepSeek-V4's compressed indexer keys stored as bf16 (256 bytes an entry, not 132)",
        catchers=("suites/conformance/test_deepseek_v4_bytes.py", "suites/managers/test_formulas_deepseek_v4.py"))
def v4_indexer_keys_bf16():
    return {"v4_indexer_entry_bytes": lambda index_head_dim, indexer_k_dtype: 2 * index_head_dim}


@defect("v4-no-mtp-layers",
        upstream="TensorRT-LLM tensorrt_llm/_torch/attention/backends/sparse/deepseek_v4/cache_manager.py "
                 "(__init__ appends max_draft_len - 1 MTP layers with the last layer's ratio)",
        story="DeepSeek-V4 with drafts cached no MTP layers: every pool short of the draft layers' blocks",
        catchers=("suites/conformance/test_deepseek_v4_bytes.py", "suites/managers/test_formulas_deepseek_v4.py"))
def v4_no_mtp_layers():
    return {"v4_mtp_layers": lambda max_draft_len: 0}


@defect("layer-groups-full-first",
        upstream="TensorRT-LLM tensorrt_llm/runtime/kv_cache_manager_v2/_life_cycle_registry.py "
                 "(LifeCycleRegistry numbers life cycles as first seen)",
        story="layer groups numbered full attention first: a pool_ratio copied from a real config weighted the "
              "wrong groups",
        catchers=("suites/conformance/test_life_cycles.py", "suites/managers/test_formulas.py"))
def layer_groups_full_first():
    return {"life_cycle_order": "full_first"}


@defect("life-cycles-keyed-by-sink-tokens",
        upstream="TensorRT-LLM tensorrt_llm/runtime/kv_cache_manager_v2/_life_cycle_registry.py "
                 "(AttnLifeCycle keeps num_sink_blocks = div_up(num_sink_tokens, tokens_per_block))",
        story="sliding layers whose sink tokens fill the same blocks kept apart: one pool more than TensorRT-LLM "
              "has, each sized on its own",
        catchers=("suites/conformance/test_life_cycles.py",))
def life_cycles_keyed_by_sink_tokens():
    return {"life_cycle": lambda window, sink_tokens, tpb: (window, sink_tokens)}


@defect("v1-max-tokens-rounded-up",
        upstream="TensorRT-LLM tensorrt_llm/_torch/pyexecutor/resource_manager.py "
                 "(calculate_max_num_blocks: blocks_in_primary_pool = max_tokens // tokens_per_block)",
        story="V1 rounded max_tokens up to a whole block: one block more than TensorRT-LLM allocates",
        catchers=("suites/conformance/test_steps_and_dummies.py", "suites/managers/test_formulas.py"))
def v1_max_tokens_rounded_up():
    return {"v1_blocks_for_max_tokens": lambda max_tokens, tpb: ceil_div(max_tokens, tpb)}
