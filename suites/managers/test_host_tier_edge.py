"""V1's host tier at the edge of a tiny pool, as the exhaustive explorer found it (`suites/managers/exhaustive`,
configuration v1-full+window-tpb2-b4-reuse_copy-ids-r2-h2): an offload whose host block held an ancestor of the
block being evicted dropped that ancestor with its descendants, the evicted block among them, and then deleted
the block's page from the tree a second time (KeyError from the block pool). The shortest sequence, replayed."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec


def _manager():
    spec = ModelSpec((LayerSpec(1, 8, "bfloat16", 4, model_layer=0), LayerSpec(1, 8, "bfloat16", model_layer=1)),
                     name="window-full")
    limits = dict(max_batch_size=8, max_seq_len=32, device="meta")
    pool = dict(tokens_per_block=2, max_tokens=8, enable_block_reuse=True, enable_partial_reuse=True,
                copy_on_partial_reuse=True)
    probe = kvcm.create_kv_cache_manager("v1", spec, KvCacheConfig(**pool), **limits)
    host = 2 * sum(g.bytes_per_block for g in probe.layer_groups)
    return kvcm.create_kv_cache_manager("v1", spec, KvCacheConfig(**pool, host_cache_size=host), **limits)


def _admit(m, rid, prompt):
    n = m.add_sequence(rid, prompt)
    m.begin_context_chunk(rid, n, len(prompt) - n, len(prompt))
    m.end_context_chunk(rid, len(prompt))
    m.append_tokens(rid, [1])


def test_an_offload_into_the_host_block_of_an_ancestor_evicts_cleanly():
    m = _manager()
    _admit(m, "r0", [1, 1, 2])
    _admit(m, "r1", [1, 1, 2, 2])
    m.free_resources("r0")
    history = m.get_history("r1")
    m.begin_generation("r1", 0)
    m.end_generation("r1", history + 2, 0, 0)
    m.append_tokens("r1", [1])
    m.free_resources("r1")
    available = m.get_num_available_tokens(token_num_upper_bound=m.max_seq_len, max_num_draft_tokens=0)
    assert available == 8
    placed = m.add_dummy_requests(["probe"], token_nums=[available], is_gen=True, max_num_draft_tokens=0)
    assert placed is not None and m.get_capacity("probe") >= available
    for g in range(len(m.layer_groups)):
        host = m.get_host_block_counts(g)
        assert host.free + host.reusable == host.total == 2
    m.free_resources("probe")
    assert m.reset_prefix_cache()
    counts = m.get_block_counts()
    assert counts.free == counts.total and counts.in_use == 0


def test_a_block_stored_again_while_its_copy_is_secondary_stays_on_one_tier():
    """Found by the explorer's tier books (``_observe.check_levels``), configuration v1-full-tpb2-b4-reuse_on-ids-r2-h2:
    two requests of one prompt, the first stored and released, its block offloaded, then the second stored the same
    block: kvcm filed the second's GPU page beside the secondary copy, one block on both tiers. Upstream's
    ``storeBlocks`` finds the (secondary) match and traverses it, so the second's page stays its own."""
    from _observe import check_books

    spec = ModelSpec((LayerSpec(1, 8, "bfloat16", model_layer=0),), name="full")
    limits = dict(max_batch_size=8, max_seq_len=32, device="meta")
    pool = dict(tokens_per_block=2, max_tokens=8)
    probe = kvcm.create_kv_cache_manager("v1", spec, KvCacheConfig(**pool), **limits)
    host = 2 * sum(g.bytes_per_block for g in probe.layer_groups)
    m = kvcm.create_kv_cache_manager("v1", spec, KvCacheConfig(**pool, host_cache_size=host), **limits)
    m.add_sequence("r0", [1, 1, 2])
    m.add_sequence("r1", [1, 1, 2])            # no match yet
    for rid in ("r1", "r0"):                  # r1 first: its blocks are stored before r0's context
        m.begin_context_chunk(rid, 0, 3, 3)
        m.end_context_chunk(rid, 3)
        m.append_tokens(rid, [1])
    m.free_resources("r1")
    _admit(m, "r2", [5, 5, 6])                 # pushes r1's cached blocks down to the host tier
    assert m.get_kv_cache_stats().offloaded_blocks >= 1
    m.free_resources("r0")                    # r0 stores [1, 1]: the tree's copy is secondary
    check_books(m)
