"""Generation steps, warmup dummies and V4's constraints, restated from TensorRT-LLM's
``tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py``, its model engine's CUDA-graph warmup and the
DeepSeek-V4 cache manager (docs/semantics.md 4.1, 4.2, 5, 7).
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import BatchDesc, KVCacheDesc, KvCacheConfig

from _build import build, one_layer, v4
from kvcm.versions import NAMES as ALL_VERSIONS


@pytest.mark.upstream("test_update_resize_policy")
def test_end_of_step_rewinds_rejected_drafts():
    """Upstream ``test_update_resize_policy`` (``update_resources``): capacity 256, 3 rejected draft tokens,
    201 tokens so far: ``resize(253, 200)``, capacity less the rewind and history = tokens - 1."""
    mgr = kvcm.KVCacheManagerV2(one_layer(), KvCacheConfig(max_tokens=4096), max_batch_size=4, max_seq_len=4096,
                                max_draft_len=4, device="meta")
    mgr.add_request("r")
    assert mgr.resize("r", 252, 199)
    mgr.begin_generation("r", num_draft=3)  # 252 + 1 + 3 = 256
    assert mgr.get_capacity("r") == 256
    mgr.end_generation("r", num_tokens=201, num_draft=3, num_accepted=0)
    assert (mgr.get_capacity("r"), mgr.get_history("r")) == (253, 200)


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_generation_dummy_holds_token_num_plus_extra_plus_reserve(kvcm_version):
    """``add_dummy_requests`` (TensorRT-LLM PR #19213 removed a duplicate + 1): a generation dummy holds
    ``token_num + E + K``; history 31 with one input (token_num 32, E = 0, K = 0) holds 32, one block of 32."""
    mgr = build(kvcm_version, one_layer(), KvCacheConfig(max_tokens=1024))
    [dummy] = mgr.add_dummy_requests(["d"], token_nums=[32], is_gen=True)
    assert dummy.capacity == 32 and mgr.num_blocks_held("d") == [1]


def test_warmup_long_dummy_stops_below_max_seq_len():
    """The model engine's CUDA-graph warmup: ``token_num = max(1, min(available, max_seq_len - 1 - E - K))``.
    A pool larger than S = 100: the long dummy of every shape is 99 tokens."""
    mgr = kvcm.KVCacheManagerV2(one_layer(), KvCacheConfig(max_tokens=4096), max_batch_size=2, max_seq_len=100,
                                device="meta")
    report = kvcm.plan_warmup(mgr)
    assert report.skipped == [] and set(report.long_token_nums.values()) == {99}


def test_v4_typical_length_defaults_to_max_seq_len():
    """``DeepseekV4CacheManager._get_typical_seq_len``: ``avg_seq_len`` if set, else ``max_seq_len``; the
    typical step is one context request and B - 1 decodes of that length."""
    mgr = v4(max_num_tokens=1024)
    assert mgr.typical_step == BatchDesc([KVCacheDesc(1024, 0)] + [KVCacheDesc(8192, 8191)] * 3)
    mgr = v4(cfg=KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=2**30, avg_seq_len=2048))
    assert mgr.typical_step == BatchDesc([KVCacheDesc(2048, 0)] + [KVCacheDesc(2048, 2047)] * 3)


def test_v4_context_constraint_counts_extra_tokens():
    """TensorRT-LLM PR #16173: DeepSeek-V4's chunked-prefill constraint is one fresh request of
    ``max_num_tokens + num_extra_kv_tokens``; beside it the longest decode with B - 1 short requests."""
    mgr = v4(max_num_tokens=1024, num_extra_kv_tokens=1, max_draft_len=2)
    assert mgr.constraint_names == ["context", "longest_decode"]
    assert mgr.constraints[0] == BatchDesc([KVCacheDesc(1025, 0)])
    assert mgr.constraints[1] == BatchDesc([KVCacheDesc(8192, 8191)] + [KVCacheDesc(4, 0)] * 3)


def test_v4_explicit_pool_ratio_means_no_constraints():
    """TensorRT-LLM PR #19213: an explicit ``pool_ratio`` opts DeepSeek-V4 out of its constraints and typical
    step; the ratio splits the budget as given, in life-cycle order."""
    mgr = v4(cfg=KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=3 * 786432 * 10, pool_ratio=(1, 1, 1)))
    assert mgr.constraints == [] and mgr.typical_step is None
    assert [g.num_blocks for g in mgr.layer_groups] == [10, 786432 * 10 // 38016, 786432 * 10 // 1310720]


def test_v1_pool_from_max_tokens_is_whole_blocks():
    """``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (``calculate_max_num_blocks``):
    ``blocks_in_primary_pool = int(max_tokens // tokens_per_block)``. max_tokens 1000 at tpb 32: 31 blocks,
    992 tokens available: no partial block is made for the remaining 8 tokens."""
    mgr = build("v1", one_layer(), KvCacheConfig(max_tokens=1000))
    assert mgr.layer_groups[0].num_blocks == 31
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**4) == 992
