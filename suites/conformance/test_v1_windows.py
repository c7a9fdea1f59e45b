"""TensorRT-LLM's V1 pools for variable sliding windows, restated from
``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (``calculate_max_num_blocks_for_vswa``); kvcm's V1 gives
every group the same blocks, a deliberate difference (docs/semantics.md 10, "V1 windows").
"""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.v1_windows import trtllm_v1_window_blocks

from _build import GiB


def _gemma_v1(cfg):
    return kvcm.create_kv_cache_manager("v1", kvcm.load_spec("gemma-3-270m"), cfg, max_batch_size=256,
                                        max_seq_len=8192, device="meta")


def test_each_window_gets_an_equal_share_of_the_bytes():
    """Equal shares by default: Gemma 3 270M at 1 GiB, 0.5 GiB each: the window-512 layers (15 360 bytes a token)
    get 0.5 GiB / 15 360 // 32 = 1,092 blocks, the full layers (3,072 bytes a token) 5,461; kvcm's V1 gives both
    1 GiB // 576 KiB = 1,820 blocks."""
    mgr = _gemma_v1(KvCacheConfig(max_gpu_total_bytes=GiB))
    assert trtllm_v1_window_blocks(mgr.layer_groups, 32, max_gpu_total_bytes=GiB) == {0: 1092, 1: 5461}
    assert [g.num_blocks for g in mgr.layer_groups] == [1820, 1820]


def test_max_gpu_total_bytes_wins_over_the_fraction_and_max_tokens_is_ignored():
    """``primary_pool_memory_bytes = max_gpu_total_bytes if > 0 else free * fraction``: 2 GiB set beats 0.5 of
    1 GiB free (2,184 and 10,922 blocks); unset, 0.5 GiB is shared (546 and 2,730). ``max_tokens`` is logged
    and ignored on the variable-window path; kvcm's V1 takes the smallest budget, tokens included."""
    mgr = _gemma_v1(KvCacheConfig(max_gpu_total_bytes=GiB))
    assert trtllm_v1_window_blocks(mgr.layer_groups, 32, max_gpu_total_bytes=2 * GiB, free_memory_bytes=GiB,
                                   fraction=0.5) == {0: 2184, 1: 10922}
    assert trtllm_v1_window_blocks(mgr.layer_groups, 32, free_memory_bytes=GiB, fraction=0.5) == {0: 546, 1: 2730}
    capped = _gemma_v1(KvCacheConfig(max_gpu_total_bytes=GiB, max_tokens=32 * 100))
    assert [g.num_blocks for g in capped.layer_groups] == [100, 100]
