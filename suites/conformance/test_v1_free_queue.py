"""V1's block ids and eviction order, ported from TensorRT-LLM ``cpp/tests/unit_tests/batch_manager/
kvCacheManagerTest.cpp``: upstream's ``LRUEvictionPolicy`` keeps one first-in first-out queue per retention
priority holding empty and cached blocks alike (``evictionPolicy.cpp``), so the ids each request gets and the
blocks an allocation evicts are pinned by its tests; kvcm's V1 pools follow it (``kvcm/free_queue.py``)."""

from __future__ import annotations

import pytest

import kvcm
from _reuse_steps import add, allocated, manager, new_tokens

PROMPT = list(range(9))
SALTED = list(range(100, 109))


def _ids(mgr, rid):
    return mgr.block_table(rid)[0]


@pytest.mark.upstream("BlockManagerReuseTest")
def test_block_manager_reuse_test_ids():
    """``BlockManagerReuseTest``: [0..8] gets 0, 1, 2; the same prompt reuses 0, 1 and gets 3 (released after 3
    of the first round, the free queue's front is 3); then [0..9] reuses 0, 1, 2 and [0..10] reuses 0, 1 and gets
    4 (the duplicate 3 went to the back); [0..4] reuses 0 and gets 5; [0..9, 11] reuses 0, 1, 4 at position 10."""
    mgr = manager("v1")
    assert add(mgr, 0, PROMPT) == 0 and _ids(mgr, 0) == [0, 1, 2]
    new_tokens(mgr, 0, 9, 10)
    mgr.free_resources(0)
    assert add(mgr, 1, PROMPT) == 8 and _ids(mgr, 1) == [0, 1, 3]
    new_tokens(mgr, 1, 9, 10)
    mgr.free_resources(1)
    assert add(mgr, 10, PROMPT + [9]) == 9 and _ids(mgr, 10) == [0, 1, 2]
    assert add(mgr, 11, PROMPT + [9, 10]) == 8 and _ids(mgr, 11) == [0, 1, 4]
    new_tokens(mgr, 11, 10)
    mgr.free_resources(10)
    mgr.free_resources(11)
    assert add(mgr, 2, [0, 1, 2, 3, 4]) == 4 and _ids(mgr, 2) == [0, 5]
    new_tokens(mgr, 2, 5)
    assert add(mgr, 3, list(range(10)) + [11]) == 10 and _ids(mgr, 3) == [0, 1, 4]
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (4, 4)


@pytest.mark.upstream("BlockManagerReuseWithLoraTaskIdTest")
def test_block_manager_reuse_with_lora_task_id_test_ids():
    """``BlockManagerReuseWithLoraTaskIdTest`` (16 blocks): LoRA 0 gets 0, 1, 2, then 0, 1, 3, then 0, 1, 4 and
    0, 1, 2 together; LoRA 1 on the same tokens reuses nothing and gets 5, 6, 7; LoRA 1 with [0..9, 11] reuses
    5, 6, 7 at position 9; LoRA 0 [0..4] reuses 0 and gets 8; no LoRA id reuses nothing and gets 9, 10, 11."""
    mgr = manager("v1", blocks=16)
    assert add(mgr, 0, PROMPT, lora_task_id=0) == 0 and _ids(mgr, 0) == [0, 1, 2]
    new_tokens(mgr, 0, 9, 10)
    mgr.free_resources(0)
    assert add(mgr, 1, PROMPT, lora_task_id=0) == 8 and _ids(mgr, 1) == [0, 1, 3]
    new_tokens(mgr, 1, 9, 10)
    mgr.free_resources(1)
    assert add(mgr, 10, PROMPT, lora_task_id=0) == 8 and _ids(mgr, 10) == [0, 1, 4]
    new_tokens(mgr, 10, 9)
    assert add(mgr, 11, PROMPT + [9], lora_task_id=0) == 9 and _ids(mgr, 11) == [0, 1, 2]
    new_tokens(mgr, 11, 10)
    mgr.free_resources(10)
    mgr.free_resources(11)
    assert add(mgr, 2, PROMPT, lora_task_id=1) == 0 and _ids(mgr, 2) == [5, 6, 7]
    new_tokens(mgr, 2, 9)
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(10)) + [11], lora_task_id=1) == 9 and _ids(mgr, 3) == [5, 6, 7]
    new_tokens(mgr, 3, 11)
    mgr.free_resources(3)
    assert add(mgr, 4, [0, 1, 2, 3, 4], lora_task_id=0) == 4 and _ids(mgr, 4) == [0, 8]
    new_tokens(mgr, 4, 5)
    mgr.free_resources(4)
    assert add(mgr, 5, PROMPT) == 0 and _ids(mgr, 5) == [9, 10, 11]


@pytest.mark.upstream("BlockManagerReuseWithCacheSaltIdTest")
def test_block_manager_reuse_with_cache_salt_id_test_ids():
    """``BlockManagerReuseWithCacheSaltIdTest`` (16 blocks): no salt gets 0, 1, 2; salt 12345 reuses nothing and
    gets 3, 4, 5; salt 12345 again reuses 3, 4 (position 8) and gets 6; salt 67890 gets 7, 8, 9; no salt again
    reuses 0, 1 and gets 10."""
    mgr = manager("v1", blocks=16)
    assert add(mgr, 0, SALTED) == 0 and _ids(mgr, 0) == [0, 1, 2]
    new_tokens(mgr, 0, 3, 4)
    mgr.free_resources(0)
    assert add(mgr, 1, SALTED, cache_salt=12345) == 0 and _ids(mgr, 1) == [3, 4, 5]
    new_tokens(mgr, 1, 3, 4)
    mgr.free_resources(1)
    assert add(mgr, 2, SALTED, cache_salt=12345) == 8 and _ids(mgr, 2) == [3, 4, 6]
    new_tokens(mgr, 2, 3, 4)
    mgr.free_resources(2)
    assert add(mgr, 3, SALTED, cache_salt=67890) == 0 and _ids(mgr, 3) == [7, 8, 9]
    new_tokens(mgr, 3, 5, 6)
    assert add(mgr, 4, SALTED) == 8 and _ids(mgr, 4) == [0, 1, 10]


@pytest.mark.upstream("KVCacheManagerDecodeBlockPriorityTest")
def test_kv_cache_manager_decode_block_priority_test():
    """``KVCacheManagerDecodeBlockPriorityTest`` (8 blocks): request 0 (12 tokens, priority 90, decode 90) takes
    0, 1, 2 and block 3 for its first generated token; request 1 (priority 5, decode 5) takes 4, 5, 6 and 7 (free
    8 -> 5 -> 4 -> 1 -> 0). After both end, a new 12-token prompt evicts 7, 6, 5 (lowest priority, first
    released), so request 0's prompt is matched again up to position 11."""
    mgr = manager("v1")
    frees = [mgr.get_num_free_blocks()]
    for rid, start, prio in ((0, 0, 90), (1, 12, 5)):
        retention = kvcm.KvCacheRetentionConfig(priority=prio, decode_retention_priority=prio)
        add(mgr, rid, list(range(start, start + 12)), retention_config=retention)
        frees.append(mgr.get_num_free_blocks())
        mgr.append_tokens(rid, [0])
        mgr.begin_generation(rid)                           # ``addToken``: the 13th token's block
        frees.append(mgr.get_num_free_blocks())
    assert frees == [8, 5, 4, 1, 0]
    assert _ids(mgr, 0) == [0, 1, 2, 3] and _ids(mgr, 1) == [4, 5, 6, 7]
    mgr.free_resources(0)
    mgr.free_resources(1)
    assert mgr.get_num_free_blocks() == 8
    add(mgr, 2, list(range(24, 36)))
    assert _ids(mgr, 2) == [7, 6, 5]
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(12))) == 11


@pytest.mark.upstream("KVCacheManagerLeafBlockTest")
def test_kv_cache_manager_leaf_block_test():
    """``KVCacheManagerLeafBlockTest`` (4 blocks): [0..3] plus one generated token holds 0, 1; a new prompt then
    gets block 2 (the front of the queue, not a released one); a 12-token prompt takes 3, 1 and 0; after both
    end, the same 12 tokens reuse up to position 11 with one block free; one more token takes it (0 free) and a
    1-token prompt no longer fits."""
    mgr = manager("v1", blocks=4)
    add(mgr, 0, [0, 1, 2, 3])
    mgr.append_tokens(0, [0])
    mgr.begin_generation(0)
    assert _ids(mgr, 0) == [0, 1]
    mgr.free_resources(0)
    assert add(mgr, 1, [1, 1, 2, 3]) == 0 and _ids(mgr, 1) == [2]
    long = [2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    add(mgr, 2, long)
    assert _ids(mgr, 2) == [3, 1, 0]
    mgr.free_resources(1)
    mgr.free_resources(2)
    assert add(mgr, 3, long) == 11 and mgr.get_num_free_blocks() == 1
    mgr.append_tokens(3, [0])
    mgr.begin_generation(3)
    assert mgr.get_num_free_blocks() == 0
    mgr.add_sequence(4, [42])
    with pytest.raises(kvcm.OutOfPagesError):
        mgr.begin_context_chunk(4, 0, 1, 1)


def test_cached_blocks_released_first_go_before_empty_blocks_released_later():
    """One queue for empty and cached blocks (``LRUEvictionPolicy::getFreeBlock`` takes the front, cached or
    not): [0..8] leaves 0, 1 cached and 2 empty behind the never-used 3..7; a request without token ids takes
    3..7 and gives them back; a 3-block request then takes 2, 1, 0, evicting the cached prefix although five empty
    blocks wait behind it, so [0..8] reuses nothing."""
    mgr = manager("v1", blocks=8)
    add(mgr, 0, PROMPT)
    mgr.free_resources(0)
    assert mgr.pools[0].queue.order() == [3, 4, 5, 6, 7, 2, 1, 0]
    mgr.begin_context_chunk("a", 0, 20, 20)
    assert _ids(mgr, "a") == [3, 4, 5, 6, 7]
    mgr.free_resources("a")
    mgr.begin_context_chunk("b", 0, 12, 12)
    assert _ids(mgr, "b") == [2, 1, 0]
    mgr.free_resources("b")
    assert add(mgr, 1, PROMPT) == 0
