"""V1's host tier as a manager (``kvcm/reuse/host_tier.py``): the KV bytes survive a trip to host memory and
back, a match that cannot be onboarded changes nothing, and its knobs refuse bad values in one line."""

from __future__ import annotations

import pytest
import torch

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

SPEC = ModelSpec((LayerSpec(1, 64, "float32", None, model_layer=0),), name="one-layer")
BLOCK_BYTES = 4 * 2 * 64 * 4        # tpb 4, K and V, 64 dims, fp32


def build(blocks=4, host=4, device="cpu", version="v1", **cfg):
    config = KvCacheConfig(tokens_per_block=4, max_tokens=blocks * 4, dtype="float32",
                           host_cache_size=host * BLOCK_BYTES if host else None, **cfg)
    return kvcm.create_kv_cache_manager(version, SPEC, config, max_batch_size=8, max_seq_len=256, device=device)


def run(mgr, rid, tokens):
    n = mgr.add_sequence(rid, tokens)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def snapshot(mgr):
    cache = mgr._reuse
    out = [mgr.get_block_counts(0), mgr.get_host_block_counts(0), mgr.get_kv_cache_stats(), sorted(mgr.request_ids)]
    out += [pool.free_order() for pool in mgr.pools + cache.host]
    out.append(sorted((row, id(node)) for row, node in cache.host_node[0].items()))
    return out


def test_offloaded_kv_comes_back_byte_for_byte():
    """A block written on the GPU pool (here the CPU pool), offloaded by an eviction and onboarded by a hit, holds
    the same bytes (TRT #8813: other prompts' tokens came back with host_cache_size)."""
    mgr = build(blocks=3, host=3)
    run(mgr, 0, list(range(9)))
    page = mgr.block_table(0)[0][0]
    kv = mgr.layer_kv(0)
    kv[page].copy_(torch.randn_like(kv[page]))
    written = kv[page].clone()
    mgr.free_resources(0)
    run(mgr, 1, list(range(100, 112)))         # three fresh blocks: the cached ones go to the host tier
    mgr.free_resources(1)
    kv.zero_()
    assert mgr.get_kv_cache_stats().offloaded_blocks >= 1
    assert run(mgr, 2, list(range(9))) == 8
    assert torch.equal(mgr.layer_kv(0)[mgr.block_table(2)[0][0]], written)
    assert mgr.get_kv_cache_stats().onboarded_blocks == 2


def test_a_match_that_cannot_be_onboarded_changes_nothing():
    """All or nothing: a prompt whose host blocks need more GPU pages than are free raises OutOfPagesError with
    every count, both free queues and the host tier as they were."""
    mgr = build(blocks=3, host=3, device="meta")
    run(mgr, 0, list(range(9)))
    mgr.free_resources(0)
    run(mgr, 1, list(range(100, 112)))         # holds every GPU page; [0..7] now waits in the host tier
    before = snapshot(mgr)
    with pytest.raises(kvcm.OutOfPagesError):
        mgr.add_sequence(2, list(range(9)))
    assert snapshot(mgr) == before


def test_reset_prefix_cache_empties_the_host_tier():
    mgr = build(blocks=2, host=2, device="meta")
    run(mgr, 0, list(range(5)))
    mgr.free_resources(0)
    run(mgr, 1, list(range(100, 108)))
    mgr.free_resources(1)
    assert mgr.get_host_block_counts().reusable == 1
    assert mgr.reset_prefix_cache()
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(2, 0, 0, 2) and run(mgr, 2, list(range(5))) == 0


@pytest.mark.parametrize("field, value", [("host_cache_size", -1), ("host_cache_size", 1.5),
                                          ("host_cache_size", 1 << 51), ("onboard_blocks", "yes"),
                                          ("secondary_offload_min_priority", 101),
                                          ("secondary_offload_min_priority", -1)])
def test_bad_tier_knobs_are_one_config_error(field, value):
    with pytest.raises(kvcm.ConfigError, match=f"^{field}="):
        KvCacheConfig(**{field: value})


def test_deepseek_v4_refuses_a_host_tier_it_does_not_model():
    config = KvCacheConfig(tokens_per_block=128, max_tokens=1024, host_cache_size=1 << 20)
    with pytest.raises(kvcm.ConfigError, match="^host_cache_size=1048576 is invalid: must be None or 0 for "
                       "DeepseekV4CacheManager: .*sparse history offload"):
        kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(compress_ratios=(4, 128)), config, max_batch_size=4,
                                    max_seq_len=8192, device="meta")


def test_host_blocks_are_floored_and_never_allocatable():
    """``calculateSecondaryBlocks`` floors (primary blocks round up); the host tier never adds to the free count
    ``get_num_free_blocks`` reports."""
    config = KvCacheConfig(tokens_per_block=4, max_tokens=16, dtype="float32", host_cache_size=3 * BLOCK_BYTES - 1)
    mgr = kvcm.create_kv_cache_manager("v1", SPEC, config, max_batch_size=8, max_seq_len=256, device="meta")
    assert mgr.get_host_block_counts().total == 2 and mgr.get_num_free_blocks() == 4


@pytest.mark.parametrize("priority, offloaded", [(49, 0), (50, 1)])
def test_a_block_at_exactly_the_minimum_priority_is_offloaded(priority, offloaded):
    """``secondary_offload_min_priority=50``: a priority-50 block an eviction takes goes to the host, a 49 one is
    dropped (``getFreeBlock`` tests ``>=``)."""
    mgr = build(blocks=2, host=2, device="meta", secondary_offload_min_priority=50)
    mgr.add_sequence(0, list(range(5)), retention_config=kvcm.KvCacheRetentionConfig(priority=priority))
    mgr.begin_context_chunk(0, 0, 5, 5)
    mgr.end_context_chunk(0, 5)
    mgr.free_resources(0)
    run(mgr, 1, list(range(100, 108)))
    assert mgr.get_kv_cache_stats().offloaded_blocks == offloaded


def test_an_offloaded_block_keeps_its_priority_in_the_host_queue():
    """A priority-80 prefix offloaded first and a 35 one offloaded after it: when the host is full the 35 one is
    dropped, so the 80 prefix is reused from the host later."""
    mgr = build(blocks=2, host=2, device="meta")
    mgr.add_sequence("a", list(range(5)), retention_config=kvcm.KvCacheRetentionConfig(priority=80))
    mgr.begin_context_chunk("a", 0, 5, 5)
    mgr.end_context_chunk("a", 5)
    mgr.free_resources("a")
    for rid, start in (("b", 100), ("c", 200), ("d", 300)):
        run(mgr, rid, list(range(start, start + 5 if rid == "b" else start + 8)))
        mgr.free_resources(rid)
    assert run(mgr, "e", list(range(5))) == 4
    assert mgr.get_kv_cache_stats().reused_host_blocks == 1


def test_offloads_keep_each_tier_counted_once():
    """After every offload and onboard, each tier's free + reusable + in use is its size and the free count never
    passes the pool (PR #12834: free > max, used < 0)."""
    mgr = build(blocks=3, host=2, device="meta")
    for rid, tokens in enumerate([list(range(9)), list(range(100, 112)), list(range(9)), list(range(200, 212))]):
        run(mgr, rid, tokens)
        for counts in (mgr.get_block_counts(0), mgr.get_host_block_counts(0)):
            assert counts.free + counts.reusable + counts.in_use == counts.total and 0 <= counts.free
        assert mgr.get_num_free_blocks() <= 3
        mgr.free_resources(rid)
    assert mgr.get_kv_cache_stats().offloaded_blocks >= 2
