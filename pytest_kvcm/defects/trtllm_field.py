"""TensorRT-LLM's own KV-cache bugs (beyond the seed change), reproduced in kvcm's managers."""

from __future__ import annotations

from ._registry import defect


@defect("v2-clamp-drops-extra", upstream="TensorRT-LLM PR #13935 (get_num_available_tokens clamped the bound "
        "before adding the speculative extra tokens)",
        story="V2's available tokens clamped token_num_upper_bound itself, not bound + E + drafts: a bound that "
              "fits came back E + drafts tokens short",
        catchers=("suites/managers/test_field_defects.py::test_available_tokens_return_a_bound_that_fits",
                  "pytest_kvcm/contract/test_target_available_tokens.py::test_engine_answers_the_bound_when_the_pool_is_larger"))
def v2_clamp_drops_extra(mp):
    from kvcm.manager_v2 import KVCacheManagerV2

    def available(self, *, token_num_upper_bound, batch_size=1, max_num_draft_tokens=0):
        extra = self.num_extra_kv_tokens + max_num_draft_tokens
        result = self._clamp(batch_size, token_num_upper_bound, extra) - extra
        if self.kv_cache_config.max_tokens is not None:
            result = min(result, self.kv_cache_config.max_tokens - extra)
        return max(0, result)

    mp.setattr(KVCacheManagerV2, "get_num_available_tokens", available)


@defect("dummy-leak-on-failure", upstream="TensorRT-LLM PR #17162 (add_dummy_requests leaked the sequences "
        "registered before a failing one; estimation hung)",
        story="a warmup batch that did not fit left its earlier dummies allocated",
        catchers=("suites/managers/test_field_defects.py::test_failed_dummy_batch_leaves_no_dummy",
                  "pytest_kvcm/contract/test_target_lifecycle.py::test_refused_batch_allocation_leaves_nothing_allocated"))
def dummy_leak_on_failure(mp):
    from kvcm.manager import BaseKVCacheManager

    original = BaseKVCacheManager._release_all

    def release_failed_only(self, request_ids, _original=original):
        return _original(self, list(request_ids)[-1:])  # only the dummy that failed; the earlier ones leak

    mp.setattr(BaseKVCacheManager, "_release_all", release_failed_only)


@defect("v2-max-tokens-capped-by-estimation", upstream="TensorRT-LLM PR #15881 (PR #15091 wrote the estimation "
        "run's dummy token count into max_tokens for V2 too: the real pool was capped and a DeepSeek-V4 context "
        "server hung at startup)",
        story="the final V2 cache took the estimation warmup's dummy token count as its max_tokens: a pool a "
              "fraction of its budget",
        catchers=("suites/managers/test_field_defects.py::test_final_cache_keeps_its_budget_after_estimation",
                  "suites/engine/test_cache_sizing.py::test_engine_cache_holds_the_tokens_asked_after_estimation"))
def v2_max_tokens_capped_by_estimation(mp):
    import sys

    import kvcm.estimation
    from kvcm.manager_v2 import KVCacheManagerV2

    original, pending = kvcm.estimation.estimate, {}

    def estimate(make_manager, est_config, *, warm=None):
        described, report = original(make_manager, est_config, warm=warm)
        if report is not None and report.long_token_nums:  # the dummy workload: the largest warmup batch's tokens
            pending["tokens"] = max(t + (s.batch_size - 1) * (1 + s.draft_len)
                                    for s, t in report.long_token_nums.items())
        return described, report

    init = KVCacheManagerV2.__init__

    def capped_init(self, model, kv_cache_config=None, *args, **kw):
        tokens = pending.pop("tokens", None)
        if tokens is not None and kv_cache_config is not None:
            cap = min(tokens, kv_cache_config.max_tokens or tokens)
            kv_cache_config = kv_cache_config.replace(max_tokens=cap)
        init(self, model, kv_cache_config, *args, **kw)

    mp.setattr(KVCacheManagerV2, "__init__", capped_init)
    for module in [m for name, m in sys.modules.items() if name.startswith("kvcm") and m is not None]:
        if getattr(module, "estimate", None) is original:
            mp.setattr(module, "estimate", estimate)
