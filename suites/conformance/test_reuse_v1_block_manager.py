"""V1 block reuse, ported from TensorRT-LLM ``cpp/tests/unit_tests/batch_manager/kvCacheManagerTest.cpp``
(``BlockManagerReuseTest``, ``BlockManagerReuseWithLoraTaskIdTest``):
tpb 4, 8 (or 16) primary blocks, one window. Context positions, reused block ids and free / allocated counts carry
over; the ids of fresh blocks are pinned in ``test_v1_free_queue.py`` (V1's pools keep upstream's free queue)."""

from __future__ import annotations

import pytest

from _reuse_steps import add, allocated, manager, new_tokens

PROMPT = list(range(9))


def _reuse_test_prefix(stage: int):
    """``BlockManagerReuseTest`` up to ``stage`` (each stage is one block of the upstream test)."""
    mgr = manager("v1")
    add(mgr, 0, PROMPT)
    new_tokens(mgr, 0, 9, 10)                              # block 2 holds [8, 9] (10 is never stored)
    if stage == 0:
        return mgr
    mgr.free_resources(0)
    add(mgr, 1, PROMPT)
    new_tokens(mgr, 1, 9, 10)
    if stage == 1:
        return mgr
    mgr.free_resources(1)
    add(mgr, 10, PROMPT + [9])
    add(mgr, 11, PROMPT + [9, 10])
    new_tokens(mgr, 11, 10)
    if stage == 2:
        return mgr
    mgr.free_resources(10)
    mgr.free_resources(11)
    return mgr


@pytest.mark.upstream("BlockManagerReuseTest")
def test_first_request_gets_fresh_blocks_and_release_keeps_them_free():
    """``BlockManagerReuseTest`` part 1: [0..8] gets blocks 0, 1, 2 at context position 0; 3 allocated, 5 free;
    after ``releaseBlocks`` 0 allocated and all 8 free (cached blocks count as free)."""
    mgr = _reuse_test_prefix(0)
    assert mgr.get_prepopulated_prompt_len(0) == 0 and mgr.block_table(0)[0] == [0, 1, 2]
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (3, 5)
    mgr.free_resources(0)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (0, 8)


@pytest.mark.upstream("BlockManagerReuseTest")
def test_same_prompt_reuses_two_blocks_and_its_duplicate_is_freed():
    """``BlockManagerReuseTest`` part 2: the same 9 tokens reuse blocks 0, 1 (position 2 * tpb = 8) and get a new
    block; "block 3 matches block 2 and will be freed": after release all 8 free, one copy of [8, 9] cached."""
    mgr = _reuse_test_prefix(1)
    assert mgr.get_prepopulated_prompt_len(1) == 8 and mgr.block_table(1)[0][:2] == [0, 1]
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (3, 5)
    mgr.free_resources(1)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (0, 8)
    assert mgr.get_block_counts(0).reusable == 3


@pytest.mark.upstream("BlockManagerReuseTest")
def test_partial_last_block_is_taken_and_a_concurrent_request_gets_a_new_one():
    """``BlockManagerReuseTest`` part 3: [0..9] reuses 0, 1, 2(p) at position promptLen - 1 = 9; [0..10] at the
    same time reuses 0, 1 (position 8) and a new block: numBlocks + 1 = 4 allocated, 4 free. After both are
    released: 0 allocated, 8 free."""
    mgr = _reuse_test_prefix(2)
    assert mgr.get_prepopulated_prompt_len(10) == 9 and mgr.block_table(10)[0] == [0, 1, 2]
    assert mgr.get_prepopulated_prompt_len(11) == 8 and mgr.block_table(11)[0][:2] == [0, 1]
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (4, 4)
    mgr.free_resources(10)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (3, 5)
    mgr.free_resources(11)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (0, 8)


@pytest.mark.upstream("BlockManagerReuseTest")
def test_shorter_and_longer_prompts_reuse_what_they_share():
    """``BlockManagerReuseTest`` parts 4-5: [0..4] reuses block 0 (position tpb = 4; 2 allocated, 6 free);
    [0..9, 11] reuses 0, 1 and the partial [8, 9] (position numTokens - 1 = 10); one block is shared by both
    requests: 4 allocated, 4 free; all free after release."""
    mgr = _reuse_test_prefix(3)
    assert add(mgr, 2, [0, 1, 2, 3, 4]) == 4 and mgr.block_table(2)[0][0] == 0
    new_tokens(mgr, 2, 5)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (2, 6)
    assert add(mgr, 3, list(range(10)) + [11]) == 10 and mgr.block_table(3)[0][:2] == [0, 1]
    new_tokens(mgr, 3, 11)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (4, 4)
    mgr.free_resources(2)
    mgr.free_resources(3)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (0, 8)


@pytest.mark.upstream("BlockManagerReuseTest")
def test_pool_sized_prompt_reuses_one_token_incidentally():
    """``BlockManagerReuseTest`` part 7: 8 * 4 - 1 = 31 zeros partly match the cached [0, 1, 2, 3] (one token; the
    block has children, so it is copied): position 1, all 8 blocks allocated, 0 free; all free after release."""
    mgr = _reuse_test_prefix(3)
    assert add(mgr, 5, [0] * 31) == 1
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (8, 0)
    mgr.free_resources(5)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (0, 8)


@pytest.mark.upstream("BlockManagerReuseTest")
def test_one_token_prompt_reuses_nothing():
    """``BlockManagerReuseTest`` part 8: a 1-token prompt cannot reuse its last token: position 0, 1 allocated,
    7 free."""
    mgr = _reuse_test_prefix(3)
    assert add(mgr, 6, [0]) == 0
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (1, 7)


@pytest.mark.upstream("BlockManagerReuseWithLoraTaskIdTest")
def test_lora_task_id_scopes_the_cache():
    """``BlockManagerReuseWithLoraTaskIdTest`` (16 blocks): [0..8] cached under LoRA 0; the same tokens under LoRA
    1 reuse nothing (position 0); [0..9, 11] under LoRA 1 then reuses its 0, 1, 2(p) (position promptLen - 2 = 9);
    [0..4] under LoRA 0 reuses block 0 (position 4); the same tokens without a LoRA id reuse nothing."""
    mgr = manager("v1", blocks=16)
    add(mgr, 0, PROMPT, lora_task_id=0)
    new_tokens(mgr, 0, 9, 10)
    mgr.free_resources(0)
    assert add(mgr, 2, PROMPT, lora_task_id=1) == 0
    new_tokens(mgr, 2, 9)
    assert (allocated(mgr), mgr.get_num_free_blocks()) == (3, 13)
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(10)) + [11], lora_task_id=1) == 9
    mgr.free_resources(3)
    assert add(mgr, 4, [0, 1, 2, 3, 4], lora_task_id=0) == 4
    mgr.free_resources(4)
    assert add(mgr, 5, PROMPT) == 0
    assert mgr.get_num_free_blocks() == 16 - 3


@pytest.mark.parametrize("partial, expected", [(False, 8), (True, 9)])
@pytest.mark.upstream("test_kv_cache_stats_behavior.py::test_v2_propagates_partial_reuse_config")
def test_v1_partial_reuse_config_propagates(partial, expected):
    """``test_kv_cache_stats_behavior.py::test_v2_propagates_partial_reuse_config`` numbers on V1: a 12-token
    request released, then a 10-token one: 8 tokens reused without partial reuse, 9 with it (V1 stores the
    partial block [8, 9, 10] at release)."""
    mgr = manager("v1", enable_partial_reuse=partial)
    add(mgr, 1, list(range(12)))
    mgr.free_resources(1)
    assert add(mgr, 2, list(range(10))) == expected
