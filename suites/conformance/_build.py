"""Small managers for the conformance cases: meta device, sizes chosen so the upstream numbers carry over."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

GiB = 2**30


def build(kvcm_version: str, spec, cfg: KvCacheConfig | None = None, **limits):
    """``kvcm.create_kv_cache_manager`` on the meta device with B=4, S=65536 unless given."""
    limits.setdefault("max_batch_size", 4)
    limits.setdefault("max_seq_len", 65536)
    limits.setdefault("device", "meta")
    return kvcm.create_kv_cache_manager(kvcm_version, spec, cfg, **limits)


def one_layer(num_kv_heads: int = 1, head_dim: int = 64, dtype: str = "bfloat16") -> ModelSpec:
    """One full-attention layer; at the default 1 x 64 bf16 a token is 256 bytes, a 32-token block 8 KiB."""
    return ModelSpec.uniform(1, num_kv_heads, head_dim, dtype, name="one-layer")


def sliding_then_full(window: int = 64, width: int = 16, sink_tokens: int = 0) -> ModelSpec:
    """A sliding layer first, then a full one (Gemma's order): TensorRT-LLM numbers the sliding life cycle 0."""
    return ModelSpec((LayerSpec(1, width, "bfloat16", window, sink_tokens=sink_tokens, model_layer=0),
                      LayerSpec(1, width, "bfloat16", model_layer=1)), name="sliding-then-full")


def v4(ratios=(4, 128), cfg: KvCacheConfig | None = None, **limits):
    """A DeepSeek-V4 manager (head 512, indexer head 128, window 128) at tpb 128 unless ``cfg`` says otherwise."""
    spec = kvcm.DeepseekV4Spec(compress_ratios=tuple(ratios))
    limits.setdefault("max_batch_size", 4)
    limits.setdefault("max_seq_len", 8192)
    limits.setdefault("device", "meta")
    cfg = cfg or KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=GiB)
    return kvcm.DeepseekV4CacheManager(spec, cfg, **limits)
