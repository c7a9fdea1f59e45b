"""kvcm's own managers behind the contract: V1 (token counting), V2 (capacity/history) and DeepSeek-V4."""

from __future__ import annotations

from .contract import KVCacheTarget, PoolSpec


def _model(spec: PoolSpec):
    from kvcm import LayerSpec, ModelSpec

    layers = [LayerSpec(2, 16, "bfloat16", None, model_layer=0)]
    if spec.sliding_window is not None:
        layers.append(LayerSpec(2, 16, "bfloat16", spec.sliding_window, model_layer=1))
    return ModelSpec(tuple(layers), name="contract")


class _KvcmTarget(KVCacheTarget):
    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        self.manager = self._build(spec)
        self.page_size = self.manager.tokens_per_block
        self.total_pages = min(g.num_blocks for g in self.manager.layer_groups if g.is_full)

    def _build(self, spec: PoolSpec):
        raise NotImplementedError

    def free_pages(self) -> int:
        return self.manager.get_num_free_blocks()

    def held_pages(self, rid: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for g, n in zip(self.manager.layer_groups, self.manager.num_blocks_held(rid)):
            key = "full" if g.is_full else "window"
            out[key] = max(out.get(key, 0), n)
        return out

    def _free(self, rid: str) -> None:
        self.manager.free_resources(rid)

    def startup_accepts(self, spec: PoolSpec, max_num_batched_tokens: int, async_scheduling: bool = False) -> bool:
        """kvcm's own start-up rule (kvcm/startup.py); async scheduling does not change it (one batch in flight)."""
        from kvcm import startup

        windows = (None,) if spec.sliding_window is None else (None, spec.sliding_window)
        return startup.accepts(spec.num_pages, spec.page_size, spec.max_model_len, windows=windows,
                               reserved_pages=self.reserved_pages, max_num_batched_tokens=max_num_batched_tokens)

    # ---- the engine's own capacity query (TensorRT-LLM's surface; vLLM and transformers have none) ------------
    def available_tokens(self, bound: int, batch_size: int = 1, lookahead: int = 0) -> int:
        return self.manager.get_num_available_tokens(token_num_upper_bound=bound, batch_size=batch_size,
                                                     max_num_draft_tokens=lookahead)

    def allocate_generation(self, rids: list[str], token_nums: list[int], lookahead: int = 0) -> bool:
        """Generation-shaped requests (history = tokens - 1), as warmup dummies and decode steps are."""
        made = self.manager.add_dummy_requests(list(rids), token_nums=list(token_nums), is_gen=True,
                                               max_num_draft_tokens=lookahead)
        if made is not None:
            self._tokens.update(zip(rids, token_nums))
        return made is not None


class KvcmV2Target(_KvcmTarget):
    """V2: ``resize(capacity, history)``; capacity only grows here, as engines' schedulers do."""

    name = "kvcm-v2"

    def _build(self, spec: PoolSpec):
        from kvcm import KvCacheConfig, KVCacheManagerV2

        cfg = KvCacheConfig(tokens_per_block=spec.page_size, max_tokens=spec.num_pages * spec.page_size)
        return KVCacheManagerV2(_model(spec), cfg, max_batch_size=spec.max_batch_size, max_seq_len=spec.max_model_len,
                                max_draft_len=spec.max_lookahead)

    def _allocate(self, rid, num_tokens, lookahead):
        self.manager.add_request(rid)
        if self.manager.resize(rid, num_tokens + lookahead, 0):
            return True
        self.manager.free_resources(rid)
        return False

    def _grow(self, rid, have, num_tokens, lookahead):
        capacity = max(self.manager.get_capacity(rid), have + num_tokens + lookahead)
        return self.manager.resize(rid, capacity, have)


class KvcmV4Target(KvcmV2Target):
    """DeepSeek-V4 on kvcm: pages of 128 or 256 tokens, compressed and sliding groups beside the full one."""

    name = "kvcm-v4"
    differences = {"page_size": "DeepSeek-V4 pages hold 128 or 256 tokens; the spec's page_size is rounded up to 128",
                   "free_pages": "several pools (compressed, indexer, sliding) of one page count each: a new prompt "
                                 "takes a page in every one, so free pages are the smallest pool's free count",
                   "exact_pool_size": "the token quota is split between pools by a typical step: each pool holds at "
                                      "least the pages asked, the full-length ones more",
                   "window": "the sliding window is W + max_draft_len (docs/semantics.md 5)"}

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        self.total_pages = self.free_pages()

    def free_pages(self) -> int:
        return min(pool.num_free for pool in self.manager.pools)

    def _build(self, spec: PoolSpec):
        from kvcm import DeepseekV4CacheManager, DeepseekV4Spec, KvCacheConfig

        tpb = 256 if spec.page_size > 128 else 128
        cfg = KvCacheConfig(tokens_per_block=tpb, max_tokens=spec.num_pages * tpb)
        self.window_tokens = None if spec.sliding_window is None else spec.sliding_window + spec.max_lookahead
        model = DeepseekV4Spec(compress_ratios=(4, 128), window_size=spec.sliding_window or 128)
        return DeepseekV4CacheManager(model, cfg, max_batch_size=spec.max_batch_size,
                                      max_seq_len=spec.max_model_len, max_draft_len=spec.max_lookahead)


class KvcmV1Target(_KvcmTarget):
    """V1: a token count per request in every pool; sliding-window pages are never released (docs/semantics.md 3)."""

    name = "kvcm-v1"
    releases_window_pages = False
    differences = {"sliding_window": "V1 keeps every page of a sliding-window layer; the window only bounds reads",
                   "startup_window": "V1 keeps every page of a sliding-window layer, so no window bound applies"}

    def _build(self, spec: PoolSpec):
        from kvcm import KvCacheConfig, KVCacheManagerV1

        cfg = KvCacheConfig(tokens_per_block=spec.page_size, max_tokens=spec.num_pages * spec.page_size)
        return KVCacheManagerV1(_model(spec), cfg, max_batch_size=spec.max_batch_size, max_seq_len=spec.max_model_len,
                                max_draft_len=spec.max_lookahead)

    def _allocate(self, rid, num_tokens, lookahead):
        from kvcm import OutOfPagesError

        try:
            self.manager.begin_context_chunk(rid, 0, num_tokens, num_tokens, draft_len=lookahead)
        except OutOfPagesError:
            return False
        return True

    def _grow(self, rid, have, num_tokens, lookahead):
        from kvcm import OutOfPagesError

        missing = have + num_tokens + lookahead - self.manager.get_capacity(rid)
        if missing <= 0:
            return True
        try:
            self.manager.add_tokens(rid, missing)
        except OutOfPagesError:
            return False
        return True
