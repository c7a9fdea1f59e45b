"""SGLang's prefix cache behind the reuse contract: a real ``RadixCache`` over the paged allocator, driven with the
calls its scheduler makes (the pinned SGLang, ``sglang/srt/mem_cache/radix_cache.py``).

A prompt of ``n`` tokens, as ``Req.init_next_round_input`` and ``PrefillAdder`` take it: ``match_prefix`` on its
first ``n - 1`` ids (``max_prefix_len = input_len - 1``: the last token is computed for its logits; the tree
truncates the key to whole pages), the matched node locked (``lock`` -> ``inc_lock_ref``) before anything is
evicted, admitted when its new pages fit in the free slots plus what the tree can evict (``evictable_size``),
``evict`` for the shortfall, ``alloc_extend`` from the hit, and, once the prefill is computed,
``checkpoint(req, up_to=n)`` (``checkpoint_kv_cache``): the prompt's whole pages go into the tree, a page the tree
already holds replaces the request's own copy (freed), and the lock moves to the new node. Freeing is
``release_kv_cache``: a last ``checkpoint``, the row past the tree-owned prefix freed, ``unlock``. A reset is
``Scheduler.flush_cache``: refused while a request runs, else ``reset`` the tree and ``clear`` the pools.

Cached pages nobody holds are the tree's ``evictable_size``; they count as free, since an allocation evicts them.
"""

from __future__ import annotations

from array import array


class SglangReuse:
    """Mixed into ``SglangTarget``; everything here is inert unless the spec asks for reuse."""

    supports_reuse = True
    reuse_oracle = "v2"  # both cache a prompt's whole pages with it and swap a recomputed page for the cached one

    def _init_reuse(self) -> None:
        self.tree = None
        if not self.spec.reuse:
            return
        if self.spec.sliding_window is not None:
            return  # RadixCache has no window: differences["window_reuse"]
        from sglang.srt.mem_cache import base_prefix_cache, radix_cache
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams

        self._radix, self._params = radix_cache, base_prefix_cache
        self.tree = radix_cache.RadixCache(CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.page_size, enable_kv_cache_events=self.spec.events))

    def require_reuse(self) -> None:
        super().require_reuse()
        if self.tree is None:
            self.require("window_reuse")

    def _evictable_pages(self) -> int:
        return 0 if self.tree is None else self.tree.evictable_size() // self.page_size

    def _match(self, token_ids):
        key = self._radix.RadixKey(array("q", token_ids[:len(token_ids) - 1]))
        return self.tree.match_prefix(self._params.MatchPrefixParams(key=key))

    # ---- the reuse contract ---------------------------------------------------------------------------------------
    def _allocate_prompt(self, rid, token_ids):
        tree, ps, n = self.tree, self.page_size, len(token_ids)
        match = self._match(token_ids)
        hit, node = match.device_prefix_len, match.last_device_node
        lock = tree.lock(node)
        need = (-(-n // ps) - hit // ps) * ps
        available = self.allocator.available_size()
        if need > available + tree.evictable_size():
            tree.unlock(lock)
            return None
        if need > available:
            tree.evict(self._params.EvictParams(num_tokens=need - available))
        req = self._new_request(rid, token_ids)
        req.lock, req.last_node = lock, node
        if hit:
            self.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, hit)), tree.path_device_indices(node))
        req.kv.kv_allocated_len = req.kv.cache_protected_len = hit
        assert self._extend(req, n), f"{self}: {need} slots fit by the admission, refused by alloc_extend"
        tree.checkpoint(req, up_to=n)
        self._reqs[rid] = req
        return hit

    def _release(self, req) -> None:
        if req.lock is None:
            self._release_row(req)
            return
        self.tree.checkpoint(req, up_to=len(req.fill_ids))
        self._release_row(req)
        self.tree.unlock(req.lock)
        req.lock = None

    def lookup(self, token_ids) -> int:
        return self._match([int(t) for t in token_ids]).device_prefix_len

    def cached_pages(self) -> int:
        return self._evictable_pages()

    # ---- KV cache events (sglang/srt/mem_cache/events.py: RadixCache records a store per inserted node, a removal
    # per evicted one, AllBlocksCleared at reset; one group, the GPU) ------------------------------------------------
    supports_events = True

    def take_events(self) -> list:
        from .events import from_vllm_like

        return from_vllm_like(self.tree.kv_events.take())

    def cached_blocks(self) -> dict:
        """Every page of every node the tree holds on the device, hashed as its recorder hashes it."""
        from sglang.srt.disaggregation.kv_events import namespaced_block_hash
        from sglang.srt.mem_cache.utils import hash_str_to_int64

        recorder, out = self.tree.kv_events, {}
        stack = list(self.tree.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.value is None:
                continue
            seed = recorder._namespace_seed(node)
            for h in recorder._node_event_hash_values(node)[:-(-len(node.key) // self.page_size)]:
                out[(0, namespaced_block_hash(hash_str_to_int64(h), namespace_seed=seed))] = 0
        return out

    def reset_cache(self) -> bool:
        if self._reqs:
            return False
        self.tree.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        return True
