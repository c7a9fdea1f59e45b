"""V2's host level as a manager (``kvcm/reuse/host_level.py``): the KV bytes survive a fall to host memory and the
migration back, a page being migrated is never the host's victim, a dropped full-attention block takes its
descendants, a block is on one level at a time, priorities hold on the host, and a refused match changes nothing.
Every case ends with the books of ``check_books`` (each level's counts, one level a block)."""

from __future__ import annotations

import pytest
import torch

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

from _observe import check_books, observe

SPEC = ModelSpec((LayerSpec(1, 64, "float32", None, model_layer=0),), name="one-layer")
BLOCK_BYTES = 4 * 2 * 64 * 4        # tpb 4, K and V, 64 dims, fp32
TPB = 4


def build(blocks=4, host=4, device="meta", **cfg):
    config = KvCacheConfig(tokens_per_block=TPB, max_tokens=blocks * TPB, dtype="float32",
                           host_cache_size=host * BLOCK_BYTES if host else None, **cfg)
    mgr = kvcm.create_kv_cache_manager("v2", SPEC, config, max_batch_size=8, max_seq_len=256, device=device)
    assert mgr.get_host_block_counts().total == host
    return mgr


def run(mgr, rid, tokens, **kw):
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def once(mgr, rid, tokens, **kw):
    n = run(mgr, rid, tokens, **kw)
    mgr.free_resources(rid)
    check_books(mgr)
    return n


def prompt(first, blocks, extra=0):
    return list(range(first, first + blocks * TPB + extra))


def counts(mgr):
    s = mgr.get_kv_cache_stats()
    return s.offloaded_blocks, s.onboarded_blocks, s.host_dropped_blocks


def test_kv_falls_to_host_memory_and_comes_back_byte_for_byte():
    """A block written on the GPU pool (here the CPU pool), pushed down to the host level and migrated back by a
    hit, holds the same bytes (TRT #8813: other prompts' tokens came back with host_cache_size)."""
    mgr = build(blocks=2, host=2, device="cpu")
    run(mgr, 0, prompt(0, 1))
    page = mgr.block_table(0)[0][0]
    written = torch.arange(BLOCK_BYTES, dtype=torch.int64).remainder(251).to(torch.uint8)
    mgr.pools[0].storage[page].copy_(written)
    mgr.free_resources(0)
    once(mgr, 1, prompt(1000, 2))               # both GPU pages: the written block falls to the host
    assert counts(mgr)[0] == 1
    mgr.pools[0].storage.zero_()
    assert run(mgr, 2, prompt(0, 1, 1)) == TPB
    back = mgr.block_table(2)[0][0]
    assert torch.equal(mgr.pools[0].storage[back], written) and counts(mgr)[1] == 1
    check_books(mgr)


def test_a_page_being_migrated_back_is_never_the_hosts_victim():
    """The GPU slot a migration needs pushes another page down, and the full host then needs room: the page being
    migrated is out of the host's eviction (``batched_lock_to_gpu``), so the fallen page is dropped instead and the
    hit is served (SGLang PR #27631: a re-entrant evict_host freed pages being loaded)."""
    mgr = build(blocks=2, host=1)
    once(mgr, 0, prompt(0, 1))
    once(mgr, 1, prompt(1000, 2))               # the first block falls to the only host page
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(0, 1, 0, 1)
    assert mgr.add_sequence(2, prompt(0, 1, 1)) == TPB
    assert counts(mgr) == (1, 1, 0)             # migrated back; the page it pushed down had no room and left
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(1, 0, 0, 1)
    check_books(mgr)


def test_a_dropped_full_attention_block_takes_its_descendants_from_the_host():
    """Both blocks of a prompt on the host, the first at priority 10: the host, needing room, drops it first, and
    its child goes with it (``remove_subtree``): no unreachable block keeps a host page."""
    mgr = build(blocks=2, host=2)
    low = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, 4, 10),
                                                                TokenRangeRetentionConfig(4, None, 35)))
    once(mgr, 0, prompt(0, 2), retention_config=low)
    once(mgr, 1, prompt(1000, 2))               # both fall: the child first (a leaf), then the parent
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(0, 2, 0, 2)
    once(mgr, 2, prompt(2000, 1))               # one more falls: the host evicts the priority-10 parent
    offloaded, _, dropped = counts(mgr)
    assert dropped == 1
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(1, 1, 0, 2)   # the child went with it; one fell in
    rows = mgr._reuse.host_node[0].values()
    assert all(node.tokens[0] >= 1000 for node in rows), [node.tokens for node in rows]


def test_a_block_committed_again_while_its_copy_is_on_the_host_stays_on_one_level():
    """Two requests compute the same prompt; the first commits it, and its blocks fall to the host before the
    second commits: the tree keeps the host copy (one page a block), the second's GPU page stays its own and goes
    free with it."""
    mgr = build(blocks=4, host=4)
    mgr.add_sequence(0, prompt(0, 1, 1))
    mgr.add_sequence(1, prompt(0, 1, 1))        # no match yet: nothing is committed
    mgr.begin_context_chunk(0, 0, 5, 5)
    mgr.end_context_chunk(0, 5)
    mgr.free_resources(0)
    once(mgr, 2, prompt(1000, 4))               # the first prompt's blocks fall to the host
    assert mgr.get_host_block_counts().reusable == 2
    mgr.begin_context_chunk(1, 0, 5, 5)
    mgr.end_context_chunk(1, 5)
    check_books(mgr)
    mgr.free_resources(1)
    check_books(mgr)
    assert mgr.get_block_counts().free == 2     # the second request's two pages, never filed in the tree


def test_the_host_level_evicts_its_lowest_priority_first():
    """A priority-90 block on the host outlives default blocks that fell after it (the page keeps its priority on
    the way down, ``_batched_migrate``)."""
    mgr = build(blocks=2, host=2)
    keep = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, None, 90),))
    once(mgr, 0, prompt(0, 1), retention_config=keep)
    once(mgr, 1, prompt(1000, 2))
    once(mgr, 2, prompt(2000, 1))
    once(mgr, 3, prompt(3000, 1))
    once(mgr, 4, prompt(4000, 1))
    assert counts(mgr)[2] == 2
    assert [node.priority for node in mgr._reuse.host_node[0].values()].count(90) == 1
    assert once(mgr, 5, prompt(0, 1, 1)) == TPB


def test_offloads_keep_each_level_counted_once():
    """Each fall moves one block from the GPU's reusable count to the host's evictable one (TensorRT-LLM PR #12834:
    a block counted on both levels, free > max)."""
    mgr = build(blocks=3, host=4)
    once(mgr, 0, prompt(0, 3))
    once(mgr, 1, prompt(1000, 2))
    gpu, host = mgr.get_block_counts(), mgr.get_host_block_counts()
    assert gpu.free + gpu.reusable + gpu.in_use == gpu.total == 3
    assert (gpu.reusable, host.reusable, counts(mgr)[0]) == (3, 2, 2)
    assert mgr.get_level_statistics(1) == kvcm.reuse.stats.LevelStatistics(4, 2, 2)


def test_a_refused_match_changes_no_level():
    """A match whose host pages find no GPU slot raises OutOfPagesError with every count, both levels and the tree
    as they were (``batched_lock_to_gpu``: if migration fails, no locking happens)."""
    mgr = build(blocks=2, host=2)
    once(mgr, 0, prompt(0, 2))
    run(mgr, 1, prompt(1000, 2))                # holds both GPU pages; the first prompt is on the host
    before = observe(mgr), mgr.get_host_block_counts(), sorted(mgr._reuse.host_node[0])
    with pytest.raises(kvcm.OutOfPagesError):
        mgr.add_sequence(2, prompt(0, 2, 1))
    assert (observe(mgr), mgr.get_host_block_counts(), sorted(mgr._reuse.host_node[0])) == before
    check_books(mgr)


def test_reset_prefix_cache_empties_the_host_level():
    mgr = build(blocks=2, host=2)
    once(mgr, 0, prompt(0, 2))
    once(mgr, 1, prompt(1000, 2))
    assert mgr.get_host_block_counts().reusable == 2
    assert mgr.reset_prefix_cache()
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(2, 0, 0, 2)
    assert once(mgr, 2, prompt(0, 1, 1)) == 0


def test_host_cache_size_is_split_as_the_gpu_level_and_never_below_one_page():
    """Upstream computes every level's slots from the GPU level's ratio and floors each group at one slot."""
    assert build(blocks=4, host=3).get_host_block_counts().total == 3
    config = KvCacheConfig(tokens_per_block=TPB, max_tokens=16, dtype="float32", host_cache_size=1)
    mgr = kvcm.create_kv_cache_manager("v2", SPEC, config, max_batch_size=8, max_seq_len=256, device="meta")
    assert mgr.get_host_block_counts().total == 1
    assert mgr.get_level_statistics(1).available == 1


@pytest.mark.parametrize("level", [-1, 2, "1", 1.0])
def test_a_level_out_of_range_is_one_config_error(level):
    with pytest.raises(kvcm.ConfigError, match="^level="):
        build().get_level_statistics(level)
