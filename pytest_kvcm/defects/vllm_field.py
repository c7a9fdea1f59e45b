"""vLLM's KV-cache bugs, reproduced in kvcm's managers (same arithmetic, kvcm's names) or in the targets layer."""

from __future__ import annotations

from kvcm.units import ceil_div

from ._registry import defect


@defect("lookahead-not-reserved-in-warmup", upstream="vLLM PR #50531 / #51438 (V2 warmup sized reservations "
        "without the spec-decode lookahead that allocate_slots reserves)",
        story="warmup dummies held no draft slots: warmup never crossed the page boundary real spec-decode "
              "steps cross",
        catchers=("suites/managers/test_field_defects.py::test_warmup_dummies_hold_their_draft_slots",
                  "suites/engine/test_cuda_graph.py::test_warmup_on_a_page_boundary_captures_every_shape"))
def lookahead_not_reserved_in_warmup():
    return {"warmup_draft_reserve": lambda draft_len, kv_reserve_draft_tokens: 0}


@defect("swa-sized-as-global", upstream="vLLM PR #14097 (before it, sliding-window layers of hybrid models were "
        "kept as full attention); tt-xla issue #5727 (the same in a vLLM plugin)",
        story="sliding-window layers got full-attention pools and kept every page",
        catchers=("suites/managers/test_field_defects.py::test_sliding_layers_get_their_own_window_pool",
                  "suites/engine/test_cache_sizing.py::test_sliding_window_model_gets_window_sized_pools",
                  "pytest_kvcm/contract/test_target_sliding_window.py::test_window_pages_follow_the_window"))
def swa_sized_as_global():
    return {"life_cycle": lambda window, sink_tokens, tpb: (None, ceil_div(sink_tokens, tpb))}


@defect("swa-bound-two-batches", upstream="vLLM issue #49878 (the sliding-window bound counted two in-flight "
        "batches: ~40% more KV for Gemma 4 from v0.25.1 to v0.26)",
        story="each request's sliding-window bound charged a second in-flight allowance: sliding pools sized "
              "larger, full-attention capacity lost",
        catchers=("suites/managers/test_field_defects.py::test_sliding_window_bound_is_one_window",
                  "suites/managers/test_field_defects.py::test_token_quota_of_a_hybrid_model",
                  "suites/engine/test_cache_sizing.py::test_sliding_window_model_gets_window_sized_pools"))
def swa_bound_two_batches():
    return {"window_bound_blocks": lambda window, tpb: 2 * ceil_div(window, tpb) + 1}


@defect("swa-admission-counts-full-sequence", upstream="vLLM PR #40946 (fixes #39734: the sliding-window "
        "admission gate budgeted the full sequence, not the window)",
        story="available tokens of a hybrid model counted every sliding-window block of the sequence, as if none "
              "were ever released: long requests refused though they fit",
        catchers=("suites/managers/test_field_defects.py::test_hybrid_available_tokens_count_only_the_window",
                  "pytest_kvcm/contract/test_target_available_tokens.py::test_engine_answer_fits_and_is_the_boundary"))
def swa_admission_counts_full_sequence():
    """The long request's blocks counted as if no sliding block were ever stale: ``ceil(capacity / tpb)``."""
    return {"clamp_skips_stale_pages": False}
