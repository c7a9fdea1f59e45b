"""transformers' continuous-batching ``PagedAttentionCache`` behind the contract, built standalone.

Relies on internal API (pinned by ``pytest_kvcm/contract/test_target_apis.py``): ``PagedAttentionCache(config,
ContinuousBatchingConfig, device, DistributedHelper, dtype)``, ``can_store_request_tokens(state, n)`` (checks
and allocates, all or nothing), ``free_blocks(request_id, no_cache=True)``, ``pool.num_free_sectors``,
``pool.count_free_blocks(index)`` and ``pool.try_to_free_sectors()``. The cache hands out *sectors* to one
allocator per attention type; freed blocks stay with their allocator until ``try_to_free_sectors()``, which the
scheduler calls every step, so ``free`` calls it too.
"""

from __future__ import annotations

from .contract import KVCacheTarget, PoolSpec, TargetUnavailable

INSTALL_HINT = ("transformers>=5.18 is needed, whose continuous-batching cache hands out sectors from one pool "
                "(5.17's allocates per layer group, with another API): pip install 'transformers>=5.18' accelerate")


def _hf():
    """transformers' classes the adapter drives, or ``TargetUnavailable`` naming the version installed: kvcm's engine
    runs on 5.17 (the GPU machine's), this adapter only on the sector pool 5.18 brought."""
    try:
        import transformers
    except Exception as exc:
        raise TargetUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    try:
        from transformers import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
        from transformers.generation.continuous_batching.cache_allocators.cache_pool import CachePool  # noqa: F401
        from transformers.generation.continuous_batching.distributed import DistributedHelper
        from transformers.generation.continuous_batching.requests import RequestState
    except Exception as exc:
        raise TargetUnavailable(f"{INSTALL_HINT}; transformers {transformers.__version__} is installed "
                                f"({type(exc).__name__}: {exc})") from None
    return transformers, ContinuousBatchingConfig, PagedAttentionCache, DistributedHelper, RequestState


def model_config(spec: PoolSpec):
    """A two-layer config: full attention, plus a sliding-window layer when the spec has a window."""
    transformers = _hf()[0]
    kw = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
              vocab_size=128, max_position_embeddings=spec.max_model_len)
    if spec.sliding_window is None:
        return transformers.LlamaConfig(num_hidden_layers=1, **kw)
    return transformers.Gemma2Config(num_hidden_layers=2, sliding_window=spec.sliding_window,
                                     layer_types=["full_attention", "sliding_attention"], **kw)


class HfPagedTarget(KVCacheTarget):
    name = "hf"
    window_is_ring = True
    differences = {
        "lookahead": "no speculative slots of its own: lookahead is asked for as more tokens of the request",
        "sliding_window": "a sliding layer keeps a ring of ceil(W / page) pages and reuses it instead of "
                          "releasing pages",
        "units": "pages come in sectors; free pages = free sectors x pages per sector + the allocator's free pages",
    }

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        _, CBConfig, PagedAttentionCache, DistributedHelper, self._RequestState = _hf()
        import torch

        cb = CBConfig(page_size=spec.page_size, num_blocks=spec.num_pages, max_batch_tokens=64,
                      allow_block_sharing=False, max_memory_percent=0.9)
        self.cache = PagedAttentionCache(model_config(spec), cb, "cpu", DistributedHelper(None, 300.0),
                                         dtype=torch.float32)
        self.full = self.cache.cache_allocators["full_attention"]
        self.window = self.cache.cache_allocators.get("sliding_attention")
        self.page_size, self.total_pages = spec.page_size, self.full.num_blocks
        self._states = {}

    def free_pages(self) -> int:
        pool = self.cache.pool
        return pool.num_free_sectors * self.full.blocks_per_sector + pool.count_free_blocks(self.full.index)

    def held_pages(self, rid):
        out = {"full": len(self.full.block_table.get(rid, []))}
        if self.window is not None:
            out["window"] = len(self.window.block_table.get(rid, []))
        return out

    def _allocate(self, rid, num_tokens, lookahead):
        state = self._RequestState(rid, [1] * num_tokens)
        state.position_offset = 0
        if not self.cache.can_store_request_tokens(state, num_tokens + lookahead):
            return False
        self._states[rid] = state
        return True

    def _grow(self, rid, have, num_tokens, lookahead):
        state = self._states[rid]
        state.position_offset = have
        return self.cache.can_store_request_tokens(state, num_tokens + lookahead)

    def _free(self, rid):
        self.cache.free_blocks(rid, no_cache=True)
        self.cache.pool.try_to_free_sectors()
        del self._states[rid]
