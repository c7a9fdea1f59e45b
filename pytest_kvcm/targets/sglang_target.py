"""SGLang's KV pools (the release declared.py pins) behind the contract, on ``device="cpu"`` (no server, no model, no GPU).

Which SGLang objects, by what the test asks:

* full attention only: ``PagedTokenToKVPoolAllocator`` over a real ``MHATokenToKVPool``;
* with ``PoolSpec(sliding_window=W)``: ``SWATokenToKVPoolAllocator`` over a real ``SWAKVPool`` (a full pool of
  ``num_pages`` and an SWA pool of ``swa_full_tokens_ratio`` of it, 0.8 by default, as
  ``HybridSWAPoolConfigurator`` splits them), and the window released by SGLang's own
  ``free_swa_out_of_window_slots`` with ``sliding_window_size = W - 1`` (SGLang counts the window without the
  token itself: Gemma 3's ``get_attention_sliding_window_size``) before each allocation, as
  ``ScheduleBatch.maybe_evict_swa`` does; the cache is the one without prefix sharing (``--disable-radix-cache``,
  ``ChunkCache``), whose window keeps no whole page for a tree;
* with ``PoolSpec(reuse=True)``: ``RadixCache`` on the paged allocator (``sglang_reuse.py``).

Every request has a real ``ReqToTokenPool`` row, allocated the way the scheduler does (``alloc_extend`` from its
length so far, page-aligned, all or nothing) and given back with ``free_kv_row_segments`` (what
``release_kv_cache`` calls). Page 0 is SGLang's padding page (dummy outputs of padded tokens are written there):
``clear()`` hands out pages ``1..size // page_size`` only, so it sits outside the counted pool and
``reserved_pages`` is 0. The allocator knows no requests: the scheduler keeps them; this adapter keeps them per
request id.

Built by ``ci/sglang_venv.sh``; run with
``PYTHONPATH=$PWD ~/.cache/kvcm/venv-sglang/bin/python -m pytest -p pytest_kvcm.plugin --pyargs pytest_kvcm.contract
--kvcm-target=sglang``.
"""

from __future__ import annotations

from array import array

from kvcm.units import ceil_div

from .contract import KVCacheTarget, PoolSpec, TargetUnavailable
from .declared import BY_NAME
from .sglang_reuse import SglangReuse

INSTALL_HINT = ("SGLang is not importable in this interpreter; build its venv with `VENV=$(bash ci/sglang_venv.sh | "
                f"tail -1)` ({BY_NAME['sglang'].release}) and run `PYTHONPATH=$PWD $VENV/bin/python -m pytest -p pytest_kvcm.plugin "
                "--pyargs pytest_kvcm.contract --kvcm-target=sglang`")
SWA_FULL_TOKENS_RATIO = 0.8  # sglang/srt/arg_groups/fields/schedule.py: swa_full_tokens_ratio's fallback


def _sglang():
    try:
        from sglang.srt.mem_cache import common, memory_pool, swa_memory_pool
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    except Exception as exc:  # ImportError, or a dependency that does not load here
        raise TargetUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    return common, memory_pool, swa_memory_pool, PagedTokenToKVPoolAllocator, SWATokenToKVPoolAllocator, ComponentType


class KvRecord:
    """The fields of SGLang's ``ReqKvInfo`` (``sglang/srt/managers/schedule_batch.py``) that the pool functions
    read: the row, the tree-owned prefix, the allocated length and each component's eviction cursor. Its own
    module imports the serving stack (openai, grammar backends) that this venv leaves out, so the record is
    restated here, methods as written there."""

    def __init__(self):
        self.req_pool_idx = None
        self.cache_protected_len = self.cache_inserted_len = self.kv_allocated_len = self.swa_evict_floor = 0
        self.component_evicted_seqlens = {}

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    def swa_dead_lo(self, page_size: int) -> int:
        lo = max(self.cache_protected_len, self.swa_evict_floor)
        return ceil_div(lo, page_size) * page_size if page_size > 1 and lo > self.cache_protected_len else lo

    def get_evicted_seqlen(self, component_type) -> int:
        return self.component_evicted_seqlens.get(component_type, 0)

    def set_evicted_seqlen(self, component_type, length: int) -> None:
        self.component_evicted_seqlens[component_type] = length


class SglangRequest:
    """What SGLang's ``Req`` carries that the pool functions read: ``kv``, the token ids, the tree lock."""

    extra_key = cache_salt = None
    priority = 0

    def __init__(self, rid: str, token_ids=None):
        self.rid = rid
        self.kv = KvRecord()
        self.origin_input_ids = array("q", token_ids or [])  # SGLang keeps token ids as array("q")
        self.fill_ids = array("q", self.origin_input_ids)
        self.lock = self.last_node = None

    @property
    def full_untruncated_fill_ids(self):
        return self.fill_ids


class SglangTarget(SglangReuse, KVCacheTarget):
    name = "sglang"
    reserved_pages = 0
    differences = {
        "partial_blocks_cached": "RadixCache keys are page-aligned: a partial last page stays the request's and is "
                                 "freed with it, never cached",
        "whole_node_eviction": "RadixCache evicts whole leaves (LRU), a leaf being the pages one insert added: a "
                               "shortfall of one page can evict a three-page node",
        "window_reuse": "a sliding-window model's prefix cache is UnifiedRadixCache's SWA component, not RadixCache "
                        "(not behind this adapter)",
        "startup_window": "SGLang keeps the window in a pool of its own (swa_full_tokens_ratio of the full pool): "
                          "test_startup_split_window_pool checks each pool against kvcm's bound",
        "startup_window_chunk": "the SWA pool's start-up floor is the window plus one page (validate_swa_pool_size: "
                                "sliding_window_size + page_size < swa_tokens) whatever the chunk: chunks are "
                                "page-aligned and an extend longer than the window stores its tail only "
                                "(alloc_extend_swa_tail), so kvcm's window - 1 + chunk bound is one page more",
    }
    split_window_pool = True

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        common, pools, swa_pools, paged_cls, swa_cls, self._component = _sglang()
        import torch

        self._common, self._torch = common, torch
        ps = spec.page_size
        self.page_size, self.total_pages = ps, spec.num_pages
        size = spec.num_pages * ps
        if spec.sliding_window is None:
            self.kv_pool = pools.MHATokenToKVPool(size, ps, torch.bfloat16, 2, 16, 1, "cpu", False)
            self.allocator = paged_cls(size, ps, torch.bfloat16, "cpu", self.kv_pool, False)
        else:
            size_swa = self.window_pool_tokens(spec)
            self.kv_pool = swa_pools.SWAKVPool(size=size, size_swa=size_swa, page_size=ps, dtype=torch.bfloat16,
                                               head_num=2, head_dim=16, swa_attention_layer_ids=[1],
                                               full_attention_layer_ids=[0], device="cpu")
            self.allocator = swa_cls(size, size_swa, ps, torch.bfloat16, "cpu", self.kv_pool, False)
        # every request holds a page at least, so the pool's pages bound the rows in use
        width = size + ps + spec.max_lookahead
        self.req_to_token_pool = pools.ReqToTokenPool(spec.num_pages + 1, width, "cpu", False)
        self._reqs: dict[str, SglangRequest] = {}
        self._init_reuse()

    @staticmethod
    def window_pool_tokens(spec: PoolSpec) -> int:
        """``spec.window_pages``, else the SWA pool SGLang gives a full pool of ``num_pages``
        (``HybridSWAPoolConfigurator``: page-aligned ``int(full_tokens * swa_full_tokens_ratio)``)."""
        ps = spec.page_size
        if spec.window_pages is not None:
            return spec.window_pages * ps
        return int(spec.num_pages * ps * SWA_FULL_TOKENS_RATIO) // ps * ps

    # ---- what the contract reads ------------------------------------------------------------------------------
    def free_pages(self) -> int:
        free = self.allocator.full_available_size() if self._windowed else self.allocator.available_size()
        return free // self.page_size + self._evictable_pages()

    @property
    def _windowed(self) -> bool:
        return self.spec.sliding_window is not None

    def _row(self, req: SglangRequest):
        return self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_allocated_len].to(
            self._torch.int64)

    def held_pages(self, rid):
        req = self._reqs[rid]
        row = self._row(req)
        pages = {"full": len(set((row // self.page_size).tolist()))}
        if self._windowed:
            mapped = self.allocator.full_to_swa_index_mapping[row]
            pages["window"] = len(set((mapped[mapped > 0] // self.page_size).tolist()))
        return pages

    # ---- allocation as the scheduler does it --------------------------------------------------------------------
    def _extend(self, req: SglangRequest, new_len: int) -> bool:
        """Slots up to ``new_len`` for the request's row: ``alloc_extend`` from what it has (all or nothing)."""
        torch, have = self._torch, req.kv.kv_allocated_len
        if new_len <= have:
            return True
        if self._windowed:  # ScheduleBatch.maybe_evict_swa, before the allocation, for the token at ``have``
            self._slide_window(req, have)
        if self.page_size == 1:
            got = self.allocator.alloc(new_len - have)
        else:
            row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
            last = int(row[have - 1]) if have else -1
            t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
            got = self.allocator.alloc_extend(t(have), t(have), t(new_len), t(new_len), t(last), new_len - have)
        if got is None:
            return False
        assert not bool((got // self.page_size == 0).any()), "SGLang handed out its padding page 0"
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(have, new_len)), got.to(torch.int32))
        req.kv.kv_allocated_len = new_len
        return True

    def _slide_window(self, req: SglangRequest, pre_len: int) -> None:
        self._common.free_swa_out_of_window_slots(
            req, pre_len, sliding_window_size=self.spec.sliding_window - 1, page_size=self.page_size,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            supports_prefix_sharing=False)

    def _new_request(self, rid: str, token_ids=None) -> SglangRequest:
        req = SglangRequest(rid, token_ids)
        rows = self.req_to_token_pool.alloc_rows(1)
        assert rows, f"{self}: no request row left"
        req.kv.req_pool_idx = rows[0]
        return req

    def _allocate(self, rid, num_tokens, lookahead):
        req = self._new_request(rid)
        if not self._extend(req, num_tokens + lookahead):
            self.req_to_token_pool.free(req)
            return False
        self._reqs[rid] = req
        return True

    def _grow(self, rid, have, num_tokens, lookahead):
        req = self._reqs[rid]
        if not self._extend(req, have + num_tokens + lookahead):
            return False
        if req.lock is not None:  # a prompt in the radix cache: its generated tokens are inserted at release
            req.fill_ids.extend([1] * num_tokens)
        return True

    def _free(self, rid):
        req = self._reqs.pop(rid)
        self._release(req)

    def _release_row(self, req: SglangRequest) -> None:
        """``release_kv_cache``'s frees: the row past the tree-owned prefix, the window's freed part full-side only."""
        kv = req.kv
        lo, hi = kv.cache_protected_len, kv.kv_allocated_len
        if hi > lo:
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx, lo:hi].to(self._torch.int64)
            self._common.free_kv_row_segments(self.allocator, [(row, lo)],
                                              swa_evicted_seqlen=kv.get_evicted_seqlen(self._component.SWA),
                                              swa_dead_lo=kv.swa_dead_lo(self.page_size))
        self.req_to_token_pool.free(req)
        kv.kv_allocated_len = 0

    # ---- start-up: pytest_kvcm/targets/sglang_startup.py --------------------------------------------------------
    def startup_accepts(self, spec, max_num_batched_tokens, async_scheduling=False):
        """SGLang's pool configurator and its context-length check (sglang_startup.py); the overlap scheduler
        does not enter SGLang's start-up rule."""
        from .sglang_startup import startup_accepts

        return startup_accepts(self, spec, max_num_batched_tokens)
