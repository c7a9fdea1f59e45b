"""V1's KV cache events, ported from TensorRT-LLM ``cpp/tests/unit_tests/batch_manager/kvCacheManagerTest.cpp``
(``KVCacheManagerEventStream*``, 8 primary and 2 secondary blocks of 4 tokens) with upstream's numbers, and the
block hashes of ``tests/unittest/kv_cache_manager_v2_tests/test_kv_cache_events.py`` (its ``v1_block_key`` values
are V1's ``BlockKeyHasher``'s).

Upstream's steps map to kvcm's as the engine calls them: ``addSequence`` is ``add_sequence`` and the first context
chunk (V1 reserves the context there), ``storeContextBlocks`` the chunk's end, ``addToken`` / ``addNewToken`` a
generation step and ``append_tokens``, ``removeSequence`` ``free_resources``; ``getEvents`` is
``flush_iteration_events`` then ``get_latest_events``. Every case also replays the events into a router's index
(``kvcm.events.shadow``), which must hold exactly the blocks the manager would match after each read.
"""

from __future__ import annotations

import pytest
from _reuse_steps import add, manager

import kvcm.policy
from kvcm.events import (
    KVCacheCreatedData,
    KVCacheRemovedData,
    KVCacheStoredBlockData,
    KVCacheStoredData,
    KVCacheUpdatedData,
)
from kvcm.events.hashing import hash_v1_block_key
from kvcm.events.queue import V1Queue
from kvcm.events.shadow import ShadowIndex, cached_blocks, differences
from kvcm.reuse.retention import KvCacheRetentionConfig as Retention
from kvcm.reuse.retention import TokenRangeRetentionConfig as Range


class Reader:
    """``getEvents`` with a router's index beside it, checked at every read."""

    def __init__(self, mgr):
        self.mgr, self.index = mgr, ShadowIndex()

    def __call__(self):
        self.mgr.flush_iteration_events()
        events = self.mgr.get_latest_events(100)
        assert not differences(self.index.apply(events), cached_blocks(self.mgr))
        return events


def _events_manager(size: int = 1024, **kw):
    return manager("v1", blocks=8, host_blocks=2, event_buffer_max_size=size, **kw)


def _start(mgr, rid, tokens, **kw) -> int:
    """``addSequence``: the match, then the context's blocks (V1 reserves them at the first chunk)."""
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    return n


def _decode_and_free(mgr, rid) -> None:
    """``addToken`` + ``addNewToken(0)`` then ``removeSequence``: the released request stores its tokens less the
    last, its partial block included."""
    mgr.append_tokens(rid, [0])
    mgr.begin_generation(rid)
    mgr.free_resources(rid)


def test_kv_cache_manager_event_stream():
    """``KVCacheManagerEventStream``: one created event ([8, 2]); [0..9] (LoRA 42) stores 2 blocks under no parent,
    level 0; its release stores the partial block alone, linked to the second, with the next event id; the same
    tokens again store nothing; two 13-token prompts offload 3 blocks (3 updated 0 -> 1) and drop the first one
    offloaded (removed, its hash); released, each stores 3 blocks under no parent; [0, 1, 2, 3, 1, 1, 1, 1, 0]
    (LoRA 42) onboards 1, offloads 2 and removes 1 (4 events); its context end stores."""
    mgr = _events_manager()
    read = Reader(mgr)
    events = read()
    assert [e.kind for e in events] == ["created"]
    assert events[0].data == KVCacheCreatedData((8, 2))
    assert read() == []

    add(mgr, 0, list(range(10)), lora_task_id=42)
    events = read()
    assert [e.kind for e in events] == ["stored"]
    stored = events[0].data
    assert stored.parent_hash is None and len(stored.blocks) == 2
    assert stored.blocks[0].lora_id == 42 and stored.blocks[0].cache_level == 0

    _decode_and_free(mgr, 0)
    new = read()
    assert len(new) == 1 and new[0].event_id == events[0].event_id + 1
    assert new[0].data.parent_hash == stored.blocks[-1].block_hash and len(new[0].data.blocks) == 1

    add(mgr, 1, list(range(9)), lora_task_id=42)
    mgr.free_resources(1)
    assert read() == []

    _start(mgr, 2, [1, 1] + list(range(2, 13)))
    _start(mgr, 3, [2, 1] + list(range(2, 13)))
    events = read()
    assert [e.kind for e in events] == ["updated"] * 3 + ["removed"]
    assert all(e.data.cache_level.old_value == 0 and e.data.cache_level.new_value == 1 for e in events[:3])
    assert events[3].data.block_hashes == (events[0].data.block_hash,)     # the first block offloaded

    mgr.end_context_chunk(2, 13)       # upstream stores these at release; kvcm's engine ends the context first
    mgr.end_context_chunk(3, 13)
    mgr.free_resources(2)
    mgr.free_resources(3)
    events = read()
    assert [e.kind for e in events] == ["stored", "stored"]
    assert all(e.data.parent_hash is None and len(e.data.blocks) == 3 for e in events)

    _start(mgr, 4, [0, 1, 2, 3, 1, 1, 1, 1, 0], lora_task_id=42)
    events = read()
    moves = [e.data.cache_level.old_value for e in events if isinstance(e.data, KVCacheUpdatedData)]
    assert len(events) == 4 and sorted(moves) == [0, 0, 1]          # 2 offloads, 1 onboard
    assert sum(isinstance(e.data, KVCacheRemovedData) for e in events) == 1
    mgr.end_context_chunk(4, 9)
    assert isinstance(read()[0].data, KVCacheStoredData)


def test_kv_cache_manager_event_stream_overflow():
    """``KVCacheManagerEventStreamOverflow`` (a queue of 1 event): the created event is dropped when the stored one
    comes; a decode step emits nothing; the release stores the decode block, linked to its parent."""
    mgr = _events_manager(size=1)
    add(mgr, 0, list(range(10)), lora_task_id=42)
    mgr.flush_iteration_events()
    events = mgr.get_latest_events()
    assert len(events) == 1 and isinstance(events[0].data, KVCacheStoredData)
    assert events[0].data.parent_hash is None and events[0].event_id == 1       # 0, the created one, was dropped
    mgr.append_tokens(0, [0])
    mgr.begin_generation(0)
    mgr.flush_iteration_events()
    assert mgr.get_latest_events() == []
    mgr.free_resources(0)
    mgr.flush_iteration_events()
    events = mgr.get_latest_events()
    assert len(events) == 1 and events[0].data.parent_hash is not None


def test_kv_cache_manager_event_stream_priority():
    """``KVCacheManagerEventStreamPriority``: [0..7] with a range at 50 stores its 2 blocks (a full one at context
    end, the partial one at release) at 50: 3 events with the created one; the same tokens again, no config: the
    partial block is stored again and no priority changes; a range at 10: 2 updated events, 50 -> 10.

    Upstream counts 1 event in the second step: ``loadOrAllocateBlocks`` takes the unreferenced partial leaf over
    in place (``freeLeafBlock``) without a removed event, so a router keeps offering a block being written by
    another request until it is stored again. kvcm announces the removal (``in_place_take_announced``): 2 events,
    removed then stored; with upstream's decision the numbers are upstream's (docs/findings.md)."""
    ours = kvcm.policy.active()
    for policy, second in ((ours, ["removed", "stored"]), (ours.replacing(in_place_take_announced=False), ["stored"])):
        with kvcm.policy.applied(policy):
            mgr = _events_manager()
        read = Reader(mgr) if policy is ours else None
        get = read or (lambda: (mgr.flush_iteration_events(), mgr.get_latest_events())[1])
        add(mgr, 0, list(range(8)), retention_config=Retention(token_range_retention_configs=(Range(0, None, 50),)))
        mgr.free_resources(0)
        events = get()
        assert len(events) == 3
        assert [e.data.blocks[0].priority for e in events[1:]] == [50, 50]
        add(mgr, 1, list(range(8)))
        mgr.free_resources(1)
        assert [e.kind for e in get()] == second
        mgr.add_sequence(2, list(range(8)), retention_config=Retention(
            token_range_retention_configs=(Range(0, None, 10),)))
        events = [e for e in get() if e.kind == "updated"]
        assert [(e.data.priority.old_value, e.data.priority.new_value) for e in events] == [(50, 10), (50, 10)]


@pytest.mark.upstream("test_v2_kv_cache_event_manager_v1_hash_algo_matches_v1_block_key_hash",
                      "test_v2_kv_cache_event_manager_v1_hash_algo_mixes_cache_salt_id")
def test_v1_block_key_hashes_match_upstream():
    """``test_v2_kv_cache_event_manager_v1_hash_algo_matches_v1_block_key_hash`` and
    ``test_v2_kv_cache_event_manager_v1_hash_algo_mixes_cache_salt_id``:
    [1, 2, 3, 4] then [5, 6] hash to 924206229973855 and 6875034662206558884; under cache salt id 123 to
    6280297290684427985 and 18177682803760873588. A V1 manager announces the same hashes for the same prompt."""
    first = hash_v1_block_key([1, 2, 3, 4])
    assert (first, hash_v1_block_key([5, 6], first)) == (924206229973855, 6875034662206558884)
    salted = hash_v1_block_key([1, 2, 3, 4], 0, None, 123)
    assert (salted, hash_v1_block_key([5, 6], salted, None, 123)) == (6280297290684427985, 18177682803760873588)
    for salt, want in ((None, [924206229973855, 6875034662206558884]),
                       (123, [6280297290684427985, 18177682803760873588])):
        mgr = _events_manager()
        add(mgr, 0, [1, 2, 3, 4, 5, 6, 7], cache_salt=salt)
        mgr.free_resources(0)                    # [1..6] stored: a full block at context end, [5, 6] at release
        mgr.flush_iteration_events()
        hashes = [b.block_hash for e in mgr.get_latest_events() if e.kind == "stored" for b in e.data.blocks]
        assert hashes == want


def test_events_off_by_default():
    """``event_buffer_max_size`` 0 (the default): no event manager, ``getLatestEvents`` is empty."""
    mgr = manager("v1", blocks=8)
    add(mgr, 0, list(range(10)))
    mgr.free_resources(0)
    mgr.flush_iteration_events()
    assert mgr.get_latest_events(0) == []


def test_eviction_announces_the_descendants_it_detaches():
    """``getFreeBlock``'s ``freeChildren`` (TensorRT-LLM PR #16335 fixed descendants left unannounced): a cached
    first block kept at priority 10 goes before its children at 35, and takes them out of the tree with it; the
    removed event names all three, children first."""
    mgr = manager("v1", blocks=3, event_buffer_max_size=64)
    read = Reader(mgr)
    read()
    add(mgr, 0, [1] * 10, retention_config=Retention(token_range_retention_configs=(Range(0, 4, 10),)))
    mgr.free_resources(0)                     # [1]*4 at 10, [1]*4 and the partial [1] at 35, all cached
    stored = [b.block_hash for e in read() for b in e.data.blocks]
    add(mgr, 1, [2] * 4)                      # one fresh block: the lowest priority goes, with its descendants
    removed = [h for e in read() if e.kind == "removed" for h in e.data.block_hashes]
    assert len(stored) == 3 and sorted(removed) == sorted(stored) and removed[-1] == stored[0]


def test_removals_keep_their_place_among_stores():
    """``enqueueRemovedEvent`` joins a removal to the last queued event only, when that is a removed event of the
    same window: a block evicted, then a block stored, then that block evicted reach a router in that order
    (TensorRT-LLM PR #11883), so it ends without the block."""
    q = V1Queue(16, "v1_block_key", kvcm.policy.active())
    q.removed(4096, 0, 1)
    q.removed(4096, 0, 2)                    # joins the last event: same group
    q.stored(4096, 0, None, KVCacheStoredBlockData(3, (3,), None, 0, 35))
    q.end_store()
    q.removed(4096, 0, 3)
    q.removed(4096, 1, 4)                    # another group: an event of its own
    q.flush()
    events = q.take()
    assert [(e.kind, e.layer_group_id) for e in events] == [("removed", 0), ("stored", 0), ("removed", 0),
                                                            ("removed", 1)]
    assert events[0].data.block_hashes == (1, 2) and events[2].data.block_hashes == (3,)
    assert not ShadowIndex().apply(events).blocks
