"""V2's KV cache events (TensorRT-LLM PR #13589), ported from ``tests/unittest/kv_cache_manager_v2_tests/
test_kv_cache_events.py``: the event manager's own cases run on kvcm's V2 queue (``kvcm.events.queue.V2Queue``),
the manager cases on kvcm's V2 manager with upstream's numbers.

Upstream's ``_commit_and_close`` (a cache created, resumed, its tokens committed, closed) is ``add_sequence``, the
prompt's context chunk and its end (V2 commits the prompt there, its partial block included) and
``free_resources``; ``clear_reusable_blocks`` is ``reset_prefix_cache``; a GPU level made smaller (``resize``) is
an allocation that evicts. Each manager case also replays the events into a router's index
(``kvcm.events.shadow``), which must hold exactly the blocks the manager would match at each read.
"""

from __future__ import annotations

import hashlib

import pytest
from _reuse_steps import add, manager

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.events import (
    KVCacheCreatedData,
    KVCacheEventDiff,
    KVCacheStoredBlockData,
    KVCacheUpdatedData,
)
from kvcm.events.queue import V2Queue
from kvcm.events.shadow import ShadowIndex, cached_blocks, differences
from kvcm.model_spec import LayerSpec, ModelSpec


def _read(mgr, index: ShadowIndex | None = None) -> list:
    mgr.flush_iteration_events()
    events = mgr.get_latest_events(0)
    if index is not None:
        assert not differences(index.apply(events), cached_blocks(mgr))
    return events


def _stored_hashes(events, group=None) -> list:
    return [b.block_hash for e in events if e.kind == "stored" and group in (None, e.layer_group_id)
            for b in e.data.blocks]


def _two_groups(blocks: int, host_blocks: int = 0, tpb: int = 8):
    """Two layer groups (full attention and a window longer than any prompt here) of ``blocks`` pages each, as
    upstream's two-layer managers have two layer groups."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", None, model_layer=0), LayerSpec(1, 64, "bfloat16", 128,
                                                                                    model_layer=1)), name="two")
    per_block = 2 * 2 * 64 * tpb
    cfg = KvCacheConfig(tokens_per_block=tpb, max_gpu_total_bytes=2 * blocks * per_block, pool_ratio=(1, 1),
                        event_buffer_max_size=16, host_cache_size=host_blocks * 2 * per_block or None)
    mgr = kvcm.create_kv_cache_manager("v2", spec, cfg, max_batch_size=4, max_seq_len=256, device="meta")
    assert [p.num_blocks for p in mgr.pools] == [blocks, blocks]
    return mgr


# ---- the event manager (upstream's _event_manager.py cases, on kvcm's V2 queue) ------------------------------------
def _block(h, *tokens):
    return KVCacheStoredBlockData(h, tokens, None, 0, 0)


def test_v2_kv_cache_event_manager_drops_oldest_events():
    """A queue of 2: created, stored, removed "a", removed "b" publish as ids [1, 2]: the stored one and one removed
    event holding ["a", "b"] (removals of a group wait and go out together)."""
    q = V2Queue(2, "v2_sha256", kvcm.policy.DEFAULT)
    q.created(128, 0, KVCacheCreatedData((1,)))
    q.stored(128, 0, None, _block("stored", 1))
    q.removed(128, 0, "a")
    q.removed(128, 0, "b")
    q.flush()
    events = q.take()
    assert [e.event_id for e in events] == [1, 2]
    assert events[0].data.blocks[0].block_hash == "stored" and events[1].data.block_hashes == ("a", "b")


def test_v2_kv_cache_event_manager_coalesces_contiguous_stored_events():
    """Two chained blocks in two layer groups: one stored event a group, each with both blocks, no parent."""
    q = V2Queue(8, "v2_sha256", kvcm.policy.DEFAULT)
    for parent, h in ((None, "abcd"), ("abcd", "abce")):
        for group in (0, 1):
            q.stored(128, group, parent, _block(h, 1, 2))
    q.flush()
    events = q.take()
    assert [(e.kind, e.layer_group_id) for e in events] == [("stored", 0), ("stored", 1)]
    assert all([b.block_hash for b in e.data.blocks] == ["abcd", "abce"] and e.data.parent_hash is None
               for e in events)


def test_v2_kv_cache_event_manager_flushes_removed_before_updated_event():
    """A removal waiting when an updated event comes goes out first: [removed, updated]."""
    q = V2Queue(8, "v2_sha256", kvcm.policy.DEFAULT)
    q.removed(128, 0, "abd1")
    q.updated(128, 0, KVCacheUpdatedData("abd2", cache_level=KVCacheEventDiff(0, 1)))
    q.flush()
    assert [e.kind for e in q.take()] == ["removed", "updated"]


def test_v2_kv_cache_event_manager_emits_partial_life_cycle_removed_events():
    """A block stored in two layer groups and removed from one: [stored 0, stored 1, removed 0]."""
    q = V2Queue(8, "v2_sha256", kvcm.policy.DEFAULT)
    q.stored(128, 0, None, _block("abcd", 1, 2))
    q.stored(128, 1, None, _block("abcd", 1, 2))
    q.removed(128, 0, "abcd")
    q.flush()
    events = q.take()
    assert [(e.kind, e.layer_group_id) for e in events] == [("stored", 0), ("stored", 1), ("removed", 0)]


# ---- the manager -------------------------------------------------------------------------------------------------
def test_v2_kv_cache_event_manager_uses_layer_group_window_size():
    """One created event a layer group, each with its group's window size (full attention: the sequence length)."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", 128, model_layer=0), LayerSpec(1, 64, "bfloat16", None,
                                                                                  model_layer=1)), name="two")
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=4, max_tokens=64,
                                                                 event_buffer_max_size=4),
                                       max_batch_size=4, max_seq_len=4096, device="meta")
    events = _read(mgr)
    windows = {g.index: (128 if g.window else 4096) for g in mgr.layer_groups}
    assert [e.kind for e in events] == ["created", "created"]
    assert {e.layer_group_id: e.window_size for e in events} == windows


def test_v2_stored_events_match_block_hash_chain():
    """``v2_sha256``: committing [0..7] (blocks of 4) is one stored event of 2 blocks under no parent, their hashes
    the radix tree's keys (SHA-256 of the parent's key and the tokens as 4-byte little-endian words, from the
    root's key: SHA-256 of the empty reuse scope, one mask byte 0) and their tokens."""
    mgr = manager("v2", event_buffer_max_size=16, kv_cache_event_hash_algo="v2_sha256")
    index = ShadowIndex()
    _read(mgr, index)
    add(mgr, 0, list(range(8)))
    mgr.free_resources(0)
    stored = [e for e in _read(mgr, index) if e.kind == "stored"]
    root = hashlib.sha256(b"\x00").digest()
    block0 = hashlib.sha256(root + b"".join(t.to_bytes(4, "little") for t in range(4))).digest()
    block1 = hashlib.sha256(block0 + b"".join(t.to_bytes(4, "little") for t in range(4, 8))).digest()
    assert len(stored) == 1 and stored[0].data.parent_hash is None and stored[0].hash_algo == "v2_sha256"
    assert [b.block_hash for b in stored[0].data.blocks] == [block0.hex(), block1.hex()]
    assert [b.tokens for b in stored[0].data.blocks] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_v2_reused_prefix_does_not_emit_duplicate_stored_events():
    """A prompt that reuses a committed 2-block prefix stores only its third block."""
    mgr = manager("v2", event_buffer_max_size=16, kv_cache_event_hash_algo="v2_sha256")
    index = ShadowIndex()
    _read(mgr, index)
    add(mgr, 0, list(range(8)))
    mgr.free_resources(0)
    prefix = _stored_hashes(_read(mgr, index))
    assert add(mgr, 1, list(range(12))) == 8
    mgr.free_resources(1)
    reused = _stored_hashes(_read(mgr, index))
    assert len(prefix) == 2 and len(reused) == 1 and not set(prefix) & set(reused)


def test_v2_removed_events_match_stored_hashes():
    """Clearing the reusable blocks removes exactly the hashes stored, each once."""
    mgr = manager("v2", event_buffer_max_size=16)
    index = ShadowIndex()
    _read(mgr, index)
    add(mgr, 0, list(range(8)))
    mgr.free_resources(0)
    stored = _stored_hashes(_read(mgr, index))
    assert mgr.reset_prefix_cache()
    removed = [h for e in _read(mgr, index) if e.kind == "removed" for h in e.data.block_hashes]
    assert len(stored) == 2 and sorted(removed) == sorted(stored)


def test_v2_removed_event_emitted_when_last_level_page_is_dropped():
    """Two layer groups, no host level: a 2-block prompt stores the same hashes in both; when an allocation drops
    one of its blocks, each group announces that one hash removed, in an event of its own."""
    mgr = _two_groups(blocks=3)
    index = ShadowIndex()
    _read(mgr, index)
    add(mgr, 0, list(range(16)))
    mgr.free_resources(0)
    events = _read(mgr, index)
    assert _stored_hashes(events, 0) == _stored_hashes(events, 1) and len(_stored_hashes(events, 0)) == 2
    add(mgr, 1, list(range(100, 116)))        # one page short in each group: one block of the first prompt goes
    removed = {e.layer_group_id: e.data.block_hashes for e in _read(mgr, index) if e.kind == "removed"}
    assert set(removed) == {0, 1} and removed[0] == removed[1] and len(removed[0]) == 1
    assert removed[0][0] in _stored_hashes(events, 0)


def test_v2_kv_cache_event_manager_emits_updated_on_level_migration():
    """The same with a host level: the block falls to the host instead, one updated event a layer group (0 -> 1,
    no priority change), both for one of the stored hashes."""
    mgr = _two_groups(blocks=3, host_blocks=2)
    index = ShadowIndex()
    _read(mgr, index)
    add(mgr, 0, list(range(16)))
    mgr.free_resources(0)
    stored = _stored_hashes(_read(mgr, index), 0)
    add(mgr, 1, list(range(100, 116)))
    updated = [e for e in _read(mgr, index) if e.kind == "updated"]
    assert sorted(e.layer_group_id for e in updated) == [0, 1]
    assert len({e.data.block_hash for e in updated}) == 1 and updated[0].data.block_hash in stored
    assert all(e.data.cache_level == KVCacheEventDiff(0, 1) and e.data.priority is None for e in updated)


@pytest.mark.upstream("test_v2_v1_hash_events_include_cache_salt_from_kv_cache")
def test_v1_and_v2_managers_emit_same_v1_hash_stored_events():
    """``v1_block_key`` (the default, ``auto``): V1 storing a prompt of 9 tokens and V2 committing its first 8
    announce the same stored payloads; under cache salt 123, V2's hashes of [1..6] are 6280297290684427985 and
    18177682803760873588 (``test_v2_v1_hash_events_include_cache_salt_from_kv_cache``)."""
    payloads = []
    for version, prompt in (("v1", list(range(1, 10))), ("v2", list(range(1, 9)))):
        mgr = manager(version, event_buffer_max_size=16)
        add(mgr, 0, prompt)
        mgr.free_resources(0)
        payloads.append([e.data for e in _read(mgr) if e.kind == "stored"])
    assert payloads[0] == payloads[1] and len(payloads[0][0].blocks) == 2
    mgr = manager("v2", event_buffer_max_size=16)
    add(mgr, 0, list(range(1, 7)), cache_salt=123)
    mgr.free_resources(0)
    assert _stored_hashes(_read(mgr)) == [6280297290684427985, 18177682803760873588]


def test_v2_a_sliding_page_evicted_alone_is_removed_from_its_group_only():
    """``add_removed_life_cycle_event``: a sliding-window group's page that falls out of the window and is evicted
    is announced removed for that layer group alone; the full group, whose page the running request still holds,
    keeps the block in every router's index."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", None, model_layer=0), LayerSpec(1, 64, "bfloat16", 4,
                                                                                    model_layer=1)), name="swa")
    per_block = 2 * 2 * 64 * 4
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(
        tokens_per_block=4, max_gpu_total_bytes=16 * per_block, pool_ratio=(10, 6), event_buffer_max_size=64),
        max_batch_size=4, max_seq_len=256, device="meta")
    full, window = (g.index for g in sorted(mgr.layer_groups, key=lambda g: g.window is not None))
    assert (mgr.pools[full].num_blocks, mgr.pools[window].num_blocks) == (10, 6)
    index = ShadowIndex()
    _read(mgr, index)
    add(mgr, 0, list(range(12)))             # its window pages before the last block are stored, then released
    _read(mgr, index)
    add(mgr, 1, list(range(100, 120)))       # five window pages, three free: request 0's released ones go
    removed = [e for e in _read(mgr, index) if e.kind == "removed"]
    assert removed and {e.layer_group_id for e in removed} == {window}
    assert mgr.has_request(0) and all((full, h) in index.blocks for e in removed for h in e.data.block_hashes)
