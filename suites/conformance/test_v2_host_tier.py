"""V2's host level, ported from TensorRT-LLM's KVCacheManagerV2 tests (``tests/unittest/kv_cache_manager_v2_tests/``):
a page evicted from the GPU falls to the host level, a hit on it migrates it back (an onboard, counted as an
allocation), the host level evicts its own lowest-priority pages to take fallen ones, and each level reports
``StorageStatistics`` (free, evictable, available). Upstream drives its storage with a GPU quota it resizes; here
the GPU level is a few blocks and other prompts push the cached ones down.

The tier-attribution cases come from upstream's storage-tier attribution harness (``_Harness`` over
``KVCacheManager``, beside ``test_kv_cache_tier_attribution.py``; its file name is not in the index kvcm reads)."""

from __future__ import annotations

import pytest

from _reuse_steps import add, manager

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

TPB = 4


def _stats(mgr):
    s = mgr.get_kv_cache_stats()
    return s.offloaded_blocks, s.onboarded_blocks, s.host_dropped_blocks


def _prompt(first: int, blocks: int, extra: int = 0) -> list[int]:
    return list(range(first, first + blocks * TPB + extra))


def _push_down(mgr, rid, first: int, blocks: int) -> None:
    """Another prompt of ``blocks`` blocks runs to its end and is freed: its pages take the GPU level."""
    add(mgr, rid, _prompt(first, blocks))
    mgr.free_resources(rid)


@pytest.mark.upstream("test_storage_manager.py::TestStorageManagerInit::test_gpu_and_host_tiers")
def test_gpu_and_host_tiers():
    """``test_storage_manager.py::TestStorageManagerInit::test_gpu_and_host_tiers``: a GPU and a host tier make two
    cache levels with the same pool groups (here a sliding and a full group, each with its host pages)."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", 8, model_layer=0), LayerSpec(1, 64, "bfloat16", model_layer=1)),
                     name="window-full")
    probe = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=TPB, max_tokens=64),
                                         max_batch_size=4, max_seq_len=256, device="meta")
    gpu_bytes = sum(p.nbytes for p in probe.pools)
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=TPB, max_tokens=64,
                                                                 host_cache_size=gpu_bytes),
                                       max_batch_size=4, max_seq_len=256, device="meta")
    assert len(mgr.pools) == 2
    for g, pool in enumerate(mgr.pools):
        gpu, host = mgr.get_level_statistics(0, g), mgr.get_level_statistics(1, g)
        assert gpu.total == pool.num_blocks and host.total == pool.num_blocks   # same bytes: the same split
        assert host.free == host.available == host.total and host.evictable == 0


@pytest.mark.upstream("test_hits_on_gpu_resident_blocks_are_attributed_to_gpu")
def test_hits_on_gpu_resident_blocks_are_attributed_to_gpu():
    """Tier-attribution harness ``test_hits_on_gpu_resident_blocks_are_attributed_to_gpu``: a 4-block prompt
    committed, then the same prompt and one token more: all 4 blocks reused from the GPU, none from the host, no
    migration."""
    mgr = manager("v2", blocks=16, host_blocks=16)
    _push_down(mgr, 0, 0, 4)
    assert add(mgr, 1, _prompt(0, 4, 1)) == 4 * TPB
    stats = mgr.get_request_stats(1)
    assert stats.reused_blocks == 4 and mgr.get_kv_cache_stats().reused_host_blocks == 0
    assert _stats(mgr) == (0, 0, 0)


@pytest.mark.upstream("test_hits_served_from_host_are_attributed_to_host")
def test_hits_served_from_host_are_attributed_to_host():
    """Tier-attribution harness ``test_hits_served_from_host_are_attributed_to_host``: the committed prompt's pages
    leave a small GPU level for the host; the same prompt again reuses all 4 blocks, at least 3 of them from the
    host, and the blocks migrated back are exactly the ones attributed to the host."""
    mgr = manager("v2", blocks=5, host_blocks=16)
    _push_down(mgr, 0, 0, 4)
    _push_down(mgr, 1, 1000, 4)               # four GPU pages needed: the first prompt's fall to the host
    offloaded, onboarded, _ = _stats(mgr)
    assert offloaded >= 3 and onboarded == 0
    assert add(mgr, 2, _prompt(0, 4, 1)) == 4 * TPB
    s = mgr.get_kv_cache_stats()
    assert mgr.get_request_stats(2).reused_blocks == 4 and s.reused_host_blocks >= 3
    assert s.onboarded_blocks == s.reused_host_blocks


@pytest.mark.upstream("test_hits_served_from_host_are_attributed_to_host")
def test_hits_served_from_a_full_host_are_attributed_to_host():
    """Tier-attribution harness ``test_hits_served_from_host_are_attributed_to_host``, with a host level exactly the
    prompt's size: the GPU slots the migration needs push other pages down into a full host, which must make room
    from pages other than the ones being migrated (``batched_lock_to_gpu`` excludes them from eviction first)."""
    mgr = manager("v2", blocks=5, host_blocks=4)
    _push_down(mgr, 0, 0, 4)
    _push_down(mgr, 1, 1000, 5)               # all four cached blocks fall; the host is full
    assert mgr.get_level_statistics(1).free == 0
    assert add(mgr, 2, _prompt(0, 4, 1)) == 4 * TPB
    s = mgr.get_kv_cache_stats()
    assert mgr.get_request_stats(2).reused_blocks == 4 and s.reused_host_blocks == s.onboarded_blocks == 4


@pytest.mark.upstream("test_kv_cache_tier_attribution.py::test_setup_for_reuse_mixed_tiers_single_lifecycle")
def test_setup_for_reuse_mixed_tiers_single_lifecycle():
    """``test_kv_cache_tier_attribution.py::test_setup_for_reuse_mixed_tiers_single_lifecycle``: a match whose
    blocks are partly on the GPU and partly on the host reuses them all and attributes each to its level (the
    host ones are the ones migrated)."""
    mgr = manager("v2", blocks=4, host_blocks=4)
    _push_down(mgr, 0, 0, 3)                  # 3 pages cached, 1 free
    _push_down(mgr, 1, 1000, 2)               # takes the free page and evicts the deepest cached block
    assert mgr.get_level_statistics(1).evictable == 1
    assert add(mgr, 2, _prompt(0, 3, 1)) == 3 * TPB
    s = mgr.get_kv_cache_stats()
    assert mgr.get_request_stats(2).reused_blocks == 3
    assert (s.reused_host_blocks, s.onboarded_blocks) == (1, 1)


@pytest.mark.upstream("test_kv_cache_tier_attribution.py::test_setup_for_reuse_sliding_window_stale_range")
def test_setup_for_reuse_sliding_window_stale_range():
    """``test_kv_cache_tier_attribution.py::test_setup_for_reuse_sliding_window_stale_range``: in a sliding window
    the matched blocks before the window are reused without being loaded, so stale blocks on the host are not
    migrated back; only the window's block is."""
    mgr = manager("v2", blocks=4, host_blocks=16, window=TPB)
    _push_down(mgr, 0, 0, 3)
    for rid in range(1, 16):                             # other prompts until the first one's 3 blocks are down
        if mgr.get_level_statistics(1).evictable >= 3:
            break
        _push_down(mgr, rid, 1000 * rid, 3)
    assert mgr.get_level_statistics(1).evictable >= 3, "evicted blocks never reached the host level"
    onboarded = _stats(mgr)[1]
    assert add(mgr, "hit", _prompt(0, 3, 1)) == 3 * TPB
    assert _stats(mgr)[1] - onboarded == 1               # block 2; blocks 0 and 1 are before the window
    assert mgr.block_table("hit")[0][:2] == [-1, -1]


@pytest.mark.upstream("test_kv_cache_stats_life_cycles.py::test_offload_is_recorded_for_every_life_cycle")
def test_offload_is_recorded_for_every_life_cycle():
    """``test_kv_cache_stats_life_cycles.py::test_offload_is_recorded_for_every_life_cycle`` (attention): a page
    migrated from the GPU to the host level is one offloaded block."""
    mgr = manager("v2", blocks=3, host_blocks=4)
    _push_down(mgr, 0, 0, 2)
    assert _stats(mgr) == (0, 0, 0)
    _push_down(mgr, 1, 1000, 2)               # one free page, one eviction
    assert _stats(mgr) == (1, 0, 0)
    assert mgr.get_host_block_counts() == kvcm.BlockCounts(3, 1, 0, 4)
    gpu = mgr.get_block_counts()              # it left the GPU level: 3 pages, each counted once
    assert (gpu.free, gpu.reusable, gpu.in_use) == (0, 3, 0)


@pytest.mark.upstream("test_kv_cache_stats_life_cycles.py::test_host_drop_is_recorded_for_every_life_cycle")
def test_host_drop_is_recorded_for_every_life_cycle():
    """``test_kv_cache_stats_life_cycles.py::test_host_drop_is_recorded_for_every_life_cycle``: the host level,
    full, evicts its own least recently arrived page to take a fallen one: one host-dropped block, and the
    dropped block is no longer found."""
    mgr = manager("v2", blocks=2, host_blocks=1)
    _push_down(mgr, 0, 0, 1)
    _push_down(mgr, 1, 1000, 2)               # the first block falls to the host
    assert _stats(mgr) == (1, 0, 0)
    _push_down(mgr, 2, 2000, 2)               # two more fall: the host drops the first and keeps the later one
    offloaded, _, dropped = _stats(mgr)
    assert dropped == 1 and offloaded == 2
    assert mgr.add_sequence(3, _prompt(0, 1, 1)) == 0


@pytest.mark.upstream("test_kv_cache_stats_life_cycles.py::test_onboard_counts_globally_only_for_attention")
def test_onboard_counts_globally_only_for_attention():
    """``test_kv_cache_stats_life_cycles.py::test_onboard_counts_globally_only_for_attention`` (attention): a page
    migrated back from the host is an allocation, in alloc_total and alloc_new, beside the reuse it serves."""
    mgr = manager("v2", blocks=3, host_blocks=4)
    _push_down(mgr, 0, 0, 2)
    _push_down(mgr, 1, 1000, 3)               # both cached blocks fall to the host
    before = mgr.get_kv_cache_stats()
    mgr.add_sequence(2, _prompt(0, 1, 1))     # one host block matched, one block missed
    stats = mgr.get_request_stats(2)
    assert (stats.reused_blocks, stats.missed_blocks) == (1, 1)
    assert mgr.get_kv_cache_stats().onboarded_blocks - before.onboarded_blocks == 1
    # the missed block evicted a cached page (not new, as V1 counts it); the migrated one is new
    assert (stats.alloc_total_blocks, stats.alloc_new_blocks) == (2, 1)


@pytest.mark.upstream("test_storage_manager.py::TestSlotAllocatorOffset::test_recycled_slot_preserves_offset_slot_id")
def test_recycled_slot_preserves_offset_slot_id():
    """``test_storage_manager.py::TestSlotAllocatorOffset::test_recycled_slot_preserves_offset_slot_id``: a host
    slot given back (here by a migration back to the GPU) is handed out again before any never-used slot
    (``SlotAllocator.allocate``: ready recycled slots, then new ones)."""
    mgr = manager("v2", blocks=3, host_blocks=4)
    _push_down(mgr, 0, 0, 2)
    _push_down(mgr, 1, 1000, 2)               # the first prompt's deepest block falls to host slot 0
    host = mgr._reuse.host[0]
    assert sorted(mgr._reuse.host_node[0]) == [0] and host.free_order() == [1, 2, 3]
    first = mgr._reuse.host_node[0][0]
    # the same prompt again: the block migrates back, whose GPU page pushes another block down (to fresh slot 1,
    # slot 0 still being read); the context's last page pushes one more, which takes recycled slot 0, not slot 2
    add(mgr, 2, _prompt(0, 2, 1))
    assert sorted(mgr._reuse.host_node[0]) == [0, 1] and mgr._reuse.host_node[0][0] is not first
    assert host.free_order() == [2, 3]


@pytest.mark.upstream("test_block_radix_tree_stale_prune.py::TestStaleTailPrune::test_tip_with_no_live_page_anywhere_is_pruned")
def test_tip_with_no_live_page_anywhere_is_pruned():
    """``test_block_radix_tree_stale_prune.py::TestStaleTailPrune::test_tip_with_no_live_page_anywhere_is_pruned``,
    on the full-attention branch its note names (``clear_stale_blocks_after_page_unlink`` -> ``remove_subtree`` for
    full attention): the host level drops a block whose child is on the host too; the child goes with it and the
    chain, with no page anywhere, leaves the tree."""
    from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

    mgr = manager("v2", blocks=2, host_blocks=2)
    low = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, TPB, 10),
                                                                TokenRangeRetentionConfig(TPB, None, 35)))
    add(mgr, 0, _prompt(0, 2), retention_config=low)
    mgr.free_resources(0)
    _push_down(mgr, 1, 1000, 2)               # both fall, the child first
    _push_down(mgr, 2, 2000, 1)               # the host drops the priority-10 parent, and its child with it
    root = mgr._reuse.tree.root((None, None))
    assert all(node.tokens[0] >= 1000 for node in root.children.values())
    assert mgr.get_level_statistics(1) == kvcm.reuse.stats.LevelStatistics(2, 1, 1)


def test_an_offloaded_page_keeps_its_priority_on_the_host_level():
    """Source, no upstream test: ``_storage_manager.py`` ``_batched_migrate`` moves the page (its ``_priority``
    with it) and ``schedule_for_eviction`` files it under that priority at the host level, whose
    ``PrioritizedLRUEvictionPolicy`` evicts the lowest first: a priority-90 block that fell first outlives a
    default one that fell after it, once the host needs room."""
    from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

    mgr = manager("v2", blocks=2, host_blocks=2)
    keep = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, None, 90),))
    add(mgr, 0, _prompt(0, 1), retention_config=keep)
    mgr.free_resources(0)
    _push_down(mgr, 1, 1000, 2)               # the kept block falls first
    _push_down(mgr, 2, 2000, 1)               # a default block falls after it: the host is full
    _push_down(mgr, 3, 3000, 1)               # one more falls: the host drops its default block, not the kept one
    assert _stats(mgr)[2] == 1
    assert add(mgr, 4, _prompt(0, 1, 1)) == TPB


def test_a_block_holds_one_page_whatever_its_level():
    """Source, no upstream test: ``_block_radix_tree.py`` ``Block.storage`` holds one page a life cycle and
    ``can_replace_page`` lets a page replace it only with more tokens. Two requests compute one prompt; the first
    commits it and its blocks fall to the host; the second commits the same blocks: the tree keeps the host copies
    and the second request's GPU pages go free when it does."""
    mgr = manager("v2", blocks=4, host_blocks=4)
    mgr.add_sequence(0, _prompt(0, 1, 1))
    mgr.add_sequence(1, _prompt(0, 1, 1))     # nothing committed yet: no match
    mgr.begin_context_chunk(0, 0, TPB + 1, TPB + 1)
    mgr.end_context_chunk(0, TPB + 1)
    mgr.free_resources(0)
    _push_down(mgr, 2, 1000, 4)               # the first request's two blocks fall to the host
    mgr.begin_context_chunk(1, 0, TPB + 1, TPB + 1)
    mgr.end_context_chunk(1, TPB + 1)
    mgr.free_resources(1)
    gpu, host = mgr.get_level_statistics(0), mgr.get_level_statistics(1)
    assert (gpu.free, gpu.evictable) == (2, 2)
    assert (host.free, host.evictable) == (0, 4)


def test_a_match_that_cannot_migrate_changes_nothing():
    """Source, no upstream test: ``_page.py`` ``batched_lock_to_gpu`` ('If migration fails, no locking happens')
    prepares every GPU slot before it migrates any page; a match whose host pages find no GPU slot raises with
    every count, level and the tree as they were."""
    mgr = manager("v2", blocks=2, host_blocks=2)
    _push_down(mgr, 0, 0, 2)
    add(mgr, 1, _prompt(1000, 2))             # holds both GPU pages; the first prompt is on the host
    before = (mgr.get_block_counts(), mgr.get_host_block_counts(), mgr.get_kv_cache_stats())
    try:
        mgr.add_sequence(2, _prompt(0, 2, 1))
    except kvcm.OutOfPagesError:
        pass
    else:
        raise AssertionError("a match needing two GPU slots with none free was granted")
    assert (mgr.get_block_counts(), mgr.get_host_block_counts(), mgr.get_kv_cache_stats()) == before
    assert not mgr.has_request(2)
