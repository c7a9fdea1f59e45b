"""KV cache events at the manager level (docs/semantics.md 13): the switch and its bad values, the calls, what a full
queue keeps, created events per group, and that a refused call emits nothing. The upstream cases are ported in
``suites/conformance/test_v1_kv_events.py`` and ``test_v2_kv_events.py``."""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import ConfigError, OutOfPagesError
from kvcm.events.shadow import ShadowIndex, cached_blocks, differences
from kvcm.model_spec import LayerSpec, ModelSpec


def _manager(version: str, blocks: int = 4, tpb: int = 4, window: int | None = None, **cfg):
    layers = [LayerSpec(1, 64, "bfloat16", None, model_layer=0)]
    if window is not None:
        layers.append(LayerSpec(1, 64, "bfloat16", window, model_layer=1))
    return kvcm.create_kv_cache_manager(version, ModelSpec(tuple(layers), name="events"),
                                        KvCacheConfig(tokens_per_block=tpb, max_tokens=blocks * tpb, **cfg),
                                        max_batch_size=4, max_seq_len=64, device="meta")


def _read(mgr) -> list:
    mgr.flush_iteration_events()
    return mgr.get_latest_events(0)


@pytest.mark.parametrize("value, limit", [(-1, "[0, 2**31 - 1]"), (1 << 31, "[0, 2**31 - 1]"), (True, "not a bool"),
                                          ("8", "not str"), (2.5, "integer")])
def test_a_bad_event_buffer_size_is_one_config_error_line(value, limit):
    with pytest.raises(ConfigError) as info:
        KvCacheConfig(event_buffer_max_size=value)
    text = str(info.value)
    assert "\n" not in text and "event_buffer_max_size" in text and repr(value) in text and limit in text


def test_a_bad_hash_algorithm_or_wait_is_refused():
    with pytest.raises(ConfigError, match="kv_cache_event_hash_algo='md5'.*auto, v1_block_key, v2_sha256"):
        KvCacheConfig(kv_cache_event_hash_algo="md5")
    mgr = _manager("v2", event_buffer_max_size=4)
    for wait in (-1, float("nan"), "1", True):
        with pytest.raises(ConfigError, match="timeout_ms"):
            mgr.get_latest_events(wait)
    assert mgr.get_latest_events(0) == [] and mgr.get_latest_events(1.5) == []   # created: not flushed yet


def test_v1_keeps_its_hashes_whatever_the_algorithm_asked():
    """TensorRT-LLM's V1 warns and keeps ``v1_block_key``; V2 takes the algorithm asked."""
    with pytest.warns(UserWarning, match="always carry v1_block_key hashes"):
        v1 = _manager("v1", event_buffer_max_size=4, kv_cache_event_hash_algo="v2_sha256")
    v2 = _manager("v2", event_buffer_max_size=4, kv_cache_event_hash_algo="v2_sha256")
    assert [e.hash_algo for e in _read(v1)] == ["v1_block_key"] and [e.hash_algo for e in _read(v2)] == ["v2_sha256"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_created_events_name_each_group_and_its_levels(version):
    """One created event a group: V1 in window order with both levels always ([blocks, 0] without a host tier),
    V2 by group with the levels it has; the window size is the group's (the sequence length for full attention)."""
    mgr = _manager(version, blocks=4, window=8, event_buffer_max_size=8)
    events = _read(mgr)
    windows = {g.index: g.window or 64 for g in mgr.layer_groups}
    assert [e.kind for e in events] == ["created", "created"]
    assert {e.layer_group_id: e.window_size for e in events} == windows
    for e in events:
        blocks = mgr.pools[e.layer_group_id].num_blocks
        assert e.data.num_blocks_per_cache_level == ((blocks, 0) if version == "v1" else (blocks,))
    if version == "v1":
        assert [e.window_size for e in events] == sorted(windows.values())


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_full_queue_keeps_the_newest_events(version):
    """A queue of 3: the oldest published events go first, the ids of the kept ones run without a gap to the last."""
    mgr = _manager(version, blocks=8, event_buffer_max_size=3)
    for rid, first in enumerate((1, 2, 3, 4)):
        n = mgr.add_sequence(rid, [first] * 9)
        mgr.begin_context_chunk(rid, n, 9 - n, 9)
        mgr.end_context_chunk(rid, 9)
        mgr.free_resources(rid)
    mgr.flush_iteration_events()
    events = mgr.get_latest_events()
    last = mgr._events.queue.next_id - 1
    assert [e.event_id for e in events] == [last - 2, last - 1, last] and mgr._events.queue.dropped == last - 2
    assert mgr.get_latest_events() == []


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_nothing_is_published_before_the_flush(version):
    mgr = _manager(version, blocks=8, event_buffer_max_size=16)
    _read(mgr)
    n = mgr.add_sequence(0, [1] * 9)
    mgr.begin_context_chunk(0, n, 9 - n, 9)
    mgr.end_context_chunk(0, 9)
    assert mgr.get_latest_events() == []
    assert [e.kind for e in _read(mgr)] == ["stored"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_refused_call_emits_nothing(version):
    """A refused admission (its partial copy or its context does not fit) changes nothing, events included."""
    mgr = _manager(version, blocks=3, event_buffer_max_size=16)
    index = ShadowIndex()
    index.apply(_read(mgr))
    n = mgr.add_sequence(0, [1] * 9)
    mgr.begin_context_chunk(0, n, 9 - n, 9)
    mgr.end_context_chunk(0, 9)
    index.apply(_read(mgr))
    with pytest.raises(OutOfPagesError):
        n = mgr.add_sequence(1, [2] * 13)
        mgr.begin_context_chunk(1, n, 13 - n, 13)
    if mgr.has_request(1):
        mgr.free_resources(1)
    assert _read(mgr) == [] and not differences(index, cached_blocks(mgr))


def test_deepseek_v4_emits_v2_events_per_group():
    """DeepSeek-V4 is a V2 manager with its own groups: a stored event per group a committed block has a page in."""
    mgr = kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(compress_ratios=(4, 128)),
                                      KvCacheConfig(tokens_per_block=128, max_tokens=8 * 128, event_buffer_max_size=64),
                                      max_batch_size=4, max_seq_len=8192, device="meta")
    created = _read(mgr)
    assert len(created) == len(mgr.layer_groups)
    index = ShadowIndex()
    tokens = [1] * 300
    n = mgr.add_sequence(0, tokens)
    mgr.begin_context_chunk(0, n, 300 - n, 300)
    mgr.end_context_chunk(0, 300)
    mgr.free_resources(0)
    events = _read(mgr)
    assert {e.kind for e in events} == {"stored"} and len({e.layer_group_id for e in events}) > 1
    assert not differences(index.apply(events), cached_blocks(mgr))


def test_an_eviction_announces_the_descendants_it_takes_in_every_group():
    """V1 with a full and a window group (both keep every block): a cached first block at priority 10 goes first and
    takes its cached children with it (``freeChildren``), so each group's removed event names all three blocks; a
    router fed the events holds nothing the manager lost (TensorRT-LLM PR #16335: descendants went unannounced)."""
    from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

    mgr = _manager("v1", blocks=3, window=8, event_buffer_max_size=64)
    index = ShadowIndex()
    index.apply(_read(mgr))
    low = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, 4, 10),))
    n = mgr.add_sequence(0, [1] * 10, retention_config=low)
    mgr.begin_context_chunk(0, n, 10 - n, 10)
    mgr.end_context_chunk(0, 10)
    mgr.free_resources(0)                         # every group stores all three blocks at release
    index.apply(_read(mgr))
    n = mgr.add_sequence(1, [2] * 4)
    mgr.begin_context_chunk(1, n, 4 - n, 4)
    removed = {}
    for e in _read(mgr):
        if e.kind == "removed":
            removed.setdefault(e.layer_group_id, []).extend(e.data.block_hashes)
            index.apply([e])
    assert sorted(removed) == [0, 1] and all(len(hashes) == 3 for hashes in removed.values())
    assert not differences(index, cached_blocks(mgr))
