"""The token count TensorRT-LLM's estimation step gives its temporary V2 cache, restated from
``tests/unittest/_torch/executor/test_kv_cache_estimation.py`` (``KvCacheCreator._get_token_num_for_estimation``
in ``tensorrt_llm/_torch/pyexecutor/_util.py``); kvcm's own estimation cache keeps the byte budget instead
(docs/semantics.md 10, "estimation ``max_tokens``")."""

from __future__ import annotations

import pytest

from kvcm.estimation_tokens import (dummy_context_lengths, extra_tokens_per_request,
                                    trtllm_estimation_max_tokens)


def _tokens(lengths, tpb=64, **kw):
    kw.setdefault("max_seq_len", 1)
    kw.setdefault("max_batch_size", 1)
    kw.setdefault("max_cuda_graph_batch_size", 1)
    return trtllm_estimation_max_tokens(tpb, lengths, **kw)


@pytest.mark.upstream("test_without_adp_all_blocks_counted")
def test_without_adp_all_blocks_counted():
    """``test_without_adp_all_blocks_counted``: 4 requests of 128 tokens (+1 generated: 3 blocks of 64 each):
    4 x 3 x 64 = 768 tokens."""
    assert _tokens([128] * 4) == 768


@pytest.mark.parametrize("tp_size", [2, 4, 8])
@pytest.mark.upstream("test_adp_various_tp_sizes", "test_regression_without_fix_would_overcount")
def test_adp_reduces_blocks_to_per_rank_share(tp_size):
    """``test_adp_various_tp_sizes`` / ``test_regression_without_fix_would_overcount``: with attention DP the
    tp_size copies of a 128-token dummy cost one rank ``ceil(3 tp / tp) = 3`` blocks, 192 tokens, not 192 x tp."""
    assert _tokens([128] * tp_size, attention_dp_size=tp_size) == 192 == _tokens([128])


@pytest.mark.upstream("test_gemma4_hybrid_scales_by_num_pool_groups",
                      "test_pool_scaling_prevents_mmmu_pro_underestimation")
def test_two_pool_groups_double_the_estimate_and_hold_a_max_seq_len_request_each():
    """``test_gemma4_hybrid_scales_by_num_pool_groups`` and ``test_pool_scaling_prevents_mmmu_pro_underestimation``:
    S = 12288 at tpb 32, dummies of 12,287 and 1 tokens (+1 each: 384 + 1 blocks), CUDA-graph batch 4 but engine
    batch 1 (``ceil(12289 / 32) = 385`` blocks): 385 blocks; two pool groups double it: 24,640 tokens, 12,320 a
    pool >= S."""
    kw = dict(tpb=32, max_seq_len=12288, max_cuda_graph_batch_size=4)
    one = _tokens([12287, 1], **kw)
    two = _tokens([12287, 1], num_pool_groups=2, **kw)
    assert (one, two) == (12320, 24640) and two // 2 >= 12288


def test_dummy_requests_fill_max_num_tokens():
    """``_create_dummy_context_requests(max(1, S - 1))``: prompts of ``min(N, S - 1)`` tokens until N is used; with
    speculation each holds the draft tokens twice under the overlap scheduler, plus the extra KV tokens."""
    assert dummy_context_lengths(8192, 4096) == [4095, 4095, 2]
    assert dummy_context_lengths(1024, 4096) == [1024]
    assert extra_tokens_per_request() == 1
    assert extra_tokens_per_request(3, 1, speculative=True) == 8
    assert extra_tokens_per_request(3, 1, speculative=True, overlap_scheduler=False) == 5
