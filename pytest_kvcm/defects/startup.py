"""Engines' start-up checks: bugs in the one decision an engine takes before serving, whether its pool can hold
one request of ``max_model_len`` (kvcm/startup.py; the contract's start-up level)."""

from __future__ import annotations

from ._registry import defect


@defect("startup-null-block-usable", upstream="vLLM PR #47272 (check_enough_kv_cache_memory compared max_model_len "
        "with the total block count; BlockPool keeps one back as the null block; shipped through vllm 0.28.0, "
        "fixed in 0.29.0)",
        story="the start-up check accepted a pool of exactly cdiv(max_model_len, block_size) blocks; the engine "
              "started and hung at 0 tok/s, its longest request one usable block short",
        catchers=("pytest_kvcm/contract/test_target_startup.py::test_kvcm_startup_counts_the_held_back_page",
                  "suites/managers/test_startup_rule.py::test_one_page_short_of_max_model_len_is_refused"))
def startup_null_block_usable():
    return {"startup_usable_pages": lambda num_pages, reserved_pages: num_pages}
