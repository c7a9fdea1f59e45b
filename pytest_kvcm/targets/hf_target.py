"""transformers' continuous-batching ``PagedAttentionCache`` behind the contract, built standalone (5.18 and later;
``hf_paged_target`` hands 5.17 to ``hf_blocks_target.py``).

Relies on internal API (pinned by ``pytest_kvcm/contract/test_target_apis.py``): ``PagedAttentionCache(config,
ContinuousBatchingConfig, device, DistributedHelper, dtype)``, ``can_store_request_tokens(state, n)`` (checks
and allocates, all or nothing), ``free_blocks(request_id, no_cache=True)``, ``pool.num_free_sectors``,
``pool.count_free_blocks(index)`` and ``pool.try_to_free_sectors()``. The cache hands out *sectors* to one
allocator per attention type; freed blocks stay with their allocator until ``try_to_free_sectors()``, which the
scheduler calls every step, so ``free`` calls it too.
"""

from __future__ import annotations

from .contract import KVCacheTarget, PoolSpec, TargetUnavailable

INSTALL_HINT = ("transformers 5.17 or later is needed, whose continuous batching has a PagedAttentionCache: "
                "pip install 'transformers>=5.17' accelerate")


def hf_paged_target(spec: PoolSpec) -> KVCacheTarget:
    """The ``hf`` target for the transformers installed: the sector pool's adapter (5.18 and later, below) or
    5.17's block pool's (``hf_blocks_target.py``); ``TargetUnavailable`` naming the version where neither API is."""
    blocks = _hf_blocks()
    if blocks is not None:
        from .hf_blocks_target import HfBlocksTarget

        return HfBlocksTarget(spec, blocks)
    return HfPagedTarget(spec)


def hf_517_target(spec: PoolSpec) -> KVCacheTarget:
    """The ``hf-5.17`` target: 5.17's block pool and nothing else, in the venv ``ci/transformers_venv.sh`` builds;
    anywhere else a skip that says how to get there."""
    blocks = _hf_blocks()
    if blocks is None:
        raise TargetUnavailable(
            "transformers 5.17's block pool is not importable in this interpreter; build its venv with "
            "`VENV=$(bash ci/transformers_venv.sh | tail -1)` (transformers==5.17.0) and run `PYTHONPATH=$PWD "
            "$VENV/bin/python -m pytest -p pytest_kvcm.plugin --pyargs pytest_kvcm.contract --kvcm-target=hf-5.17`")
    from .hf_blocks_target import HfBlocksTarget

    return HfBlocksTarget(spec, blocks)


def _hf_blocks():
    """5.17's classes (a block pool shared by the groups, the scheduler deciding the block count), or None where
    the installed release allocates otherwise."""
    try:
        import transformers
        from transformers import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
        from transformers.generation.continuous_batching.distributed import DistributedHelper
        from transformers.generation.continuous_batching.requests import RequestState
        from transformers.generation.continuous_batching.scheduler import FIFOScheduler
    except Exception:  # noqa: BLE001 - absent or another layout: not 5.17's API
        return None
    if not (hasattr(FIFOScheduler, "_allocate_blocks_if_needed") and hasattr(PagedAttentionCache, "allocate_blocks")):
        return None
    return transformers, ContinuousBatchingConfig, PagedAttentionCache, DistributedHelper, RequestState, FIFOScheduler


def _hf():
    """transformers' classes the sector-pool adapter drives, or ``TargetUnavailable`` naming the version installed."""
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
        raise TargetUnavailable(f"{INSTALL_HINT}; transformers {transformers.__version__} is installed, with "
                                f"neither 5.17's block pool nor the sector pool of 5.18 and later "
                                f"({type(exc).__name__}: {exc})") from None
    return transformers, ContinuousBatchingConfig, PagedAttentionCache, DistributedHelper, RequestState


def model_config(spec: PoolSpec):
    """A two-layer config: full attention, plus a sliding-window layer when the spec has a window."""
    import transformers
    kw = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
              vocab_size=128, max_position_embeddings=spec.max_model_len)
    if spec.sliding_window is None:
        return transformers.LlamaConfig(num_hidden_layers=1, **kw)
    return transformers.Gemma2Config(num_hidden_layers=2, sliding_window=spec.sliding_window,
                                     layer_types=["full_attention", "sliding_attention"], **kw)


class HfRequests(KVCacheTarget):
    """What both transformers adapters share: a ``RequestState`` a request, its position the tokens computed, and
    each allocation or growth one call that stores ``n`` more tokens (``_store``, the release's own), all or nothing.
    Subclasses set ``self.full``, ``self.window`` (allocators with a ``block_table``) and ``self._RequestState``."""

    name = "hf"
    window_is_ring = True
    differences = {
        "lookahead": "no speculative slots of its own: lookahead is asked for as more tokens of the request",
        "sliding_window": "a sliding layer keeps a ring of ceil(W / page) pages and reuses it instead of "
                          "releasing pages",
    }

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        self._states = {}      # request id -> its RequestState

    def held_pages(self, rid):
        out = {"full": len(self.full.block_table.get(rid, []))}
        if self.window is not None:
            out["window"] = len(self.window.block_table.get(rid, []))
        return out

    def _store(self, state, num_tokens) -> bool:
        raise NotImplementedError

    def _allocate(self, rid, num_tokens, lookahead):
        state = self._RequestState(rid, [1] * num_tokens)
        state.position_offset = 0
        if not self._store(state, num_tokens + lookahead):
            return False
        self._states[rid] = state
        return True

    def _grow(self, rid, have, num_tokens, lookahead):
        state = self._states[rid]
        state.position_offset = have
        return self._store(state, num_tokens + lookahead)


class HfPagedTarget(HfRequests):
    differences = {
        **HfRequests.differences,
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

    def free_pages(self) -> int:
        pool = self.cache.pool
        return pool.num_free_sectors * self.full.blocks_per_sector + pool.count_free_blocks(self.full.index)

    def _store(self, state, num_tokens) -> bool:
        return self.cache.can_store_request_tokens(state, num_tokens)

    def _free(self, rid):
        self.cache.free_blocks(rid, no_cache=True)
        self.cache.pool.try_to_free_sectors()
        del self._states[rid]
