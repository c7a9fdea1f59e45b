"""An adapter's hook that raises (a user's ``KVCacheTarget``: ``_allocate``, ``_grow``, ``_free``,
``_allocate_prompt``) comes up naming the adapter and the hook, and the base's all-or-none batch stays all or none
(issue 52).

Before, ``allocate_batch`` whose second ``_allocate`` raised kept the first request allocated (only a refusal,
``False``, undid the batch), and the raw exception did not say which adapter's hook it came from.
"""

from __future__ import annotations

import pytest

from kvcm.errors import UserCallbackError
from pytest_kvcm.targets.contract import KVCacheTarget, PoolSpec


class Flaky(KVCacheTarget):
    """Pages per request; ``broken`` names the hook that raises, ``after`` how many calls of it go through first."""

    name = "flaky"

    def __init__(self, spec, broken: str, after: int = 0):
        super().__init__(spec)
        self.page_size, self.total_pages, self.held = spec.page_size, spec.num_pages, {}
        self.broken, self.after = broken, after

    def _fail(self, hook: str) -> None:
        if hook == self.broken:
            if self.after == 0:
                raise KeyError("engine state lost")
            self.after -= 1

    def free_pages(self):
        return self.total_pages - sum(self.held.values())

    def held_pages(self, rid):
        return {"full": self.held[rid]}

    def _allocate(self, rid, n, lookahead):
        self._fail("_allocate")
        self.held[rid] = -(-(n + lookahead) // self.page_size)
        return True

    def _grow(self, rid, have, n, lookahead):
        self._fail("_grow")
        self.held[rid] = -(-(have + n + lookahead) // self.page_size)
        return True

    def _free(self, rid):
        self._fail("_free")
        del self.held[rid]


SPEC = PoolSpec(num_pages=16)


def test_a_batch_whose_second_allocation_raises_frees_the_first():
    target = Flaky(SPEC, "_allocate", after=1)
    with pytest.raises(UserCallbackError, match=r"adapter Flaky, _allocate raised KeyError: 'engine state lost'"):
        target.allocate_batch(["a", "b"], [8, 8])
    assert target.requests == [] and target.held == {} and target.free_pages() == 16


@pytest.mark.parametrize("hook, call", [
    ("_allocate", lambda t: t.allocate("b", 8)),
    ("_grow", lambda t: t.grow("a", 4)),
    ("_free", lambda t: t.free("a")),
])
def test_a_hook_that_raises_is_named_and_the_books_stay(hook, call):
    target = Flaky(SPEC, hook)
    target.broken = None
    target.allocate("a", 8)
    target.broken = hook
    before = (target.requests, {r: target.tokens(r) for r in target.requests})
    with pytest.raises(UserCallbackError, match=rf"adapter Flaky, {hook} raised KeyError") as err:
        call(target)
    assert err.value.callback == f"adapter Flaky, {hook}"
    assert (target.requests, {r: target.tokens(r) for r in target.requests}) == before


def test_a_users_defect_whose_patch_raises_is_a_usage_error_naming_it(pytester):
    """A user's defect (``registry.register(..., patch)``) is code handed in too: a patch that raises part way is a
    usage error naming the defect, and what it had patched is undone (it was an ``INTERNALERROR`` traceback)."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p no:randomly\n")
    pytester.makeconftest('''
import json


def _patch(mp):
    mp.setattr(json, "dumps", None)
    raise ZeroDivisionError("the adapter moved")


def pytest_kvcm_register_defects(registry):
    registry.register("mine", "a story", _patch)
''')
    pytester.makepyfile("def test_ok():\n    pass\n")
    import json

    dumps = json.dumps
    result = pytester.runpytest_inprocess("--kvcm-inject=mine")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "INTERNALERROR" not in text
    assert "--kvcm-inject=mine: the defect's patch raised ZeroDivisionError: the adapter moved" in text
    assert json.dumps is dumps
