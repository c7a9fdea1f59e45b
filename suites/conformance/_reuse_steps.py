"""The engine's calls for a request made with its token ids, for the reuse conformance cases: TensorRT-LLM's tests
call ``addSequence`` / ``addNewToken`` / ``releaseBlocks``; kvcm's managers take the same steps as
``add_sequence``, a context chunk, generation steps with ``append_tokens``, ``free_resources``."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec


def manager(version: str, tpb: int = 4, blocks: int = 8, window: int | None = None, host_blocks: int = 0,
            **cfg):
    """One attention layer (sliding when ``window``), ``blocks`` blocks of ``tpb`` tokens, meta device;
    ``host_blocks`` secondary blocks (``host_cache_size`` of that many blocks' bytes: 2 * 64 * 2 bytes a token)."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", window, model_layer=0),), name="one-layer")
    if host_blocks:
        cfg["host_cache_size"] = host_blocks * tpb * 2 * 64 * 2
    return kvcm.create_kv_cache_manager(version, spec, KvCacheConfig(tokens_per_block=tpb, max_tokens=blocks * tpb,
                                                                     **cfg),
                                        max_batch_size=8, max_seq_len=4096, device="meta")


def v4(tpb: int = 128, blocks: int = 8, **cfg):
    return kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(compress_ratios=(4, 128)),
                                       KvCacheConfig(tokens_per_block=tpb, max_tokens=blocks * tpb, **cfg),
                                       max_batch_size=4, max_seq_len=8192, device="meta")


def add(mgr, rid, tokens, **kw) -> int:
    """``addSequence``: the match and the context's pages; returns the context position (prepopulated length)."""
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def new_tokens(mgr, rid, *tokens) -> None:
    """``addNewToken`` for each: the first is the context's sampled token, each later one a generation step."""
    mgr.append_tokens(rid, [tokens[0]])
    for tok in tokens[1:]:
        num = mgr.get_history(rid) + 2
        mgr.begin_generation(rid)
        mgr.end_generation(rid, num)
        mgr.append_tokens(rid, [tok])


def allocated(mgr) -> int:
    """``getNumAllocatedBlocks``: blocks some request holds (group 0)."""
    return mgr.get_block_counts(0).in_use
