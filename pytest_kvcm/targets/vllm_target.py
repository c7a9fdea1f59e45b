"""vLLM v1's ``KVCacheManager`` behind the contract, built directly (no engine, no model, no GPU).

Relies on (pinned by ``pytest_kvcm/contract/test_target_apis.py``): ``FullAttentionSpec`` / ``SlidingWindowSpec``,
``KVCacheConfig`` with ``KVCacheGroupSpec``s sharing one ``BlockPool`` of ``num_blocks``, ``init_none_hash``
before any ``Request``, ``allocate_slots(request, num_new_tokens, num_lookahead_tokens=...)`` returning None when
it does not fit, ``free(request)`` and ``block_pool.get_num_free_blocks()``. Block 0 is the pool's null block:
no request ever gets it, so it is this target's one reserved page.

With ``PoolSpec(reuse=True)`` the manager is built with ``enable_caching=True``: a prompt's ids are hashed by vLLM's
own request block hasher (sha256), ``get_computed_blocks`` finds the hit and ``allocate_slots`` takes it (and
caches the prompt's full blocks at once), exactly as its scheduler does.
"""

from __future__ import annotations

from .contract import KVCacheTarget, PoolSpec, TargetUnavailable
from .declared import BY_NAME

INSTALL_HINT = ("vLLM is not importable in this interpreter; build its venv with `VENV=$(bash ci/vllm_venv.sh | "
                f"tail -1)` ({BY_NAME['vllm'].release}) and run `PYTHONPATH=$PWD $VENV/bin/python -m pytest -p "
                "pytest_kvcm.plugin --pyargs pytest_kvcm.contract --kvcm-target=vllm`")
_HASH_READY = False


def _vllm():
    try:
        import vllm.v1.core.kv_cache_manager as kvm
        import vllm.v1.core.kv_cache_utils as utils
        import vllm.v1.kv_cache_interface as iface
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.request import Request, RequestStatus
    except Exception as exc:  # ImportError, or a broken CUDA build of a dependency
        raise TargetUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    global _HASH_READY
    if not _HASH_READY:
        utils.init_none_hash(sha256)
        _HASH_READY = True
    return kvm, utils, iface, SamplingParams, Request, RequestStatus, sha256


class VllmTarget(KVCacheTarget):
    name = "vllm"
    reserved_pages = 1
    differences = {
        "max_model_len": "allocate_slots never reserves slots past max_model_len: lookahead beyond it is dropped",
        "failed_allocation": "out-of-window pages may be released by an allocation that then fails (documented in "
                             "allocate_slots: 'We can do this even if we cannot schedule this request')",
        "shared_pool": "every layer group draws from one block pool",
        "partial_blocks_cached": "a partial last block is never cached: freed, it goes to the free list's front",
        "duplicate_blocks": "a block recomputed by the last-token rule is a second cached copy of its key (block "
                            "ids never change); TensorRT-LLM V2 swaps in the cached page and frees its own",
    }
    supports_reuse = True

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        kvm, utils, iface, self._SamplingParams, self._Request, self._Status, sha256 = _vllm()
        import torch

        ps = spec.page_size
        groups = [iface.KVCacheGroupSpec(["full.0"], iface.FullAttentionSpec(
            block_size=ps, num_kv_heads=2, head_size=16, dtype=torch.bfloat16))]
        if spec.sliding_window is not None:
            groups.append(iface.KVCacheGroupSpec(["window.0"], iface.SlidingWindowSpec(
                block_size=ps, num_kv_heads=2, head_size=16, dtype=torch.bfloat16,
                sliding_window=spec.sliding_window)))
        config = iface.KVCacheConfig(num_blocks=spec.num_pages, kv_cache_tensors=[], kv_cache_groups=groups)
        self.manager = kvm.KVCacheManager(config, max_model_len=spec.max_model_len, scheduler_block_size=ps,
                                          hash_block_size=ps, enable_caching=spec.reuse,
                                          enable_kv_cache_events=spec.events)
        self._hasher = utils.get_request_block_hasher(ps, sha256)
        self.page_size, self.total_pages = ps, spec.num_pages
        self._requests = {}

    # vLLM issue #49878: since PR #47728 the sliding-window bound counts two batches in flight under async
    # scheduling (max_in_flight_tokens = 2 * max_num_batched_tokens); kvcm counts one per request. Open in 0.32.0.
    startup_findings = {"async_window_bound": "vLLM issue #49878 (PR #47728): async scheduling sizes the window "
                                              "group for two in-flight batches per request; open in vllm 0.32.0"}

    def startup_accepts(self, spec, max_num_batched_tokens, async_scheduling=False):
        """vLLM's ``check_enough_kv_cache_memory`` on this pool (pytest_kvcm/targets/vllm_startup.py)."""
        from .vllm_startup import startup_accepts

        return startup_accepts(self, spec, max_num_batched_tokens, async_scheduling)

    def free_pages(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    def held_pages(self, rid):
        ids = self.manager.get_block_ids(rid)
        null = self.manager.block_pool.null_block.block_id
        counts = [sum(1 for b in group if b != null) for group in ids]
        return {"full": counts[0]} | ({"window": counts[1]} if len(counts) > 1 else {})

    def _allocate(self, rid, num_tokens, lookahead):
        request = self._Request(rid, [1] * num_tokens, self._SamplingParams(max_tokens=1 << 20), None,
                                block_hasher=self._hasher)
        if self.manager.allocate_slots(request, num_tokens, num_lookahead_tokens=lookahead) is None:
            return False
        request.status = self._Status.RUNNING
        self._requests[rid] = request
        return True

    def _grow(self, rid, have, num_tokens, lookahead):
        request = self._requests[rid]
        request.num_computed_tokens = have
        if self.manager.allocate_slots(request, num_tokens, num_lookahead_tokens=lookahead) is None:
            return False
        request.append_output_token_ids([1] * num_tokens)
        return True

    def _free(self, rid):
        self.manager.free(self._requests.pop(rid))

    # ---- block reuse (prefix caching) -----------------------------------------------------------------------
    def _request(self, rid, token_ids):
        return self._Request(rid, list(token_ids), self._SamplingParams(max_tokens=1 << 20), None,
                             block_hasher=self._hasher)

    def _allocate_prompt(self, rid, token_ids):
        request = self._request(rid, token_ids)
        computed, hit = self.manager.get_computed_blocks(request)[:2]
        if self.manager.allocate_slots(request, len(token_ids) - hit, hit, computed) is None:
            return None
        request.status = self._Status.RUNNING
        request.num_computed_tokens = len(token_ids)
        self._requests[rid] = request
        return hit

    def lookup(self, token_ids) -> int:
        return self.manager.get_computed_blocks(self._request("kvcm-lookup", token_ids))[1]

    def cached_pages(self) -> int:
        return sum(1 for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()
                   if b.block_hash is not None)

    def reset_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    # ---- KV cache events (vllm/distributed/kv_events.py, emitted by v1/core/block_pool.py) -----------------------
    supports_events = True
    # vLLM PR #48933 (open): a hash may be cached in two blocks (no deduplication: block tables stay append-only),
    # and evicting either copy sends BlockRemoved(hash) with no count of the copies left
    event_findings = {"duplicate_copy": "vLLM PR #48933 / #55092 (open in 0.32.0): BlockRemoved for one physical copy "
                                        "of a hash another block still caches; a router drops a block vLLM matches"}

    def take_events(self) -> list:
        from .events import from_vllm_like

        return from_vllm_like(self.manager.take_events())

    def cached_blocks(self) -> dict:
        """Every key of the block pool's hash map (one per hash and group, however many blocks hold it), with the
        hash as its events carry it."""
        from vllm.v1.core import kv_cache_utils as utils

        keys = self.manager.block_pool.cached_block_hash_to_block._cache
        return {(utils.get_group_id(k), utils.maybe_convert_block_hash(utils.get_block_hash(k))): 0 for k in keys}
