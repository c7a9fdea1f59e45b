"""The six defects this project started from: TensorRT-LLM's KV cache manager V2 warmup and sizing.

A change moved DeepSeek-V4's longest-decode constraint into generic V2 (TensorRT-LLM PR #16545); the fix
(PR #19213) scoped it back to V4, kept the explicit ``pool_ratio`` opt-out and removed a duplicate +1 from
generation dummies. The neighbours below come from the same code and the fixes that defined it.
"""

from __future__ import annotations


from ._registry import defect


@defect("gen-dummy-extra-token", upstream="TensorRT-LLM PR #19213 (generation dummies resized to capacity + 1, "
        "see PR #17489)",
        story="generation dummies one token too large: CUDA-graph warmup skipped page-boundary batch shapes",
        catchers=("suites/managers/test_capacity_trace.py::test_generation_dummy_history_31_holds_32",
                  "suites/managers/test_page_boundary.py::test_dummy_at_page_boundary_fits",
                  "pytest_kvcm/contract/test_target_page_boundary.py::"
                  "test_request_filling_the_free_pages_fits_and_one_more_token_does_not",
                  "suites/engine/test_cuda_graph.py::test_warmup_on_a_page_boundary_captures_every_shape"))
def gen_dummy_extra_token():
    """Generation dummies hold token_num + E + K + 1: the current input counted twice."""
    return {"gen_dummy_extra_slots": 1}


@defect("generic-longest-decode", upstream="TensorRT-LLM PR #19213 (reverts the move made in PR #16545)",
        story="V4's longest-decode constraint in generic V2 inflated every ordinary model's estimation pool past "
              "its budget",
        catchers=("suites/managers/test_formulas.py::test_generic_v2_has_no_longest_decode",
                  "suites/managers/test_budget.py::test_ordinary_model_estimation_within_budget",
                  "suites/engine/test_cuda_graph.py::test_warmup_on_a_page_boundary_captures_every_shape"))
def generic_longest_decode():
    return {"generic_v2_longest_decode": True}


@defect("v4-constraints-ignore-pool-ratio", upstream="TensorRT-LLM PR #19213 (the explicit pool-ratio opt-out)",
        story="DeepSeek-V4 built constraints despite an explicit pool_ratio",
        catchers=("suites/managers/test_formulas_deepseek_v4.py::test_v4_explicit_pool_ratio_has_no_constraints",
                  "suites/managers/test_budget.py::test_deepseek_v4_explicit_ratio_has_no_floors",
                  "suites/managers/test_page_boundary.py::test_deepseek_v4_dummy_at_page_boundary_with_shorts_held"))
def v4_constraints_ignore_pool_ratio():
    """Only generic V2's floors were dropped for an explicit ratio; V4's (with its longest decode) were kept."""
    return {"pool_ratio_keeps_v4_floors": True}


@defect("available-tokens-ignore-draft", upstream="TensorRT-LLM PR #17162 (spec extra tokens left out of the "
        "warmup block estimate)",
        story="available tokens not reduced by the draft tokens: spec-decode dummies overflowed the pool",
        catchers=("suites/managers/test_formulas.py::test_v2_available_tokens",
                  "suites/managers/test_page_boundary.py::test_dummy_at_page_boundary_fits",
                  "pytest_kvcm/contract/test_target_available_tokens.py::test_engine_answer_fits_and_is_the_boundary"))
def available_tokens_ignore_draft():
    return {"available_extra": lambda num_extra_kv_tokens, num_draft_tokens: num_extra_kv_tokens}


@defect("context-constraint-ignores-extra", upstream="TensorRT-LLM PR #16173 (DSV4 context constraint sized "
        "without num_extra_kv_tokens)",
        story="the chunked-prefill constraint forgot the extra KV tokens",
        catchers=("suites/managers/test_formulas.py::test_generic_context_constraint_is_n_plus_e",
                  "suites/managers/test_formulas.py::test_generic_context_floor_counts_extra_tokens",
                  "suites/managers/test_plan_cli.py::test_plan_llama3_v2_limits"))
def context_constraint_ignores_extra():
    return {"generic_v2_context_counts_extra": False}


@defect("stale-window-early-release", upstream="TensorRT-LLM PR #6768 (linear SWA blocks, out-of-window blocks "
        "detached); the +1 in-flight token of docs/semantics.md 2.1",
        story="sliding-window pages released one token early: attention read a freed page",
        catchers=("suites/managers/test_formulas.py::test_stale_range_formula",
                  "suites/managers/test_formulas.py::test_stale_blocks_released_by_v2_resize",
                  "pytest_kvcm/contract/test_target_sliding_window.py::test_window_pages_follow_the_window",
                  "suites/engine/test_gemma3_parity.py::test_prompts_inside_and_across_the_window_chunked",
                  "suites/engine/test_gemma3_tiny.py::test_tiny_gemma3_v1_v2_hf"))
def stale_window_early_release():
    return {"window_first_token": lambda history, window: history + 2 - window}
