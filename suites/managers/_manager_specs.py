"""Small model specs shared by the manager suites: sizes chosen so the block arithmetic is easy by hand."""

from __future__ import annotations


import kvcm
from kvcm.model_spec import LayerSpec, ModelSpec

GiB = 2**30


def tiny_spec(num_layers: int = 2) -> ModelSpec:
    """``num_layers`` layers of 1 KV head x 16 dims, bf16: 2 x 1 x 16 x 2 = 64 bytes a token a layer.

    With tpb 32 and two layers a block is 2 x 64 x 32 = 4096 bytes.
    """
    return ModelSpec.uniform(num_layers, 1, 16, "bfloat16", name="tiny")


def swa_spec(window: int = 64, sink_tokens: int = 0) -> ModelSpec:
    """One full layer and one sliding layer (1 head x 16 dims, bf16): 2048 bytes a block each at tpb 32."""
    return ModelSpec((LayerSpec(1, 16, "bfloat16", model_layer=0),
                      LayerSpec(1, 16, "bfloat16", window, sink_tokens=sink_tokens, model_layer=1)), name="swa")



def build(kvcm_version: str, spec, cfg=None, **kw):
    """A meta-device manager with small defaults (B=4, S=4096)."""
    kw.setdefault("max_batch_size", 4)
    kw.setdefault("max_seq_len", 4096)
    kw.setdefault("device", "meta")
    return kvcm.create_kv_cache_manager(kvcm_version, spec, cfg, **kw)
