"""V2's host level with ``host_eviction_policy="arc"`` as a manager (``kvcm/eviction/arc.py``, driven by
``kvcm/reuse/host_level.py``): the knob's bad values, V1's refusal, what ARC orders by (arrival and reuse, no
priorities, as vLLM's ARC), a block recomputed after its eviction steering the target, and the books after each
step. The policy's own decisions are compared with vLLM's in ``suites/conformance/test_v2_host_arc.py``."""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

from _observe import check_books
from test_host_level import BLOCK_BYTES, SPEC, TPB, build, counts, once, prompt


def arc(blocks=2, host=2, **cfg):
    return build(blocks=blocks, host=host, host_eviction_policy="arc", **cfg)


@pytest.mark.parametrize("value", ["lfu", "ARC", "", None, 1])
def test_a_bad_host_eviction_policy_is_one_config_error(value):
    with pytest.raises(kvcm.ConfigError) as exc:
        KvCacheConfig(host_eviction_policy=value)
    message = str(exc.value)
    assert "\n" not in message and "host_eviction_policy" in message and repr(value) in message
    assert "'lru'" in message and "'arc'" in message


def test_v1_refuses_arc_for_its_secondary_pool():
    """V1's host tier is TensorRT-LLM's secondary pool, whose queue is its LRUEvictionPolicy: ARC is V2's host
    level's only, so asking V1 for it is refused at construction, not silently ignored."""
    cfg = KvCacheConfig(tokens_per_block=TPB, max_tokens=4 * TPB, dtype="float32", host_cache_size=4 * BLOCK_BYTES,
                        host_eviction_policy="arc")
    with pytest.raises(kvcm.ConfigError, match="host_eviction_policy='arc'.*lru"):
        kvcm.create_kv_cache_manager("v1", SPEC, cfg, max_batch_size=8, max_seq_len=256, device="meta")


def test_arc_orders_by_arrival_not_by_priority():
    """The case LRU keeps a priority-90 block through (``test_host_level.py``): ARC has no priorities (vLLM's
    policy has none), so the block that arrived first on the host is the first it evicts."""
    keep = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, None, 90),))
    survivors = {}
    for policy in ("lru", "arc"):
        mgr = build(blocks=2, host=2, host_eviction_policy=policy)
        once(mgr, 0, prompt(0, 1), retention_config=keep)
        for rid, first in enumerate((1000, 2000, 3000), start=1):
            once(mgr, rid, prompt(first, 1 + (rid == 1)))
        survivors[policy] = sorted(node.tokens[0] for node in mgr._reuse.host_node[0].values())
    assert 0 in survivors["lru"] and 0 not in survivors["arc"], survivors


def _keys(tokens_of):
    return [key[1][0] for key in tokens_of]


def test_a_block_recomputed_after_its_eviction_steers_the_target():
    """A block the host evicted (its key in B1), recomputed and pushed down again while its ghost is still
    remembered, is a ghost hit: T1's target grows (vLLM's ``on_store_miss`` before the store takes its slot), and
    the books hold at every step."""
    mgr = arc(blocks=2, host=2)
    order = mgr._reuse.host_orders[0]
    for rid, first in enumerate((0, 1000, 2000, 3000, 4000)):
        once(mgr, rid, prompt(first, 1))      # each pushes the oldest GPU block down; the host evicts block 0
    assert _keys(order.t1) == [1000, 2000] and _keys(order.b1) == [0] and order.target_t1 == 0
    once(mgr, 5, prompt(0, 1))                # recomputed: no hit left to take
    once(mgr, 6, prompt(5000, 2))             # pushes 4000 and 0 down: 0's ghost is in B1
    assert order.target_t1 == 1 and _keys(order.t1) == [4000, 0]
    assert counts(mgr) == (6, 0, 4)


def test_a_hit_migrates_the_block_up_and_leaves_no_ghost():
    """A match that reaches a host block takes it back to the GPU level: it leaves the host's order as a removal,
    not an eviction, so no ghost steers the target later (vLLM's ``remove`` after a failed store)."""
    mgr = arc(blocks=2, host=2)
    once(mgr, 0, prompt(0, 1))
    once(mgr, 1, prompt(1000, 2))             # block 0 falls to the host
    order = mgr._reuse.host_orders[0]
    assert 0 in _keys(order.t1)
    assert once(mgr, 2, prompt(0, 1, 1)) == TPB
    assert counts(mgr)[1] == 1
    assert 0 not in _keys(order.t1) + _keys(order.t2) + _keys(order.b1) + _keys(order.b2)
    check_books(mgr)


def test_reset_prefix_cache_forgets_arcs_state():
    mgr = arc(blocks=2, host=1)
    for rid, first in enumerate((0, 1000, 2000, 3000)):
        once(mgr, rid, prompt(first, 1))
    order = mgr._reuse.host_orders[0]
    assert len(order) == 1 and list(order.b1)
    assert mgr.reset_prefix_cache()
    assert len(order) == 0 and not order.b1 and order.target_t1 == 0
    check_books(mgr)
