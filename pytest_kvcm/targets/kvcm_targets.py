"""kvcm's own managers behind the contract: V1 (token counting), V2 (capacity/history) and DeepSeek-V4."""

from __future__ import annotations

import dataclasses

from .contract import KVCacheTarget, PoolSpec


def _events(spec: PoolSpec, tpb: int) -> dict:
    """Events on (a queue no contract test fills) and a host tier of ``spec.host_pages`` pages a group, as asked."""
    out = {"event_buffer_max_size": 1 << 16} if spec.events else {}
    if spec.host_pages:
        out["host_cache_size"] = spec.host_pages * _model(spec).bytes_per_token() * tpb
    return out


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

    # ---- block reuse: add_sequence with the prompt's ids, reserved and computed at once -------------------------
    supports_reuse = True

    def _config(self, spec: PoolSpec, tpb: int | None = None):
        """Reuse as the spec asks, whole blocks only (vLLM has no partial reuse; the contract tests what both do)."""
        from kvcm import KvCacheConfig

        tpb = tpb or spec.page_size
        return KvCacheConfig(tokens_per_block=tpb, max_tokens=spec.num_pages * tpb, enable_block_reuse=spec.reuse,
                             enable_partial_reuse=False, **_events(spec, tpb))

    def _allocate_prompt(self, rid, token_ids):
        """Admission first, as TensorRT-LLM's scheduler (PR #11490): the prompt's blocks less its cached whole
        blocks must fit in the free count less the cached blocks it will hold rather than evict; then
        ``add_sequence``, the context chunk and its end (the blocks are stored as the version stores them)."""
        m, n, tpb = self.manager, len(token_ids), self.page_size
        matched = m.count_reusable_blocks(token_ids, only_allocated=False)
        held = m.count_reusable_blocks(token_ids, only_allocated=True)
        fresh = -(-n // tpb) - matched
        if fresh > m.get_num_free_blocks() - (matched - held):
            return None
        reused = m.add_sequence(rid, token_ids)
        m.begin_context_chunk(rid, reused, n - reused, n)
        m.end_context_chunk(rid, n)
        return reused

    def lookup(self, token_ids) -> int:
        return self.manager.count_reusable_blocks(list(token_ids), only_allocated=False) * self.page_size

    # ---- KV cache events (TensorRT-LLM's; kvcm/events/) --------------------------------------------------------
    supports_events = True
    supports_host_tier = True

    def take_events(self) -> list:
        from .events import from_kvcm

        self.manager.flush_iteration_events()
        return from_kvcm(self.manager.get_latest_events(0))

    def cached_blocks(self) -> dict:
        from kvcm.events.shadow import cached_blocks

        return {key: level for key, (_, level) in cached_blocks(self.manager).items()}

    def cached_pages(self) -> int:
        return self.manager.get_block_counts().reusable

    def reset_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

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
        from kvcm import KVCacheManagerV2

        cfg = self._config(spec)
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
    supports_host_tier = False      # DeepSeek-V4 refuses host_cache_size (docs/semantics.md 11.7)
    differences = {"page_size": "DeepSeek-V4 pages hold 128 or 256 tokens; the spec's page_size is rounded up to 128",
                   "free_pages": "several pools (compressed, indexer, sliding) of one page count each: a new prompt "
                                 "takes a page in every one, so free pages are the smallest pool's free and cached "
                                 "pages",
                   "exact_pool_size": "the token quota is split between pools by a typical step: a pool holds more "
                                      "or fewer pages than asked (the full-length ones more, a window's fewer)",
                   "window": "the sliding window is W + max_draft_len (docs/semantics.md 5)"}
    # reuse: asked with partial reuse on (TensorRT-LLM's default), which DeepSeek-V4 must force off

    def _allocate_prompt(self, rid, token_ids):
        """Pools of different needs per token: no single free count to admit by, so try and undo."""
        from kvcm import OutOfPagesError

        m, n = self.manager, len(token_ids)
        try:
            reused = m.add_sequence(rid, token_ids)
            m.begin_context_chunk(rid, reused, n - reused, n)
        except OutOfPagesError:
            if m.has_request(rid):
                m.free_resources(rid)
            return None
        m.end_context_chunk(rid, n)
        return reused

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        self.total_pages = self.free_pages()

    def free_pages(self) -> int:
        """The smallest pool's pages a new prompt could take: its free pages and its cached ones nobody holds
        (an allocation evicts them), as the contract counts free pages for every target."""
        counts = (self.manager.get_block_counts(g) for g in range(len(self.manager.pools)))
        return min(c.free + c.reusable for c in counts)

    def _build(self, spec: PoolSpec):
        from kvcm import DeepseekV4CacheManager, DeepseekV4Spec, KvCacheConfig

        tpb = 256 if spec.page_size > 128 else 128
        cfg = KvCacheConfig(tokens_per_block=tpb, max_tokens=spec.num_pages * tpb, enable_block_reuse=spec.reuse,
                            enable_partial_reuse=True, **_events(dataclasses.replace(spec, host_pages=0), tpb))
        self.window_tokens = None if spec.sliding_window is None else spec.sliding_window + spec.max_lookahead
        model = DeepseekV4Spec(compress_ratios=(4, 128), window_size=spec.sliding_window or 128)
        return DeepseekV4CacheManager(model, cfg, max_batch_size=spec.max_batch_size,
                                      max_seq_len=spec.max_model_len, max_draft_len=spec.max_lookahead)


class KvcmV1Target(_KvcmTarget):
    """V1: a token count per request in every pool; sliding-window pages are never released (docs/semantics.md 3)."""

    name = "kvcm-v1"
    releases_window_pages = False
    reuse_oracle = "v1"
    differences = {"sliding_window": "V1 keeps every page of a sliding-window layer; the window only bounds reads",
                   "window_stored_at_release": "sliding-window blocks are stored at release only (TensorRT-LLM: SWA "
                                               "cannot store new blocks on the fly): while the first request runs, "
                                               "a hybrid model's hit is the shortest over groups, 0",
                   "last_prompt_block": "TensorRT-LLM V1 stores the prompt less its last token at context end: the "
                                        "block that holds a block-aligned prompt's last token is stored by the "
                                        "first decode step (at release, as a partial block), not with the prompt",
                   "startup_window": "V1 keeps every page of a sliding-window layer, so no window bound applies"}

    def _build(self, spec: PoolSpec):
        from kvcm import KVCacheManagerV1

        cfg = self._config(spec)
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
