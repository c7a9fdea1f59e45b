"""TensorRT-LLM's own KV-cache bugs (beyond the seed change), reproduced in kvcm's managers."""

from __future__ import annotations

from ._registry import defect


@defect("v2-clamp-drops-extra", upstream="TensorRT-LLM PR #13935 (get_num_available_tokens clamped the bound "
        "before adding the speculative extra tokens)",
        story="V2's available tokens clamped token_num_upper_bound itself, not bound + E + drafts: a bound that "
              "fits came back E + drafts tokens short",
        catchers=("suites/managers/test_field_defects.py::test_available_tokens_return_a_bound_that_fits",
                  "suites/contract/test_available_tokens.py::test_engine_answers_the_bound_when_the_pool_is_larger"))
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
                  "suites/contract/test_lifecycle.py::test_refused_batch_allocation_leaves_nothing_allocated"))
def dummy_leak_on_failure(mp):
    from kvcm.manager import BaseKVCacheManager

    original = BaseKVCacheManager._release_all

    def release_failed_only(self, request_ids, _original=original):
        return _original(self, list(request_ids)[-1:])  # only the dummy that failed; the earlier ones leak

    mp.setattr(BaseKVCacheManager, "_release_all", release_failed_only)
