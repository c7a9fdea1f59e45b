"""TensorRT-LLM's own KV-cache bugs (beyond the seed change), reproduced in kvcm's managers."""

from __future__ import annotations

from ._registry import defect


@defect("v2-clamp-drops-extra", upstream="TensorRT-LLM PR #13935 (get_num_available_tokens clamped the bound "
        "before adding the speculative extra tokens)",
        story="V2's available tokens clamped token_num_upper_bound itself, not bound + E + drafts: a bound that "
              "fits came back E + drafts tokens short",
        catchers=("suites/managers/test_field_defects.py::test_available_tokens_return_a_bound_that_fits",
                  "pytest_kvcm/contract/test_target_available_tokens.py::test_engine_answers_the_bound_when_the_pool_is_larger"))
def v2_clamp_drops_extra():
    return {"clamp_bound": lambda token_num_upper_bound, extra: token_num_upper_bound}


@defect("dummy-leak-on-failure", upstream="TensorRT-LLM PR #17162 (add_dummy_requests leaked the sequences "
        "registered before a failing one; estimation hung)",
        story="a warmup batch that did not fit left its earlier dummies allocated",
        catchers=("suites/managers/test_field_defects.py::test_failed_dummy_batch_leaves_no_dummy",
                  "pytest_kvcm/contract/test_target_lifecycle.py::test_refused_batch_allocation_leaves_nothing_allocated"))
def dummy_leak_on_failure():
    return {"dummies_released_when_refused": "last", "dummies_released_when_raised": "last"}


@defect("v2-max-tokens-capped-by-estimation", upstream="TensorRT-LLM PR #15881 (PR #15091 wrote the estimation "
        "run's dummy token count into max_tokens for V2 too: the real pool was capped and a DeepSeek-V4 context "
        "server hung at startup)",
        story="the final V2 cache took the estimation warmup's dummy token count as its max_tokens: a pool a "
              "fraction of its budget",
        catchers=("suites/managers/test_field_defects.py::test_final_cache_keeps_its_budget_after_estimation",
                  "suites/engine/test_cache_sizing.py::test_engine_cache_holds_the_tokens_asked_after_estimation"))
def v2_max_tokens_capped_by_estimation():
    """V2's final config takes as max_tokens the estimation run's dummy workload: its largest warmup batch
    (``kvcm.estimation.final_cache_config``)."""
    return {"final_max_tokens_from_estimation": True}
