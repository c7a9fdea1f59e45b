"""vLLM's KV-cache bugs, reproduced in kvcm's managers (same arithmetic, kvcm's names) or in the targets layer."""

from __future__ import annotations

import sys

from ._registry import defect


@defect("null-block-not-counted", upstream="vLLM PR #47272 (the startup check compared max_model_len with the "
        "total block count; the null block left the pool one block short: hang at 0 tok/s)",
        story="a pool sized for max_model_len forgot the page every request is denied (vLLM's null block)",
        catchers=("suites/plugin/test_targets.py::test_pool_for_max_model_len_counts_reserved_pages",
                  "pytest_kvcm/contract/test_target_max_model_len.py::test_pool_sized_by_the_rule_serves_max_model_len_beside_a_null_page",
                  "pytest_kvcm/contract/test_target_max_model_len.py::test_max_model_len_request_fits_exactly_when_the_pool_holds_it"))
def null_block_not_counted(mp):
    from pytest_kvcm.targets import contract

    mp.setattr(contract, "pages_for_max_model_len",
               lambda max_model_len, page_size, reserved_pages: contract.ceil_div(max_model_len, page_size))


@defect("lookahead-not-reserved-in-warmup", upstream="vLLM PR #50531 / #51438 (V2 warmup sized reservations "
        "without the spec-decode lookahead that allocate_slots reserves)",
        story="warmup dummies held no draft slots: warmup never crossed the page boundary real spec-decode "
              "steps cross",
        catchers=("suites/managers/test_field_defects.py::test_warmup_dummies_hold_their_draft_slots",
                  "suites/engine/test_cuda_graph.py::test_warmup_on_a_page_boundary_captures_every_shape"))
def lookahead_not_reserved_in_warmup(mp):
    import kvcm.warmup

    original = kvcm.warmup.plan_warmup

    def plan(manager, *, kv_reserve_draft_tokens=None, **kw):
        return original(manager, kv_reserve_draft_tokens=0, **kw)

    for module in [m for name, m in sys.modules.items() if name.startswith("kvcm") and m is not None]:
        if getattr(module, "plan_warmup", None) is original:
            mp.setattr(module, "plan_warmup", plan)


@defect("swa-sized-as-global", upstream="vLLM PR #14097 (before it, sliding-window layers of hybrid models were "
        "kept as full attention); tt-xla issue #5727 (the same in a vLLM plugin)",
        story="sliding-window layers got full-attention pools and kept every page",
        catchers=("suites/managers/test_field_defects.py::test_sliding_layers_get_their_own_window_pool",
                  "suites/engine/test_cache_sizing.py::test_sliding_window_model_gets_window_sized_pools",
                  "pytest_kvcm/contract/test_target_sliding_window.py::test_window_pages_follow_the_window"))
def swa_sized_as_global(mp):
    import dataclasses

    import kvcm.manager
    from kvcm.layer_groups import build_layer_groups

    def as_global(spec, tpb):
        layers = tuple(dataclasses.replace(layer, sliding_window=None) for layer in spec.layers)
        return build_layer_groups(dataclasses.replace(spec, layers=layers), tpb)

    mp.setattr(kvcm.manager, "build_layer_groups", as_global)


@defect("swa-bound-two-batches", upstream="vLLM issue #49878 (the sliding-window bound counted two in-flight "
        "batches: ~40% more KV for Gemma 4 from v0.25.1 to v0.26)",
        story="each request's sliding-window bound charged a second in-flight allowance: sliding pools sized "
              "larger, full-attention capacity lost",
        catchers=("suites/managers/test_field_defects.py::test_sliding_window_bound_is_one_window",
                  "suites/managers/test_field_defects.py::test_token_quota_of_a_hybrid_model",
                  "suites/engine/test_cache_sizing.py::test_sliding_window_model_gets_window_sized_pools"))
def swa_bound_two_batches(mp):
    from kvcm.layer_groups import LayerGroup, ceil_div

    original = LayerGroup.max_window_blocks

    def bound(self, tpb, _original=original):
        return _original(self, tpb) + ceil_div(self.window, tpb)

    mp.setattr(LayerGroup, "max_window_blocks", bound)


@defect("swa-admission-counts-full-sequence", upstream="vLLM PR #40946 (fixes #39734: the sliding-window "
        "admission gate budgeted the full sequence, not the window)",
        story="available tokens of a hybrid model counted every sliding-window block of the sequence, as if none "
              "were ever released: long requests refused though they fit",
        catchers=("suites/managers/test_field_defects.py::test_hybrid_available_tokens_count_only_the_window",
                  "pytest_kvcm/contract/test_target_available_tokens.py::test_engine_answer_fits_and_is_the_boundary"))
def swa_admission_counts_full_sequence(mp):
    from kvcm.layer_groups import ceil_div
    from kvcm.manager_v2 import KVCacheManagerV2

    def clamp(self, batch_size, upper, extra):
        tpb, shorts = self.tokens_per_block, batch_size - 1
        avail = [g.num_blocks - g.blocks_needed(1, 1, tpb) * shorts for g in self.layer_groups]
        if any(a < 1 for a in avail):
            return 0
        fits = lambda c: all(ceil_div(c, tpb) <= a for a in avail)  # noqa: E731  (history ignored)
        if fits(upper):
            return upper
        lo, hi = 0, ceil_div(upper, tpb) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid * tpb) else (lo, mid - 1)
        return lo * tpb

    mp.setattr(KVCacheManagerV2, "_clamp", clamp)
