"""Reuse statistics and the V2 match, ported from TensorRT-LLM
``tests/unittest/kv_cache_manager_v2_tests/test_kv_cache_stats_behavior.py`` (tpb 4, one layer; the upstream
pools hold 4 blocks of 2 MiB, here 8 or 16 blocks, which no case depends on). Upstream reports the numbers per
iteration and per request; kvcm reports them per request (``get_request_stats``) and summed per manager
(``get_kv_cache_stats``), for the context only (docs/semantics.md 10)."""

from __future__ import annotations

import pytest

from _reuse_steps import add, manager, v4
from kvcm.versions import NAMES as ALL_VERSIONS

BOTH = list(ALL_VERSIONS)


def _stats(mgr, rid):
    s = mgr.get_request_stats(rid)
    return dict(alloc_total=s.alloc_total_blocks, alloc_new=s.alloc_new_blocks, reused=s.reused_blocks,
                missed=s.missed_blocks)


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.upstream("test_context_and_generation_stats_are_reported",
                      "test_v2_generation_alloc_updates_request_metrics_unlike_v1")
def test_context_stats_are_reported(version):
    """``test_context_and_generation_stats_are_reported`` / ``test_v2_generation_alloc_updates_request_metrics_unlike_v1``
    (context part): 8 tokens, cold: alloc_total 2, alloc_new 2, missed 2."""
    mgr = manager(version)
    add(mgr, 1, list(range(8)))
    assert _stats(mgr, 1) == dict(alloc_total=2, alloc_new=2, reused=0, missed=2)
    k = mgr.get_kv_cache_stats()
    assert (k.alloc_total_blocks, k.alloc_new_blocks, k.missed_blocks, k.reused_blocks) == (2, 2, 2, 0)


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.upstream("test_block_reuse_disabled_records_generation_alloc")
def test_block_reuse_disabled_still_counts_the_context(version):
    """``test_block_reuse_disabled_records_generation_alloc`` (context part): reuse off, 8 tokens: alloc_total 2,
    alloc_new 2, missed 2."""
    mgr = manager(version, enable_block_reuse=False)
    add(mgr, 1, list(range(8)))
    assert _stats(mgr, 1) == dict(alloc_total=2, alloc_new=2, reused=0, missed=2)


@pytest.mark.parametrize("partial, expected", [(False, 8), (True, 9)])
@pytest.mark.upstream("test_v2_propagates_partial_reuse_config")
def test_v2_propagates_partial_reuse_config(partial, expected):
    """``test_v2_propagates_partial_reuse_config``: warmup 12 tokens, then 10: prepopulated 8 without partial
    reuse, 9 with it."""
    mgr = manager("v2", enable_partial_reuse=partial)
    add(mgr, 1, list(range(12)))
    mgr.free_resources(1)
    assert mgr.add_sequence(2, list(range(10))) == expected


@pytest.mark.parametrize("version, expected", [
    ("v1", dict(alloc_total=0, alloc_new=0, reused=3, missed=0)),
    ("v2", dict(alloc_total=1, alloc_new=1, reused=3, missed=0)),
])
@pytest.mark.upstream("test_v2_partial_prompt_reuse_classification_matches_v1")
def test_partial_prompt_reuse_classification(version, expected):
    """``test_v2_partial_prompt_reuse_classification_matches_v1``: warmup 12 tokens released, then 10: both
    versions reuse 3 blocks (2 full + 1 partial); V1 takes the partial leaf in place (nothing allocated), "V2
    copies the partially reused block into a private slot" (alloc_total 1, alloc_new 1)."""
    mgr = manager(version)
    add(mgr, 1, list(range(12)))
    mgr.free_resources(1)
    add(mgr, 2, list(range(10)))
    assert _stats(mgr, 2) == expected


@pytest.mark.upstream("test_v2_partial_leaf_reuse_counts_reuse_with_private_copy")
def test_v2_partial_leaf_reuse_counts_reuse_with_private_copy():
    """``test_v2_partial_leaf_reuse_counts_reuse_with_private_copy``: warmup 9 tokens (V2 commits the partial
    block [8] at context end), then 10: prepopulated 9, one token left to compute; alloc_total 1, alloc_new 1,
    reused 3."""
    mgr = manager("v2")
    add(mgr, 201, list(range(9)))
    mgr.free_resources(201)
    assert add(mgr, 202, list(range(10))) == 9
    assert _stats(mgr, 202) == dict(alloc_total=1, alloc_new=1, reused=3, missed=0)


@pytest.mark.upstream("test_swa_context_reuse_stats_skip_stale_prefix_blocks")
def test_v2_swa_context_reuse_skips_stale_prefix_blocks():
    """``test_swa_context_reuse_stats_skip_stale_prefix_blocks``: window 8, 16 tokens twice: prepopulated 15; the
    window needs only the last blocks: reused 2 (1 full + 1 partial), alloc_total 1, alloc_new 1 (the copy)."""
    mgr = manager("v2", blocks=16, window=8)
    add(mgr, 1, list(range(16)))
    mgr.free_resources(1)
    assert add(mgr, 2, list(range(16))) == 15
    assert _stats(mgr, 2) == dict(alloc_total=1, alloc_new=1, reused=2, missed=0)
    assert mgr.block_table(2)[0][:2] == [-1, -1]          # the stale blocks were not taken


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.upstream("test_v2_propagates_partial_reuse_config")
def test_dsv4_reuses_whole_blocks_whatever_partial_reuse_says(partial):
    """TensorRT-LLM ``DeepseekV4CacheManager._supports_partial_reuse = False`` ("full-block reuse stays enabled: a
    whole-block prefix lands on a row boundary for every ratio"), with the numbers of
    ``test_v2_propagates_partial_reuse_config`` scaled to tpb 128: warmup 3 blocks, then 2.5 blocks: 256 either
    way."""
    mgr = v4(enable_partial_reuse=partial)
    add(mgr, 1, list(range(384)))
    mgr.free_resources(1)
    assert not mgr.enable_partial_reuse
    assert add(mgr, 2, list(range(320))) == 256
    s = mgr.get_request_stats(2)
    assert (s.reused_blocks, s.missed_blocks, s.alloc_total_blocks) == (2, 1, 1)


@pytest.mark.parametrize("version", BOTH)
def test_cache_hit_rate_is_reused_over_reused_plus_missed(version):
    """``KvCacheStats.cacheHitRate = reused / (reused + missed)`` (kvCacheManager.cpp ``getKvCacheStats``):
    a cold 12-token request (3 missed) and a repeat of its first 8 tokens plus 4 new (2 reused, 1 missed):
    2 / 6 for the manager, 2 / 3 for the request."""
    mgr = manager(version)
    add(mgr, 1, list(range(12)))
    mgr.free_resources(1)
    add(mgr, 2, list(range(8)) + [90, 91, 92, 93])
    assert mgr.get_kv_cache_stats().cache_hit_rate == pytest.approx(2 / 6)
    assert mgr.get_request_stats(2).cache_hit_rate == pytest.approx(2 / 3)
