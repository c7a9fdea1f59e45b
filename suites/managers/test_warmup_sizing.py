"""Warmup sizing through the estimation path (``kvcm.build_with_estimation``): the long dummy's cap at the
model's positions and upstream's captured batch sizes, as an engine would plan them (docs/semantics.md 7)."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.warmup import trtllm_cuda_graph_batch_sizes, warmup_shapes

SHORT = ModelSpec((LayerSpec(1, 64, "bfloat16", model_layer=0),), name="short-positions", max_position_embeddings=512)


def test_estimation_and_final_warmups_stop_at_the_models_positions():
    """TensorRT-LLM ``model_engine.py`` caps the long dummy at ``max_position_embeddings - K``: a 512-position model
    served at S = 2048 with 2 draft slots warms up dummies of 510 tokens on both caches, every shape captured."""
    est = kvcm.build_with_estimation("v2", SHORT, KvCacheConfig(max_tokens=1 << 16), max_batch_size=4,
                                     max_seq_len=2048, max_draft_len=2, device="meta", free_memory_bytes=1 << 30)
    for report in est.warmups:
        assert report.ok and set(report.long_token_nums.values()) == {510}


def test_upstream_batch_sizes_plan_every_size_up_to_the_maximum():
    """``CudaGraphConfig(max_batch_size=600)``'s sizes given to the warmup plan: 37 sizes, 512 among them (the
    power of two below 600), largest first."""
    mgr = kvcm.KVCacheManagerV2(SHORT, KvCacheConfig(max_tokens=1 << 16), max_batch_size=600, max_seq_len=512,
                                device="meta")
    sizes = [s.batch_size for s in warmup_shapes(mgr, batch_sizes=trtllm_cuda_graph_batch_sizes(600))]
    assert sizes[:3] == [600, 512, 256] and len(sizes) == 37
