"""Drive a request made with its token ids through the engine calls, as TensorRT-LLM's executor does: prefill the
unreused rest of the prompt, decode steps that append the accepted token, free. Shared by the reuse tests."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

GiB = 2**30


def build(version: str, tpb: int = 4, blocks: int = 8, spec: ModelSpec | None = None, **cfg):
    """A meta-device manager of ``blocks`` blocks of ``tpb`` tokens per group (one full layer unless ``spec``)."""
    if version == "dsv4":
        ratios = cfg.pop("ratios", (4,))
        return kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(compress_ratios=ratios),
                                           KvCacheConfig(tokens_per_block=tpb, max_tokens=blocks * tpb, **cfg),
                                           max_batch_size=4, max_seq_len=4096, device="meta")
    spec = spec or ModelSpec.uniform(1, 1, 64, "bfloat16", name="one-layer")
    return kvcm.create_kv_cache_manager(version, spec, KvCacheConfig(tokens_per_block=tpb, max_tokens=blocks * tpb,
                                                                     **cfg),
                                        max_batch_size=4, max_seq_len=4096, device="meta")


def swa_spec(window: int) -> ModelSpec:
    """A sliding layer then a full one (two layer groups)."""
    return ModelSpec((LayerSpec(1, 16, "bfloat16", window, model_layer=0), LayerSpec(1, 16, "bfloat16", model_layer=1)),
                     name="swa-full")


def prefill(mgr, rid, tokens, **kw) -> int:
    """add_sequence, then one context chunk for the tokens not reused; returns the prepopulated length."""
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def decode(mgr, rid, *new_tokens) -> None:
    """One generation step per token: its KV is computed, then the token it produced is appended."""
    for tok in new_tokens:
        num = mgr.get_history(rid) + 2
        mgr.begin_generation(rid)
        mgr.end_generation(rid, num)
        mgr.append_tokens(rid, [tok])


def run(mgr, rid, tokens, *generated, **kw) -> int:
    """A whole request: prefill, the first sampled token appended, decode steps, free."""
    n = prefill(mgr, rid, tokens, **kw)
    if generated:
        mgr.append_tokens(rid, [generated[0]])
        decode(mgr, rid, *generated[1:])
    mgr.free_resources(rid)
    return n


def counts_add_up(mgr) -> None:
    """free + reusable + in use == total for every group, and the free count an engine reads is free + reusable."""
    for g in range(len(mgr.pools)):
        c = mgr.get_block_counts(g)
        assert c.free + c.reusable + c.in_use == c.total, (g, c)
        assert c.free == mgr.pools[g].num_free and c.reusable == mgr.pools[g].num_reusable, (g, c)
    c = mgr.get_block_counts()
    assert mgr.get_kv_cache_stats().free_num_blocks == c.free + c.reusable
