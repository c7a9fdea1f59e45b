"""Reuse scopes and blocks a sleeping request holds, ported from TensorRT-LLM
``tests/unittest/kv_cache_manager_v2_tests/test_kv_cache_salting.py`` (``TestReuseScope``) and
``test_nvbug_6625710.py`` (blocks detached under a live request, TensorRT-LLM #17926 / PR #18095), on V1 and V2.

Upstream checks the scope on the radix tree's keys (``sequence_to_blockchain_keys``) and the tree's ``match``;
kvcm files each scope under its own root, so the same numbers are asked of a manager's match (tokens per block
2, as upstream). The nvbug test holds an SSM snapshot's block through a suspended request; kvcm has no SSM
layers and no suspension, so its attention analogue is ported: a request that holds a cached prefix (the eviction
order's oldest entry) while a hundred requests churn the pool.
"""

from __future__ import annotations

import pytest

from _reuse_steps import add, manager, new_tokens
from kvcm.versions import NAMES as ALL_VERSIONS

BOTH = list(ALL_VERSIONS)
# TestReuseScope.test_reuse_scope_seeds_distinct_keys: None and 0 are different scopes for each field
SCOPES = [(None, None), (0, None), (None, 0), (0, 0), (7, 11)]


def _scope(s):
    return dict(lora_task_id=s[0], cache_salt=s[1])


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.parametrize("cached", range(len(SCOPES)))
@pytest.mark.upstream("test_reuse_scope_seeds_distinct_keys")
def test_reuse_scopes_seed_distinct_keys(version, cached):
    """``test_reuse_scope_seeds_distinct_keys``: tokens [1, 2] cached under one of ReuseScope(), lora_id=0,
    salt=0, (0, 0), (7, 11) are found under that scope alone (the five roots are distinct)."""
    mgr = manager(version, tpb=2, blocks=16)
    add(mgr, 0, [1, 2, 3], **_scope(SCOPES[cached]))
    mgr.free_resources(0)
    hits = [mgr.count_reusable_blocks([1, 2, 3], only_allocated=False, **_scope(s)) for s in SCOPES]
    assert hits == [int(i == cached) for i in range(len(SCOPES))]


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.upstream("test_radix_tree_match_is_scoped")
def test_radix_tree_match_is_scoped(version):
    """``test_radix_tree_match_is_scoped``: [1, 2] under (lora 7, salt 11) matches 2 tokens there; under salt 12
    nothing, and nothing with a partial match of its first token either."""
    mgr = manager(version, tpb=2, blocks=16, enable_partial_reuse=True)
    scope, other = dict(lora_task_id=7, cache_salt=11), dict(lora_task_id=7, cache_salt=12)
    add(mgr, 0, [1, 2, 3], **scope)
    mgr.free_resources(0)
    assert mgr.count_reusable_blocks([1, 2, 9], only_allocated=False, **other) == 0
    assert add(mgr, 1, [1, 8], **other) == 0           # the partial match of [1] is scoped as well
    assert add(mgr, 2, [1, 2, 9], **dict(other, cache_salt=13)) == 0
    assert add(mgr, 3, [1, 2, 9], **scope) == 2


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.upstream("test_nvbug_6625710")
def test_churn_never_detaches_blocks_a_live_request_holds(version):
    """``test_nvbug_6625710`` (attention analogue; TOKENS_PER_BLOCK 32, PROMPT_BLOCKS 2, CHURN_REQUESTS 100, four
    blocks a churn request): request A holds a two-block cached prefix whose tail is the eviction order's oldest
    entry; a hundred requests commit four fresh blocks each and close, so the pool must reclaim cached blocks
    over and over. A's blocks stay in the tree (a probe still reuses the whole prefix less its last token) and A
    commits its next block on top of them."""
    tpb = 32
    mgr = manager(version, tpb=tpb, blocks=8)
    prompt = list(range(2 * tpb))
    if version == "v1":                               # V1 caches what was computed: the prefix's KV ends on a block
        add(mgr, "warm", prompt[:-1])
        new_tokens(mgr, "warm", prompt[-1], 10**6)
    else:                                             # V2 commits the prompt's blocks
        add(mgr, "warm", prompt)
    mgr.free_resources("warm")
    assert add(mgr, "a", prompt + [10**6]) == 2 * tpb if version == "v1" else add(mgr, "a", prompt) == 2 * tpb - 1
    held = mgr.block_table("a")[0][:2]
    token = iter(range(10**5, 10**6))
    for i in range(100):
        add(mgr, ("churn", i), [next(token) for _ in range(4 * tpb)])
        assert not set(held) & set(mgr.block_table(("churn", i))[0]), f"churn request {i} got a page A holds"
        mgr.free_resources(("churn", i))
    assert mgr.count_reusable_blocks(prompt + [1]) == 2      # A still holds both blocks of the prefix
    new_tokens(mgr, "a", *range(10**6 + 1, 10**6 + 1 + tpb))   # A goes on generating a block on top of them
    assert mgr.block_table("a")[0][:2] == held
