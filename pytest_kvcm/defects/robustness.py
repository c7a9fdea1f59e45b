"""Bad-input defects kvcm once had: calls that failed part-way and left state behind.

Found by a sweep of malformed inputs over every boundary; the cases that catch them live in
``suites/robustness/`` and the manager state machine's malformed-call rule.
"""

from __future__ import annotations

from ._registry import defect


@defect("dummy-call-keeps-earlier-dummies",
        upstream="kvcm/manager.py add_dummy_requests before 4044276 (released the call's dummies only when one did "
                 "not fit)",
        story="a TypeError or ConfigError on the second dummy of add_dummy_requests left the first one held and "
              "the pool smaller; add_dummy_requests('abc') made three dummies 'a', 'b', 'c'",
        catchers=("suites/robustness/test_bad_manager_calls.py",
                  "suites/managers/test_state_machine.py::test_deepseek_v4_lifecycle_state_machine"))
def dummy_call_keeps_earlier_dummies(mp):
    """The old loop: no checks before placing, and only a lack of pages releases what the call made."""
    from kvcm.manager import BaseKVCacheManager, DummyRequest

    def add_dummy_requests(self, request_ids, token_nums=None, is_gen=False, max_num_draft_tokens=0,
                           kv_reserve_draft_tokens=None):
        request_ids = list(request_ids)
        reserve = max_num_draft_tokens if kv_reserve_draft_tokens is None else kv_reserve_draft_tokens
        made, out = [], []
        for i, rid in enumerate(request_ids):
            token_num = token_nums[i] if token_nums is not None else 1 + max_num_draft_tokens
            self._new_seq(rid)
            made.append(rid)
            if not self._place_dummy(rid, token_num, is_gen, reserve):
                self._release_all(made)
                return None
            prompt_len = token_num - 1 if is_gen else token_num
            out.append(DummyRequest(rid, token_num, prompt_len, is_gen, max_num_draft_tokens, self.get_capacity(rid)))
        return out

    mp.setattr(BaseKVCacheManager, "add_dummy_requests", add_dummy_requests)
