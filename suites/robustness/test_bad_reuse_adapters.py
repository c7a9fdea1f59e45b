"""The reuse side of a user's adapter is checked when the session starts, as the required methods are (issue
40.5): one usage error naming the adapter and the hook, before any test runs.

Before, ``supports_reuse = 'no'`` was read as true and 16 reuse tests failed with ``NotImplementedError``;
``_allocate_prompt`` returning a string gave 16 failures like ``assert '0' == 0``; ``reuse_oracle = 'v9'`` ended
in ``KeyError: 'v9'`` inside the state machine.
"""

from __future__ import annotations

import pytest

ADAPTER = '''
from pytest_kvcm.targets.contract import KVCacheTarget


class Mine(KVCacheTarget):
    """Pages per request, and a cache of whole prompt blocks that only answers lookups."""
    supports_reuse = True

    def __init__(self, spec):
        super().__init__(spec)
        self.page_size, self.total_pages, self.held, self.cache = spec.page_size, spec.num_pages, {}, set()

    def free_pages(self):
        return self.total_pages - sum(self.held.values())

    def held_pages(self, rid):
        return {"full": self.held[rid]}

    def _allocate(self, rid, n, lookahead):
        self.held[rid] = -(-(n + lookahead) // self.page_size)
        return True

    def _grow(self, rid, have, n, lookahead):
        self.held[rid] = -(-(have + n + lookahead) // self.page_size)
        return True

    def _free(self, rid):
        del self.held[rid]

    def _allocate_prompt(self, rid, ids):
        self.held[rid] = -(-len(ids) // self.page_size)
        return 0

    def lookup(self, ids):
        return 0

    def cached_pages(self):
        return 0

    def reset_cache(self):
        return not self.held


def pytest_kvcm_register_targets(registry):
    registry["mine"] = type("Bad", (Mine,), BAD)
'''

CASES = [  # (case id, the class body's change, a fragment of the usage error)
    ("supports_reuse_a_string", "{'supports_reuse': 'no'}",
     "adapter Bad, supports_reuse: supports_reuse must be True or False; it is 'no' (str)"),
    ("supports_reuse_an_int", "{'supports_reuse': 1}", "supports_reuse must be True or False; it is 1 (int)"),
    ("reuse_oracle_unknown", "{'reuse_oracle': 'v9'}",
     "adapter Bad, reuse_oracle: reuse_oracle must be one of 'v1', 'v2'"),
    ("allocate_prompt_a_string", "{'_allocate_prompt': lambda s, rid, ids: '0'}",
     "adapter Bad, _allocate_prompt: _allocate_prompt must return an int from 0 to 32 (the prompt tokens reused) "
     "or None (refused, nothing changed); it returned '0' (str)"),
    ("allocate_prompt_the_whole_prompt", "{'_allocate_prompt': lambda s, rid, ids: len(ids)}",
     "_allocate_prompt must return an int from 0 to 32"),
    ("allocate_prompt_refuses_a_fresh_pool", "{'_allocate_prompt': lambda s, rid, ids: None}",
     "adapter Bad, _allocate_prompt: refused a prompt of 33 tokens on a fresh pool of 16 pages"),
    ("reuse_methods_missing", "{'lookup': __import__('pytest_kvcm.targets.contract').targets.contract"
                              ".KVCacheTarget.lookup}",
     "adapter Bad, lookup: lookup not implemented (supports_reuse = True needs _allocate_prompt, lookup, "
     "cached_pages, reset_cache)"),
    ("lookup_none", "{'lookup': lambda s, ids: None}", "adapter Bad, lookup: lookup must return an int"),
    ("cached_pages_a_float", "{'cached_pages': lambda s: 0.0}", "cached_pages must return an int"),
    ("reset_cache_none", "{'reset_cache': lambda s: None}", "adapter Bad, reset_cache: reset_cache must return a bool"),
]


@pytest.mark.parametrize("bad, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_reuse_side_is_one_usage_error_before_any_test(pytester, bad, fragment):
    pytester.makeconftest(ADAPTER.replace("BAD", bad))
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--kvcm-target=mine", "--pyargs",
                                          "pytest_kvcm.contract.test_target_reuse")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert fragment in text, text
    assert "Traceback" not in text and "INTERNALERROR" not in text and " passed" not in text and " failed" not in text


def test_a_good_reuse_side_passes_the_check(pytester):
    pytester.makeconftest(ADAPTER.replace("BAD", "{}"))
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--kvcm-target=mine", "--collect-only", "-q",
                                          "--pyargs", "pytest_kvcm.contract.test_target_reuse")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
