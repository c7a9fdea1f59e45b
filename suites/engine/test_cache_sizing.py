"""The engine's cache for a sliding-window model: one pool per window group, B windows each (vLLM PR #14097:
not sized as global layers; vLLM issue #49878: one window per request, not two in-flight allowances)."""

import pytest

import kvcm
from kvcm.engine import LLM
from kvcm.models import tiny_model
from kvcm.versions import NAMES as ALL_VERSIONS


@pytest.mark.parametrize("batch", [2, 4])
def test_sliding_window_model_gets_window_sized_pools(batch):
    model, _ = tiny_model("mistral", seed=0)  # every layer slides, window 16
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=512, dtype="float32")
    llm = LLM(model, kvcm_version="v2", kv_cache_config=cfg, device="cpu", max_batch_size=batch, max_seq_len=96)
    try:
        groups = llm.manager.layer_groups
        assert [g.window for g in groups] == [16], [(g.name, g.window) for g in groups]
        assert groups[0].num_blocks == batch * (16 // 8 + 1)
    finally:
        llm.close()


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_engine_cache_holds_the_tokens_asked_after_estimation(kvcm_version):
    """TensorRT-LLM PR #15881: warmup on the estimation cache must not shrink the final cache below max_tokens."""
    model, _ = tiny_model("llama", seed=0)
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=2048, dtype="float32")
    llm = LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, device="cpu", max_batch_size=4, max_seq_len=96,
              cuda_graph=True)
    try:
        assert len(llm.warmup_reports) >= 2, "estimation and final warmups ran"
        assert llm.manager.max_tokens == 2048
    finally:
        llm.close()
