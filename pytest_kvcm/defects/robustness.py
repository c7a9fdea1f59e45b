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
def dummy_call_keeps_earlier_dummies():
    """The old loop: no checks before placing (each dummy met its values while placed), and only a lack of pages
    released what the call had made."""
    def unchecked(request_ids, token_nums, is_gen, drafts, reserve, max_seq_len):
        ids = list(request_ids)
        nums = [1 + drafts] * len(ids) if token_nums is None else list(token_nums)
        return ids, nums, is_gen, drafts, drafts if reserve is None else reserve

    return {"checked_dummy_call": unchecked, "dummies_released_when_raised": "none"}
