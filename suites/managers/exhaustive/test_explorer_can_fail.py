"""The explorer can fail, and what it prints replays: with the issue-39 eviction defect put back, a V1 window
configuration reports the RuntimeError, and the plain test it writes fails the same way (and passes once the
defect is gone)."""

from __future__ import annotations

import pytest

import kvcm.policy
from kvcm.errors import OutOfPagesError
from _observe import all_free_after_reset, check_books, observe

from .configs import Config, build
from .search import Explorer
from .replay import replay_text

CFG = Config("v1", "full+window", 2, 4, "on", ids=True, max_states=1500)


def _replayed(text: str):
    scope = {"build": build, "Config": Config, "observe": observe, "check_books": check_books,
             "all_free_after_reset": all_free_after_reset, "pytest": pytest, "OutOfPagesError": OutOfPagesError}
    exec(compile(text, "<explorer violation>", "exec"), scope)
    return next(v for k, v in scope.items() if k.startswith("test_"))


@pytest.mark.exhaustive
def test_a_violation_is_reported_as_a_test_that_replays_it():
    leaves_only = kvcm.policy.DEFAULT.replacing(evict_with_descendants=False)
    with kvcm.policy.applied(leaves_only):
        report = Explorer(CFG).run()
    raised = [v for v in report.violations if v.kind == "raised"]
    assert raised, report.line()
    shortest = min(raised, key=lambda v: len(v.ops))
    assert "RuntimeError" in shortest.message and len(shortest.ops) <= 6, shortest
    test = _replayed(replay_text(CFG, shortest))
    with kvcm.policy.applied(leaves_only), pytest.raises(RuntimeError, match="no cached block can be evicted"):
        test()
    test()                      # the same calls on the fixed manager: nothing raises
