"""The estimation cache's config and CUDA-graph warmup sizing, restated from TensorRT-LLM's
``tensorrt_llm/_torch/pyexecutor/_util.py`` (``KvCacheCreator.try_prepare_estimation``),
``model_engine.py`` (``_create_cuda_graph_warmup_request``, ``_filter_cuda_graph_batch_sizes``) and
``llmapi/llm_args.py`` (``CudaGraphConfig._generate_cuda_graph_batch_sizes``); docs/semantics.md 6 and 7.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.estimation import build_with_estimation
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.warmup import trtllm_cuda_graph_batch_sizes, trtllm_filter_batch_sizes

from _build import GiB

WINDOW_AND_FULL = ModelSpec((LayerSpec(1, 16, "bfloat16", 64, model_layer=0), LayerSpec(1, 16, "bfloat16", model_layer=1)),
                            name="window-and-full")


def _estimate(cfg, free=GiB):
    return build_with_estimation("v2", WINDOW_AND_FULL, cfg, max_batch_size=4, max_seq_len=4096, max_num_tokens=1024,
                                 free_memory_bytes=free, device="meta", warmup=False)


def test_estimation_drops_the_users_pool_ratio():
    """``try_prepare_estimation``: ``kv_cache_config.pool_ratio = None`` and ``avg_seq_len = max_seq_len`` for the
    temporary cache ("User-provided pool sizing can underprovision the temporary estimation cache"), restored for
    the final one: the estimation cache has the context constraint and a typical step, the final cache neither."""
    est = _estimate(KvCacheConfig(max_gpu_total_bytes=GiB // 4, pool_ratio=(1, 3)))
    assert [c["name"] for c in est.estimation["constraints"]] == ["context"]
    assert est.estimation["typical_step"] == [{"count": 1, "capacity": 1024, "history": 0},
                                              {"count": 3, "capacity": 4096, "history": 4095}]
    assert est.manager.constraints == [] and est.manager.typical_step is None


@pytest.mark.parametrize("user_bytes, expected", [(GiB // 4, GiB // 4), (2 * GiB, int(0.9 * GiB))])
def test_estimation_budget_is_the_smaller_of_fraction_and_byte_cap(user_bytes, expected):
    """``try_prepare_estimation`` (V2): ``max_gpu_total_bytes = min(free_gpu_memory_fraction * free,
    max_gpu_total_bytes)`` when the user set one: 1 GiB free at 0.9 against a 256 MiB cap gives 256 MiB, against a
    2 GiB cap 0.9 GiB."""
    est = _estimate(KvCacheConfig(max_gpu_total_bytes=user_bytes))
    assert est.estimation["budget_bytes"] == expected


@pytest.mark.parametrize("reserve, expected", [(0, 100), (4, 96)])
def test_long_dummy_stops_at_the_models_positions_less_reserved_drafts(reserve, expected):
    """``_create_cuda_graph_warmup_request``: ``token_num = min(token_num, max_position_embeddings -
    max_draft_loop_tokens)``. A model of 100 positions served at S = 4096 with a pool far larger: the long dummy
    holds 100 tokens, 96 with 4 reserved draft slots (S - 1 - K would allow 4,095 and 4,091)."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", model_layer=0),), name="short-positions", max_position_embeddings=100)
    mgr = kvcm.KVCacheManagerV2(spec, KvCacheConfig(max_tokens=65536), max_batch_size=2, max_seq_len=4096,
                                max_draft_len=reserve, device="meta")
    report = kvcm.plan_warmup(mgr, draft_lens=[reserve])
    assert report.skipped == [] and set(report.long_token_nums.values()) == {expected}


@pytest.mark.parametrize("max_batch_size, padding, expected", [
    (0, False, list(range(1, 32)) + [32, 64, 128]),
    (0, True, [1, 2, 4] + list(range(8, 129, 8))),
    (600, False, list(range(1, 32)) + [32, 64, 128, 256, 512, 600]),
    (600, True, [1, 2, 4] + list(range(8, 129, 8)) + [192, 256, 320, 384, 448, 512, 576, 600]),
])
def test_default_captured_batch_sizes(max_batch_size, padding, expected):
    """``CudaGraphConfig._generate_cuda_graph_batch_sizes`` (``max_batch_size`` 0 means 128): without padding 1 .. 31,
    32, 64, 128 and the powers of two ``range(8, ceil(log2(max)))``; with padding 1, 2, 4, multiples of 8 to 128,
    then steps of 64; the maximum always last. kvcm's own default is powers of two (docs/semantics.md 10)."""
    assert trtllm_cuda_graph_batch_sizes(max_batch_size, padding) == expected


def test_captured_sizes_filtered_by_batch_and_token_budget():
    """``_filter_cuda_graph_batch_sizes``: sizes up to ``min(B, N // (1 + D))`` (8192 // 4 = 2048, B = 100: 100);
    with padding the first size past the limit becomes the limit (batches of 97 .. 100 pad to 100)."""
    plain = trtllm_filter_batch_sizes(trtllm_cuda_graph_batch_sizes(), 100, 8192, 3)
    padded = trtllm_filter_batch_sizes(trtllm_cuda_graph_batch_sizes(enable_padding=True), 100, 8192, 3,
                                       enable_padding=True)
    assert plain == list(range(1, 32)) + [32, 64]
    assert padded[-3:] == [88, 96, 100]
    assert trtllm_filter_batch_sizes([1, 2, 4], 8, 3, 3) == []
