"""Retention priorities with token ranges and durations, and rewinding, ported from TensorRT-LLM
``cpp/tests/unit_tests/batch_manager/evictionPolicyTest.cpp`` (``LRUPolicyTest``, ``KvCacheRetentionConfigTest``)
and ``kvCacheManagerTest.cpp`` (block priorities, timed eviction, rewind). Upstream's tests sleep and mock
``getTime``; here the managers take an injected millisecond clock (``set_clock``)."""

from __future__ import annotations

import pytest

import kvcm
from _reuse_steps import add, manager, new_tokens
from kvcm.free_queue import QueuedBlockPool
from kvcm.reuse.retention import KvCacheRetentionConfig as Retention, TokenRangeRetentionConfig as Range


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _timed(mgr) -> Clock:
    clock = Clock()
    mgr.set_clock(clock)
    return clock


# ---- KvCacheRetentionConfigTest -------------------------------------------------------------------------------
@pytest.mark.parametrize("ranges, field", [
    ((Range(0, None, 80), Range(64, 128, 80)), "token_range_retention_configs[0].token_end"),   # invalid EOS
    ((Range(0, 64, 80), Range(30, 128, 80)), "token_range_retention_configs[0].token_end"),     # overlap
])
@pytest.mark.upstream("KvCacheRetentionConfigTest.InitializeTest")
def test_retention_config_initialize_test(ranges, field):
    """``KvCacheRetentionConfigTest.InitializeTest``: an open range before another, and overlapping ranges, are
    refused (a ``ConfigError`` naming the field)."""
    with pytest.raises(kvcm.ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Retention(token_range_retention_configs=ranges)


@pytest.mark.upstream("KvCacheRetentionConfigTest.InitializeTest")
def test_retention_config_range_must_have_a_positive_length():
    """``KvCacheRetentionConfigTest.InitializeTest``: ``TokenRangeRetentionConfig(64, 32, 80)`` is refused."""
    with pytest.raises(kvcm.ConfigError, match="token_end=32"):
        Range(64, 32, 80)


@pytest.mark.parametrize("ranges, block, seq_len, expected", [
    ([(0, 64, 80), (64, 128, 50)], 64, 256, [80, 50, None, None]),
    ([(0, 63, 80), (63, 127, 30)], 32, 127, [80, 80, 30, 30]),
    ([(0, 1, 80), (1, 2, 5)], 32, 128, [80, None, None, None]),
    ([(0, 128, 80)], 256, 192, [80]),
    ([(0, 65, 80), (65, 129, 30)], 64, 192, [80, 80, 30]),
    ([(0, 64, 80), (129, None, 50)], 64, 256, [80, None, None, 50]),
    ([(0, 64, 80), (66, 67, 50)], 64, 256, [80, None, None, None]),
    ([(127, 193, 80)], 64, 256, [None, None, 80, 80]),
    ([(127, 193, 80)], 64, 32, [None]),
    ([(1, None, 80)], 64, 128, [None, 80]),
])
@pytest.mark.upstream("KvCacheRetentionConfigTest.BlockConfigTest")
def test_retention_config_block_config_test(ranges, block, seq_len, expected):
    """``KvCacheRetentionConfigTest.BlockConfigTest``: a block takes the range that holds its first token."""
    cfg = Retention(token_range_retention_configs=tuple(Range(*r) for r in ranges))
    assert [p for p, _ in cfg.per_block(block, seq_len)] == expected


# ---- LRUPolicyTest (one level: the primary pool) ----------------------------------------------------------------
@pytest.mark.upstream("LRUPolicyTest.ReleaseBlockTest")
def test_lru_policy_release_block_test():
    """``LRUPolicyTest.ReleaseBlockTest``: a block released to the front is handed out next; released to the back,
    it is not."""
    pool = QueuedBlockPool(8, 16)
    block = pool.allocate(1)[0]
    assert pool.queue.peek() != block
    pool.release([block], front=True)
    assert pool.queue.peek() == block
    pool.allocate(1)
    pool.release([block])
    assert pool.queue.peek() != block


@pytest.mark.upstream("LRUPolicyTest.LRUTest")
def test_lru_policy_lru_test():
    """``LRUPolicyTest.LRUTest``: blocks 1 and 2 released (2 first) come back after the other six, 2 then 1."""
    pool = QueuedBlockPool(8, 16)
    block1, block2 = pool.allocate(1)[0], pool.allocate(1)[0]
    pool.release([block2])
    pool.release([block1])
    pool.allocate(6)
    assert pool.allocate(1) == [block2] and pool.allocate(1) == [block1]


@pytest.mark.upstream("LRUPolicyTest.PriorityTest")
def test_lru_policy_priority_test():
    """``LRUPolicyTest.PriorityTest`` (the order half): of a priority-80 and a priority-5 block released in that
    order, the priority-5 one is handed out first."""
    pool = QueuedBlockPool(8, 16)
    block1, block2 = pool.allocate(1)[0], pool.allocate(1)[0]
    pool.allocate(6)
    pool.release([block1], [(80, None)])
    pool.release([block2], [(5, None)])
    assert pool.queue.peek() == block2


@pytest.mark.upstream("LRUPolicyTest.TimedBlockTest")
def test_lru_policy_timed_block_test():
    """``LRUPolicyTest.TimedBlockTest``: a priority-80 block with 1 ms keeps 80 until the clock passes its release
    + 1 ms, then falls to 35; of blocks released at t=5 with (80, 3 ms) and (50, 8 ms), the 50 one goes first at t=5
    and the 80 one (fallen to 35) at t=9."""
    pool = QueuedBlockPool(8, 16)
    clock = Clock()
    pool.clock = clock
    block0 = pool.allocate(1)[0]
    pool.release([block0], [(80, 1)])
    assert pool.refresh() == [] and pool.queue.key(block0)[0] == 80
    clock.now = 2
    assert pool.refresh() == [block0] and pool.queue.key(block0)[0] == 35
    block1, block2 = pool.allocate(2)
    pool.allocate(6)
    clock.now = 5
    pool.release([block1], [(80, 3)])
    pool.release([block2], [(50, 8)])
    pool.refresh()
    assert pool.queue.peek() == block2
    clock.now = 9
    pool.refresh()
    assert pool.queue.peek() == block1


# ---- kvCacheManagerTest --------------------------------------------------------------------------------------------
@pytest.mark.upstream("BlockManagerBlockPriorityTest")
def test_block_manager_block_priority_test():
    """``BlockManagerBlockPriorityTest`` (4 blocks): [0..7] with ranges (0, 4, 90) and (4, 8, 10), [8..15] at 35;
    [16..23] at 20 evicts the priority-10 block and one of [8..15]'s; [8..15] then reuses 4 tokens, [0..7] reuses
    its priority-90 block (4 tokens), and [16..23] reuses nothing."""
    mgr = manager("v1", blocks=4)
    add(mgr, 0, list(range(8)), retention_config=Retention(
        token_range_retention_configs=(Range(0, 4, 90), Range(4, 8, 10)), decode_retention_priority=20))
    add(mgr, 1, list(range(8, 16)))
    mgr.free_resources(0)
    mgr.free_resources(1)
    add(mgr, 2, list(range(16, 24)), retention_config=Retention(
        token_range_retention_configs=(Range(0, None, 20),), decode_retention_priority=20))
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(8, 16))) == 4
    mgr.free_resources(3)
    assert mgr.get_num_free_blocks() == 4
    assert add(mgr, 4, list(range(8))) == 4
    assert add(mgr, 5, list(range(16, 24))) == 0


@pytest.mark.upstream("KVCacheManagerTimedEvictionTest")
def test_kv_cache_manager_timed_eviction_test():
    """``KVCacheManagerTimedEvictionTest`` (8 blocks): [0..11] at priority 80 for 10 ms and [12..23] at 50; 50 ms
    later ``refreshBlocks`` drops the first to 35, so a 12-token prompt evicts them and [12..23] still reuses up
    to position 11."""
    mgr = manager("v1")
    clock = _timed(mgr)
    add(mgr, 0, list(range(12)), retention_config=Retention(
        token_range_retention_configs=(Range(0, None, 80, 10),), decode_retention_priority=80))
    mgr.free_resources(0)
    add(mgr, 1, list(range(12, 24)), retention_config=Retention(
        token_range_retention_configs=(Range(0, None, 50),), decode_retention_priority=80))
    mgr.free_resources(1)
    clock.now += 50
    mgr.refresh_blocks()
    add(mgr, 2, [1] * 12)
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(12, 24))) == 11


@pytest.mark.upstream("KVCacheManagerDecodeTimedEvictionTest")
def test_kv_cache_manager_decode_timed_eviction_test():
    """``KVCacheManagerDecodeTimedEvictionTest`` (9 blocks): a request at 50 with three decode tokens, then [0..11]
    whose decode block has priority 100 for 20 ms; after 50 ms that block is back at 35, so an 8-token prompt
    takes the never-used block 8 and block 6 ([8..11]), and [0..11] reuses blocks 4, 5: position 8."""
    mgr = manager("v1", blocks=9)
    clock = _timed(mgr)
    prio50 = Retention(token_range_retention_configs=(Range(0, None, 50),), decode_retention_priority=50)
    add(mgr, 0, [1, 1] + list(range(2, 12)), retention_config=prio50)
    new_tokens(mgr, 0, 0, 0, 0)
    mgr.free_resources(0)
    add(mgr, 1, list(range(12)), retention_config=Retention(decode_retention_priority=100, decode_duration_ms=20))
    new_tokens(mgr, 1, 0, 0, 0)
    assert mgr.block_table(1)[0] == [4, 5, 6, 7]
    mgr.free_resources(1)
    clock.now += 50
    mgr.refresh_blocks()
    add(mgr, 2, [0] * 8)
    assert mgr.block_table(2)[0] == [8, 6]
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(12))) == 8


@pytest.mark.upstream("GetPriorityByBlockId")
def test_get_priority_by_block_id():
    """``GetPriorityByBlockId``: a stored context block reports the request's priority (80); -1 and 9999 report
    the default 35."""
    mgr = manager("v1", blocks=8)
    add(mgr, 0, list(range(8)), retention_config=Retention(
        token_range_retention_configs=(Range(0, None, 80),), decode_retention_priority=80))
    block = mgr.block_table(0)[0][0]
    assert mgr.get_priority_by_block_id(block) == 80
    assert mgr.get_priority_by_block_id(-1) == 35 and mgr.get_priority_by_block_id(9999) == 35


@pytest.mark.upstream("KVCacheManagerEventStreamPriority")
def test_kv_cache_manager_event_stream_priority():
    """``KVCacheManagerEventStreamPriority`` (the priorities its events carry): [0..7] stores its blocks at 50; the
    same tokens without a config keep them at 50; with a range at 10 the reused blocks change to 10."""
    mgr = manager("v1", blocks=8)
    add(mgr, 0, list(range(8)), retention_config=Retention(token_range_retention_configs=(Range(0, None, 50),)))
    blocks = mgr.block_table(0)[0]
    mgr.free_resources(0)
    assert [mgr.get_priority_by_block_id(b) for b in blocks] == [50, 50]
    add(mgr, 1, list(range(8)))
    blocks = mgr.block_table(1)[0]
    mgr.free_resources(1)
    assert [mgr.get_priority_by_block_id(b) for b in blocks] == [50, 50]
    add(mgr, 2, list(range(8)), retention_config=Retention(token_range_retention_configs=(Range(0, None, 10),)))
    assert [mgr.get_priority_by_block_id(b) for b in mgr.block_table(2)[0]] == [10, 10]


@pytest.mark.upstream("KVCacheManagerRewindTokensTest")
def test_kv_cache_manager_rewind_tokens_test():
    """``KVCacheManagerRewindTokensTest`` (reuse off, tpb 64, 80 blocks): a 575-token context holds 9 blocks (71
    free); the 577th token takes a 10th (70); rewinding 4 of 580 tokens gives it back (71); then eight requests each
    take 9, one more for two tokens, and give it back when 2 are rewound. ``removeToken`` releases the block to the
    front of its queue (``releaseLastBlock``), so the next token gets the same block again."""
    mgr = manager("v1", tpb=64, blocks=80, enable_block_reuse=False)
    mgr.begin_context_chunk(7, 0, 575, 575)
    mgr.end_context_chunk(7, 575)
    assert mgr.get_num_free_blocks() == 71
    mgr.add_tokens(7, 1)
    assert mgr.get_num_free_blocks() == 71
    mgr.add_tokens(7, 1)
    assert mgr.get_num_free_blocks() == 70
    tenth = mgr.block_table(7)[0][-1]
    mgr.add_tokens(7, 3)
    mgr.rewind(7, 4)
    assert mgr.get_num_free_blocks() == 71
    mgr.add_tokens(7, 1)
    assert mgr.block_table(7)[0][-1] == tenth
    mgr.free_resources(7)
    assert mgr.get_num_free_blocks() == 80
    free = 80
    for rid in range(8):
        mgr.begin_context_chunk(rid, 0, 575, 575)
        mgr.end_context_chunk(rid, 575)
        free -= 9
        assert mgr.get_num_free_blocks() == free
        mgr.add_tokens(rid, 2)
        assert mgr.get_num_free_blocks() == free - 1
        mgr.rewind(rid, 2)
        assert mgr.get_num_free_blocks() == free
