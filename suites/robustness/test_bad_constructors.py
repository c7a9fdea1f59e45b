"""Bad values for the public constructors: ``KvCacheConfig``, ``LayerSpec``, ``ModelSpec``, ``DeepseekV4Spec``
and ``create_kv_cache_manager``. Each raises ``ConfigError`` (a ``ValueError``) naming the field, the value and
the limit; none is silently accepted or surfaces as a raw ``TypeError`` from deep inside the sizing code.
"""

from __future__ import annotations

import math

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

SPEC = ModelSpec.uniform(2, 1, 16)
CFG = KvCacheConfig(max_tokens=1024)


def _mgr(kvcm_version="v2", spec=SPEC, cfg=CFG, **kw):
    kw = {"max_batch_size": 4, "max_seq_len": 256, "device": "meta"} | kw
    return kvcm.create_kv_cache_manager(kvcm_version, spec, cfg, **kw)


# (case id, call, field, value, limit fragment)
CASES = [
    ("tpb_float", lambda: KvCacheConfig(tokens_per_block=32.0), "tokens_per_block", 32.0, "must be an integer"),
    ("tpb_bool", lambda: KvCacheConfig(tokens_per_block=True), "tokens_per_block", True, "not a bool"),
    ("tpb_string", lambda: KvCacheConfig(tokens_per_block="32"), "tokens_per_block", "32", "must be an integer"),
    ("tpb_negative", lambda: KvCacheConfig(tokens_per_block=-32), "tokens_per_block", -32, "power of two"),
    ("max_tokens_float", lambda: KvCacheConfig(max_tokens=1.5e3), "max_tokens", 1.5e3, "must be an integer"),
    ("fraction_nan", lambda: KvCacheConfig(free_gpu_memory_fraction=math.nan), "free_gpu_memory_fraction",
     math.nan, "(0, 1)"),
    ("fraction_inf", lambda: KvCacheConfig(free_gpu_memory_fraction=math.inf), "free_gpu_memory_fraction",
     math.inf, "(0, 1)"),
    ("fraction_string", lambda: KvCacheConfig(free_gpu_memory_fraction="0.5"), "free_gpu_memory_fraction", "0.5",
     "must be a number, not str"),
    ("pool_ratio_inf", lambda: KvCacheConfig(pool_ratio=(1, math.inf)), "pool_ratio", (1, math.inf), "positive"),
    ("pool_ratio_empty", lambda: KvCacheConfig(pool_ratio=()), "pool_ratio", (), "positive weight"),
    ("pool_ratio_string", lambda: KvCacheConfig(pool_ratio="11"), "pool_ratio", "11", "positive weight"),
    ("unknown_field", lambda: KvCacheConfig(tokens_per_blok=64), "KvCacheConfig.tokens_per_blok", 64,
     "is not a field"),
    ("dtype_unknown", lambda: KvCacheConfig(dtype="int3"), "dtype", "int3", "one of"),
    ("layer_heads_float", lambda: LayerSpec(1.5, 64), "num_kv_heads", 1.5, "must be an integer"),
    ("layer_window_zero", lambda: LayerSpec(1, 64, sliding_window=0), "sliding_window", 0, ">= 1"),
    ("layer_sinks_negative", lambda: LayerSpec(1, 64, sink_tokens=-1), "sink_tokens", -1, ">= 0"),
    ("layer_dtype", lambda: LayerSpec(1, 64, "int8"), "LayerSpec.dtype", "int8", "one of"),
    ("model_no_layers", lambda: ModelSpec(()), "layers", (), "at least one attention layer"),
    ("model_layers_not_specs", lambda: ModelSpec([{"num_kv_heads": 0, "head_dim": 8}]), "layers",
     [{"num_kv_heads": 0, "head_dim": 8}], "LayerSpec"),
    ("model_preferred_v3", lambda: ModelSpec(SPEC.layers, preferred_manager="v3"), "preferred_manager", "v3",
     "one of None, 'v1', 'v2'"),
    ("model_positions_zero", lambda: ModelSpec(SPEC.layers, max_position_embeddings=0), "max_position_embeddings",
     0, ">= 1"),
    ("v4_ratio", lambda: kvcm.DeepseekV4Spec(compress_ratios=(4, 16)), "compress_ratios", (4, 16), "1, 4, 128"),
    ("v4_window_negative", lambda: kvcm.DeepseekV4Spec(window_size=-1), "window_size", -1, ">= 1"),
    ("manager_batch_zero", lambda: _mgr(max_batch_size=0), "max_batch_size", 0, ">= 1"),
    ("manager_batch_absurd", lambda: _mgr(max_batch_size=100_000_000), "max_batch_size", 100_000_000,
     "<= 65536"),
    ("manager_seq_len_float", lambda: _mgr(max_seq_len=256.0), "max_seq_len", 256.0, "must be an integer"),
    ("manager_draft_negative", lambda: _mgr(max_draft_len=-1), "max_draft_len", -1, ">= 0"),
    ("manager_free_memory_negative", lambda: _mgr(cfg=KvCacheConfig(), free_memory_bytes=-1), "free_memory_bytes",
     -1, ">= 0"),
    ("manager_device", lambda: _mgr(device="gpu7"), "device", "gpu7", "torch device"),
    ("manager_model_dict", lambda: _mgr(spec={"num_hidden_layers": 2}), "model", "dict", "kvcm.ModelSpec"),
    ("manager_config_dict", lambda: _mgr(cfg={"max_tokens": 64}), "kv_cache_config", "dict", "KvCacheConfig"),
    ("factory_version", lambda: _mgr("V2"), "kvcm_version", "V2", "one of"),
]


@pytest.mark.parametrize("make, field, value, limit", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_constructor_rejects_with_field_value_limit(make, field, value, limit):
    with pytest.raises(kvcm.ConfigError) as info:
        make()
    err = info.value
    assert isinstance(err, ValueError)
    assert err.field == field
    assert err.value == value or (value != value and err.value != err.value)  # NaN is not equal to itself
    assert limit in str(err) and str(err).startswith(f"{field}=")


def test_good_values_still_build():
    """The checks do not reject what engines pass: lists for tuples, integer-valued numpy-free ints, 'auto'."""
    cfg = KvCacheConfig(tokens_per_block=64, pool_ratio=[1, 2], free_gpu_memory_fraction=1 / 2, dtype="auto")
    assert cfg.pool_ratio == (1.0, 2.0) and cfg.replace(max_tokens=640).max_tokens == 640
    spec = ModelSpec([LayerSpec(1, 16, "fp16", 8, model_layer=0), LayerSpec(1, 16, model_layer=1)])
    assert spec.layers[0].sliding_window == 8 and spec.with_dtype("bf16").layers[0].dtype is not None
    assert _mgr("v1", spec).max_batch_size == 4
