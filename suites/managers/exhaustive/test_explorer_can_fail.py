"""The explorer can fail, and what it prints replays: with the issue-39 eviction defect put back, a V1 window
configuration reports the RuntimeError, and the plain test it writes fails the same way (and passes once the
defect is gone); with the clock read in the middle of a call again (issue 52), a retention configuration reports the
half-done release; with a call in which a user's rule raised no longer undone, the user-rule configuration reports
that too."""

from __future__ import annotations

import pytest

import kvcm.manager_v1
import kvcm.policy
import kvcm.user_rules
from kvcm.errors import OutOfPagesError, UserCallbackError
from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig
from _observe import all_free_after_reset, check_books, observe

from .configs import Config, build
from .failing_rules import SWITCH
from .ops import FailingClock, StepClock
from .search import Explorer
from .replay import replay_text

CFG = Config("v1", "full+window", 2, 4, "on", ids=True, max_states=1500)


def _replayed(text: str):
    scope = {"build": build, "Config": Config, "observe": observe, "check_books": check_books,
             "all_free_after_reset": all_free_after_reset, "pytest": pytest, "OutOfPagesError": OutOfPagesError,
             "UserCallbackError": UserCallbackError, "SWITCH": SWITCH, "FailingClock": FailingClock, "StepClock": StepClock,
             "KvCacheRetentionConfig": KvCacheRetentionConfig, "TokenRangeRetentionConfig": TokenRangeRetentionConfig}
    exec(compile(text, "<explorer violation>", "exec"), scope)
    return next(v for k, v in scope.items() if k.startswith("test_"))


def _shortest_replay(cfg: Config, kind: str, ops: list):
    """The explorer's shortest violation of ``kind`` on ``cfg`` is ``ops``; its replay (returned with its text)
    fails as the search found it."""
    report = Explorer(cfg).run()
    found = [v for v in report.violations if v.kind == kind]
    assert found, report.line()
    shortest = min(found, key=lambda v: len(v.ops))
    assert shortest.ops == ops, shortest
    text = replay_text(cfg, shortest)
    test = _replayed(text)
    with pytest.raises(AssertionError):
        test()
    return test, text


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


@pytest.mark.exhaustive
def test_a_clock_read_in_the_middle_of_a_release_is_reported(monkeypatch):
    """The issue-52 defect: a V1 call that reads the user's clock where a timer needs it, not before its first
    change. A timed request freed with a clock that raises is the shortest sequence, and its replay fails until
    the clock is read first again."""
    cfg = Config("v1", "full", 2, 4, "on", ids=True, retention=True, slots=1, max_states=300)
    read_first = {name: getattr(kvcm.manager_v1.KVCacheManagerV1, name) for name in kvcm.manager_v1.CLOCK_READERS}
    with monkeypatch.context() as m:
        for name, method in read_first.items():
            m.setattr(kvcm.manager_v1.KVCacheManagerV1, name, method.__wrapped__)
        test, text = _shortest_replay(cfg, "clock-changed", [("admit-ret", 0, 0), ("clock-raises?", "free", 0)])
        assert "mgr.free_resources('r0')" in text, text
    test()                      # read first: the failed release changes nothing


@pytest.mark.exhaustive
def test_a_user_rule_failing_in_a_call_that_is_not_undone_is_reported(monkeypatch):
    """Issue 52: a manager whose policy holds a user's rule snapshots each changing call and undoes it when the
    rule raises (kvcm/user_rules.py). Without that, the explorer's shortest finding is a release whose first rule
    raised, and its replay fails until the undo is back."""
    cfg = Config("v2", "full+window", 2, 4, "copy", ids=True, host=2, user_rules=True, max_states=300)
    with monkeypatch.context() as m:
        m.setattr(kvcm.user_rules, "install", lambda manager: None)
        test, text = _shortest_replay(cfg, "rule-changed", [("admit", 0, 0), ("rule-raises@1?", "free", 0)])
        assert "SWITCH.left = 1" in text and "mgr.free_resources('r0')" in text, text
    test()                      # undone: the failed release changes nothing
    assert not Explorer(cfg).run().violations
