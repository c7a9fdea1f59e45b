"""A hybrid model's hit, reconciled over its layer groups, ported from vLLM ``tests/v1/core/test_prefix_caching.py``
``test_prefill_hybrid_model`` (full attention beside sliding windows of two blocks, 16-token blocks; the numbers of
its ``_test_partial_request_hit`` cases "2" to "8") on kvcm's V2, whose hybrid hits follow the same rule (a full
group needs every block of the hit, a sliding group the blocks its window reads at the hit's end).

Upstream evicts a block of one group by taking its hash out of the cached-block map, asks the hit of a request
of the same prompt, checks the hit length and that every group's hit holds exactly that many blocks, then puts
the hash back. kvcm takes the block's page out of that group (``ReuseCache.unset_page``) on a manager built
afresh for each case. Upstream's two sliding groups share one spec and are looked up together; kvcm has one
sliding group of two layers, so cases "6" and "7" are the same case here. Upstream's code: the fixed-point loop
of ``HybridKVCacheCoordinator.find_longest_cache_hit`` and the truncation of every group to the hit after it
(vLLM PR #52828); kvcm's: ``kvcm/reuse/version_rules.py`` ``reconcile`` / ``find_match``.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

BLOCK = 16
FULL, SLIDING = 0, 1
COMMON = [i for i in range(3) for _ in range(BLOCK)]         # three full blocks shared by every request
PROMPT = COMMON + [3] * 5                                     # the requests "1" to "8" of upstream: 53 tokens


def _manager():
    """Full attention first (upstream's group 0), then two sliding layers of a 32-token window (one group)."""
    spec = ModelSpec((LayerSpec(1, 8, "float32", model_layer=0), LayerSpec(1, 8, "float32", 2 * BLOCK, model_layer=1),
                      LayerSpec(1, 8, "float32", 2 * BLOCK, model_layer=2)), name="full-then-sliding")
    probe = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=BLOCK, max_gpu_total_bytes=1 << 30),
                                         max_batch_size=4, max_seq_len=8192, device="meta")
    per_block = [g.bytes_per_block for g in probe.layer_groups]
    cfg = KvCacheConfig(tokens_per_block=BLOCK, max_gpu_total_bytes=21 * sum(per_block), pool_ratio=tuple(per_block),
                        enable_partial_reuse=False)
    mgr = kvcm.create_kv_cache_manager("v2", spec, cfg, max_batch_size=4, max_seq_len=8192, device="meta")
    assert [(g.is_full, g.num_blocks) for g in mgr.layer_groups] == [(True, 21), (False, 21)]
    return mgr


def _run(mgr, rid, tokens) -> int:
    n = mgr.add_sequence(rid, tokens)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def _cached():
    """Upstream's start: request "0" (three blocks and 7 tokens) computed, request "1" hitting its three blocks,
    both freed."""
    mgr = _manager()
    assert _run(mgr, "0", COMMON + [3] * 7) == 0
    assert _run(mgr, "1", PROMPT) == 3 * BLOCK
    mgr.free_resources("0")
    mgr.free_resources("1")
    return mgr


def _evict(mgr, evicted) -> None:
    """Take block ``i``'s page out of group ``g`` for each ``(i, g)``, as upstream pops its hash."""
    cache = mgr._reuse
    node = cache.tree.root(mgr.policy.reuse_scope(None, None))
    path = []
    for i in range(3):
        node = cache.tree.child(node, tuple(COMMON[i * BLOCK:(i + 1) * BLOCK]))
        path.append(node)
    for i, g in evicted:
        assert path[i].pages[g] >= 0 and path[i].refs[g] == 0, (i, g)
        cache.unset_page(path[i], g, free=True)


CASES = {                                    # upstream's request id: (blocks evicted as (block, group), hit blocks)
    "2": ([(0, SLIDING)], 3),                # outside the sliding window: the hit keeps its length
    "3": ([(0, FULL)], 0),                   # the first block of full attention: a total miss
    "4": ([(2, FULL), (2, SLIDING)], 2),     # the last block of every group
    "5": ([(2, FULL)], 2),                   # the last block of full attention
    "6": ([(2, SLIDING)], 2),                # the last block of the sliding window ("7" upstream: its other group)
    "8": ([(2, FULL), (0, SLIDING)], 0),     # full reaches 2 blocks, where the window needs block 0: a miss
}


@pytest.mark.parametrize("case", CASES)
def test_hybrid_hit_is_a_fixed_point_over_the_groups(case):
    """``_test_partial_request_hit``: the hit is the longest length every group can serve at that length, and
    every group's hit holds exactly that many blocks (a sliding group's out-of-window ones as no page)."""
    evicted, hit = CASES[case]
    mgr = _cached()
    _evict(mgr, evicted)
    n = mgr.add_sequence(case, PROMPT)
    assert n == hit * BLOCK, f"case {case}: hit of {n} tokens, upstream's {hit * BLOCK}"
    assert [len(blocks) for blocks in mgr.block_table(case)] == [hit, hit], mgr.block_table(case)
