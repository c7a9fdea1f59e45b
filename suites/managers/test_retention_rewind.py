"""Retention durations, token ranges and rewinds on a V1 manager (``kvcm/free_queue.py``,
``kvcm/reuse/retention.py``): the rules TensorRT-LLM's ``LRUEvictionPolicy`` and ``KvCacheRetentionConfig`` keep,
seen through what a request later reuses."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.free_queue import QueuedBlockPool
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.reuse.retention import KvCacheRetentionConfig as Retention, TokenRangeRetentionConfig as Range

SPEC = ModelSpec((LayerSpec(1, 64, "bfloat16", None, model_layer=0),), name="one-layer")


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def build(blocks=4, **cfg):
    mgr = kvcm.create_kv_cache_manager("v1", SPEC, KvCacheConfig(tokens_per_block=4, max_tokens=blocks * 4, **cfg),
                                       max_batch_size=8, max_seq_len=256, device="meta")
    clock = Clock()
    mgr.set_clock(clock)
    return mgr, clock


def run(mgr, rid, tokens, **kw):
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def test_an_expired_block_waits_behind_the_default_blocks_released_before_it():
    """A timed priority-80 prefix that expires goes to the *back* of queue 35: the default blocks released before it
    are evicted first, so after one 2-block prompt the expired prefix is still there."""
    mgr, clock = build(blocks=4)
    run(mgr, "timed", list(range(9)), retention_config=Retention(
        token_range_retention_configs=(Range(0, None, 80, 10),)))
    mgr.free_resources("timed")                  # 0, 1 cached at 80 for 10 ms; 2 private
    mgr.begin_context_chunk("x", 0, 4, 4)        # takes the never-used 3
    mgr.free_resources("x")
    clock.now = 20
    mgr.refresh_blocks()
    mgr.begin_context_chunk("y", 0, 8, 8)        # two blocks: 2 and 3, both default and released before
    assert sorted(mgr.block_table("y")[0]) == [2, 3]
    assert mgr.count_reusable_blocks(list(range(9)), only_allocated=False) == 2


def test_a_reused_block_restarts_its_timer_when_released_again():
    """``claimBlock`` erases a block's timer: released at t=0 for 10 ms, reused at t=5 and released at t=8, the
    block keeps priority 80 at t=12 (its new timer ends at 18) and falls to 35 only after."""
    mgr, clock = build(blocks=4)
    retention = Retention(token_range_retention_configs=(Range(0, None, 80, 10),))
    run(mgr, 0, list(range(5)), retention_config=retention)
    block = mgr.block_table(0)[0][0]
    mgr.free_resources(0)
    clock.now = 5
    run(mgr, 1, list(range(5)), retention_config=retention)
    clock.now = 8
    mgr.free_resources(1)
    clock.now = 12
    mgr.refresh_blocks()
    assert mgr.get_priority_by_block_id(block) == 80
    clock.now = 19
    mgr.refresh_blocks()
    assert mgr.get_priority_by_block_id(block) == 35


def test_a_block_straddling_two_ranges_takes_the_range_of_its_first_token():
    """Ranges (0, 6, 90) and (6, None, 10): block 1 holds tokens 4..7, so it is a 90 block."""
    mgr, _ = build(blocks=4)
    run(mgr, 0, list(range(9)), retention_config=Retention(
        token_range_retention_configs=(Range(0, 6, 90), Range(6, None, 10))))
    blocks = mgr.block_table(0)[0]
    assert [mgr.get_priority_by_block_id(b) for b in blocks[:2]] == [90, 90]


def test_a_hit_with_its_own_range_changes_the_shared_prefix_priority():
    """A prefix cached at 90 and reused by a request with a range at 10 is a 10 block from then on: the next
    eviction takes it before a 35 block."""
    mgr, _ = build(blocks=3)
    run(mgr, 0, list(range(5)), retention_config=Retention(priority=90))
    mgr.free_resources(0)
    run(mgr, 1, list(range(5)), retention_config=Retention(token_range_retention_configs=(Range(0, None, 10),)))
    assert mgr.get_priority_by_block_id(mgr.block_table(1)[0][0]) == 10
    mgr.free_resources(1)
    mgr.begin_context_chunk("x", 0, 8, 8)         # the two priority-10 blocks go; the priority-90 one stays
    assert mgr.count_reusable_blocks(list(range(5)), only_allocated=False) == 0


def test_rejected_draft_slots_go_back_to_the_front_of_the_queue():
    """``end_generation`` gives back the draft slots a step did not accept through ``removeToken``'s
    ``releaseLastBlock(toFront)``: the next page anyone takes is that block again, not a never-used one."""
    mgr, _ = build(blocks=8, enable_block_reuse=False)
    mgr.begin_context_chunk(0, 0, 4, 4)
    mgr.end_context_chunk(0, 4)
    mgr.begin_generation(0, num_draft=4)          # 4 + 1 + 4 = 9 tokens: blocks 1 and 2
    assert mgr.block_table(0)[0] == [0, 1, 2]
    mgr.end_generation(0, 5, num_draft=4, num_accepted=0)
    assert mgr.block_table(0)[0] == [0, 1]
    mgr.begin_context_chunk(1, 0, 4, 4)
    assert mgr.block_table(1)[0] == [2]


def test_a_timer_entry_from_an_earlier_release_does_not_fire():
    """Pool level: a page released with a 10 ms duration, taken and released again at t=8, keeps its priority
    at t=12; the first release's timer belongs to a queue entry that is gone."""
    pool = QueuedBlockPool(2, 16)
    clock = Clock()
    pool.clock = clock
    page = pool.allocate(1)[0]
    pool.release([page], [(80, 10)])
    clock.now = 5
    pool.queue.remove(page)
    pool._used[page] = 1
    clock.now = 8
    pool.release([page], [(80, 10)])
    clock.now = 12
    assert pool.refresh() == [] and pool.queue.key(page)[0] == 80
