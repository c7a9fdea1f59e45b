"""Life cycles: the stale range of a sliding window and the numbering of layer groups, after TensorRT-LLM's
``tensorrt_llm/runtime/kv_cache_manager_v2/_life_cycle_registry.py`` (``AttnLifeCycle.get_stale_range``,
``LifeCycleRegistry``) and ``_storage/_config.py`` (docs/semantics.md 4.1, 4.3).
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.attention_types import FullAttention, SlidingWindow
from kvcm.layer_groups import LayerGroup
from kvcm.model_spec import LayerSpec, ModelSpec

from _build import build, sliding_then_full
from kvcm.versions import NAMES as ALL_VERSIONS


@pytest.mark.parametrize("history, stale", [(0, (0, 0)), (94, (0, 0)), (95, (0, 1)), (127, (0, 2)), (200, (0, 4))])
def test_stale_range_keeps_the_in_flight_token(history, stale):
    """Source: ``AttnLifeCycle.get_stale_range``: ``[min(ceil(h / tpb), sinks), max(that, (h + 1 - W) // tpb))``,
    the ``+ 1`` being the in-flight token. Window 64, tpb 32: block 0 goes stale at history 95, not 94."""
    group = LayerGroup(0, (0,), SlidingWindow(64, tokens_per_block=32), 2048)
    assert group.stale_range(history) == stale


def test_stale_range_keeps_sink_blocks():
    """Source: ``AttnLifeCycle.make`` turns sink tokens into ``div_up(num_sink_tokens, tpb)`` sink blocks, and
    the stale range starts after them: 16 sink tokens at tpb 32 keep block 0; at history 200 (window 64) blocks
    1, 2, 3 are stale."""
    group = LayerGroup(0, (0,), SlidingWindow(64, 16, tokens_per_block=32), 2048)
    assert group.sink_pages() == 1
    assert group.stale_range(200) == (1, 4)
    assert group.stale_range(0) == (0, 0)  # nothing held yet: the start is min(ceil(0 / 32), 1) = 0


def test_full_attention_has_no_stale_blocks():
    """Source: ``AttnLifeCycle.get_stale_range`` returns an empty range when ``window_size is None``."""
    group = LayerGroup(0, (0,), FullAttention(tokens_per_block=32), 2048)
    assert group.stale_range(10**6) == (0, 0)
    assert group.pages_needed(1000, 999) == 32


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_groups_are_numbered_as_first_seen(kvcm_version):
    """Source: ``LifeCycleRegistry.__init__`` appends each new life cycle as it meets the layers in order. A
    model whose first layer slides (Gemma's layout) has the sliding group as index 0 and full attention as 1."""
    mgr = build(kvcm_version, sliding_then_full(64), KvCacheConfig(max_tokens=1024))
    assert [(g.index, g.window, g.layers) for g in mgr.layer_groups] == [(0, 64, (0,)), (1, None, (1,))]


def test_layers_apart_share_one_life_cycle():
    """Source: ``LifeCycleRegistry`` keys a life cycle by (window, sink blocks): layers 0, 2, 4 (window 512) and
    1, 3, 5 (full) make two groups, numbered as first seen."""
    layers = tuple(LayerSpec(1, 16, "bfloat16", 512 if i % 2 == 0 else None, model_layer=i) for i in range(6))
    mgr = kvcm.KVCacheManagerV2(ModelSpec(layers), KvCacheConfig(max_tokens=1024), max_batch_size=2,
                                max_seq_len=4096, device="meta")
    assert [(g.window, g.layers) for g in mgr.layer_groups] == [(512, (0, 2, 4)), (None, (1, 3, 5))]


def test_pool_ratio_weights_groups_in_registry_order():
    """Source: ``KVCacheManagerConfig.initial_pool_ratio`` is indexed by pool group, and pool groups follow the
    life-cycle numbering. A ratio (3, 1) on a sliding-first model gives the sliding group three quarters of the
    budget: 30 and 10 blocks of 2048 bytes out of 81920."""
    cfg = KvCacheConfig(max_gpu_total_bytes=40 * 2048, pool_ratio=(3, 1))
    mgr = kvcm.KVCacheManagerV2(sliding_then_full(64), cfg, max_batch_size=4, max_seq_len=4096, device="meta")
    assert [(g.window, g.num_blocks) for g in mgr.layer_groups] == [(64, 30), (None, 10)]


@pytest.mark.parametrize("sinks", [(4, 8, 40), (1, 32, 64)])
def test_sink_tokens_that_round_to_the_same_blocks_share_a_life_cycle(sinks):
    """Source: ``AttnLifeCycle`` keys a life cycle by ``num_sink_blocks = div_up(num_sink_tokens, tpb)``: at tpb
    32, windows of 64 with 4 and with 8 sink tokens (or 1 and 32) are one life cycle (one sink block); 40 (or 64)
    sink tokens, two blocks, are another."""
    layers = tuple(LayerSpec(1, 16, "bfloat16", 64, sink_tokens=s, model_layer=i) for i, s in enumerate(sinks))
    mgr = kvcm.KVCacheManagerV2(ModelSpec(layers), KvCacheConfig(max_gpu_total_bytes=2**20), max_batch_size=2,
                                max_seq_len=4096, device="meta")
    assert [(g.layers, g.sink_pages()) for g in mgr.layer_groups] == [((0, 1), 1), ((2,), 2)]
