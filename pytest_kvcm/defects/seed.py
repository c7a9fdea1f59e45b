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
def gen_dummy_extra_token(mp):
    """Generation dummies hold token_num + E + K + 1: the current input counted twice."""
    from kvcm.manager_v1 import KVCacheManagerV1
    from kvcm.manager_v2 import KVCacheManagerV2

    for cls in (KVCacheManagerV1, KVCacheManagerV2):
        original = cls._place_dummy

        def place(self, request_id, token_num, is_gen, reserve, _original=original):
            return _original(self, request_id, token_num, is_gen, reserve + 1 if is_gen else reserve)

        mp.setattr(cls, "_place_dummy", place)


@defect("generic-longest-decode", upstream="TensorRT-LLM PR #19213 (reverts the move made in PR #16545)",
        story="V4's longest-decode constraint in generic V2 inflated every ordinary model's estimation pool past "
              "its budget",
        catchers=("suites/managers/test_formulas.py::test_generic_v2_has_no_longest_decode",
                  "suites/managers/test_budget.py::test_ordinary_model_estimation_within_budget",
                  "suites/engine/test_cuda_graph.py::test_warmup_on_a_page_boundary_captures_every_shape"))
def generic_longest_decode(mp):
    from kvcm.config import BatchDesc, KVCacheDesc
    from kvcm.constraints import NamedConstraint
    from kvcm.manager_v2 import KVCacheManagerV2

    original = KVCacheManagerV2._named_constraints

    def named(self, _original=original):
        out = _original(self)
        s, b = self.max_seq_len, self.max_batch_size
        short = KVCacheDesc(1 + self.max_draft_len + self.num_extra_kv_tokens, 0)
        return out + [NamedConstraint("longest_decode", BatchDesc([KVCacheDesc(s, s - 1)] + [short] * (b - 1)))]

    mp.setattr(KVCacheManagerV2, "_named_constraints", named)


@defect("v4-constraints-ignore-pool-ratio", upstream="TensorRT-LLM PR #19213 (the explicit pool-ratio opt-out)",
        story="DeepSeek-V4 built constraints despite an explicit pool_ratio",
        catchers=("suites/managers/test_formulas.py::test_v4_explicit_pool_ratio_has_no_constraints",
                  "suites/managers/test_budget.py::test_deepseek_v4_explicit_ratio_has_no_floors",
                  "suites/managers/test_page_boundary.py::test_deepseek_v4_dummy_at_page_boundary_with_shorts_held"))
def v4_constraints_ignore_pool_ratio(mp):
    from kvcm import constraints as c
    from kvcm.deepseek_v4 import DeepseekV4CacheManager

    def size_pools(self):
        cfg, tpb = self.kv_cache_config, self.tokens_per_block
        blocks = super(DeepseekV4CacheManager, self)._size_pools()
        if cfg.pool_ratio is None:
            return blocks
        named = self._named_constraints()
        self.constraint_names, self.constraints = [n.name for n in named], [n.batch for n in named]
        weights = c.split_weights(self.layer_groups, tpb, pool_ratio=cfg.pool_ratio, typical_step=None)
        return c.split_quota(self.budget_bytes, self.layer_groups, weights, named, tpb)

    mp.setattr(DeepseekV4CacheManager, "_size_pools", size_pools, raising=False)


@defect("available-tokens-ignore-draft", upstream="TensorRT-LLM PR #17162 (spec extra tokens left out of the "
        "warmup block estimate)",
        story="available tokens not reduced by the draft tokens: spec-decode dummies overflowed the pool",
        catchers=("suites/managers/test_formulas.py::test_v2_available_tokens",
                  "suites/managers/test_page_boundary.py::test_dummy_at_page_boundary_fits",
                  "pytest_kvcm/contract/test_target_available_tokens.py::test_engine_answer_fits_and_is_the_boundary"))
def available_tokens_ignore_draft(mp):
    from kvcm.manager_v1 import KVCacheManagerV1
    from kvcm.manager_v2 import KVCacheManagerV2

    for cls in (KVCacheManagerV1, KVCacheManagerV2):
        original = cls.get_num_available_tokens

        def available(self, *, token_num_upper_bound, batch_size=1, max_num_draft_tokens=0, _original=original):
            return _original(self, token_num_upper_bound=token_num_upper_bound, batch_size=batch_size,
                             max_num_draft_tokens=0)

        mp.setattr(cls, "get_num_available_tokens", available)


@defect("context-constraint-ignores-extra", upstream="TensorRT-LLM PR #16173 (DSV4 context constraint sized "
        "without num_extra_kv_tokens)",
        story="the chunked-prefill constraint forgot the extra KV tokens",
        catchers=("suites/managers/test_formulas.py::test_generic_context_constraint_is_n_plus_e",
                  "suites/managers/test_formulas.py::test_generic_context_floor_counts_extra_tokens",
                  "suites/managers/test_plan_cli.py::test_plan_llama3_v2_limits"))
def context_constraint_ignores_extra(mp):
    import kvcm.manager_v2 as v2

    original = v2.generic_constraints

    def generic(limits):
        return original(limits.replace(num_extra_kv_tokens=0))

    mp.setattr(v2, "generic_constraints", generic)


@defect("stale-window-early-release", upstream="TensorRT-LLM PR #6768 (linear SWA blocks, out-of-window blocks "
        "detached); the +1 in-flight token of docs/semantics.md 2.1",
        story="sliding-window pages released one token early: attention read a freed page",
        catchers=("suites/managers/test_formulas.py::test_stale_range_formula",
                  "suites/managers/test_formulas.py::test_stale_blocks_released_by_v2_resize",
                  "pytest_kvcm/contract/test_target_sliding_window.py::test_window_pages_follow_the_window",
                  "suites/engine/test_gemma3_parity.py::test_prompts_inside_and_across_the_window_chunked",
                  "suites/engine/test_gemma3_tiny.py::test_tiny_gemma3_v1_v2_hf"))
def stale_window_early_release(mp):
    from kvcm.layer_groups import LayerGroup, ceil_div

    def stale_range(self, history, tpb):
        if self.window is None:
            return (0, 0)
        lo = min(ceil_div(history, tpb), self.sink_blocks(tpb))
        return lo, max(lo, (history + 2 - self.window) // tpb)

    mp.setattr(LayerGroup, "stale_range", stale_range)
