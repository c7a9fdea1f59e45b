"""SGLang 0.5.23's paged allocator behind the contract: ``PagedTokenToKVPoolAllocator`` over a real
``MHATokenToKVPool`` on ``device="cpu"`` (no server, no model, no GPU).

Relies on: ``MHATokenToKVPool(size, page_size, dtype, head_num, head_dim, layer_num, device,
enable_memory_saver)`` holding ``size + page_size`` token slots, and the allocator's ``alloc(need_size)`` (page
aligned; None when it does not fit, nothing taken), ``free(indices)`` and ``available_size()`` in tokens. Page 0
is SGLang's padding page (dummy outputs of padded tokens are written there): ``clear()`` hands out pages
``1..size // page_size`` only, so it sits outside the counted pool and ``reserved_pages`` is 0. The allocator
knows no requests: the scheduler keeps each request's slots in ``req_to_token_pool``; this adapter keeps them
per request id instead.

Built by ``ci/sglang_venv.sh``; run with
``PYTHONPATH=$PWD ~/.cache/kvcm/venv-sglang/bin/python -m pytest -p pytest_kvcm.plugin --pyargs pytest_kvcm.contract
--kvcm-target=sglang``.
"""

from __future__ import annotations

from kvcm.units import ceil_div

from .contract import KVCacheTarget, PoolSpec, TargetUnavailable

INSTALL_HINT = ("SGLang is not importable in this interpreter; build its venv with `VENV=$(bash ci/sglang_venv.sh | "
                "tail -1)` (sglang==0.5.23) and run `PYTHONPATH=$PWD $VENV/bin/python -m pytest -p pytest_kvcm.plugin "
                "--pyargs pytest_kvcm.contract --kvcm-target=sglang`")


def _sglang():
    try:
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    except Exception as exc:  # ImportError, or a dependency that does not load here
        raise TargetUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    return PagedTokenToKVPoolAllocator, MHATokenToKVPool


class SglangTarget(KVCacheTarget):
    name = "sglang"
    reserved_pages = 0
    releases_window_pages = False
    differences = {
        "sliding_window": "the paged allocator has no window: SGLang keeps sliding-window layers in a separate "
                          "SWATokenToKVPoolAllocator (not behind this adapter yet)",
    }

    def __init__(self, spec: PoolSpec):
        super().__init__(spec)
        allocator_cls, pool_cls = _sglang()
        import torch

        ps = spec.page_size
        size = spec.num_pages * ps
        self.kv_pool = pool_cls(size, ps, torch.bfloat16, 2, 16, 1, "cpu", False)
        self.allocator = allocator_cls(size, ps, torch.bfloat16, "cpu", self.kv_pool, False)
        self.page_size, self.total_pages = ps, spec.num_pages
        self._slots: dict[str, list] = {}

    def free_pages(self) -> int:
        return self.allocator.available_size() // self.page_size

    def held_pages(self, rid):
        return {"full": sum(int(t.numel()) for t in self._slots[rid]) // self.page_size}

    def _reserve(self, rid, slots) -> bool:
        held = self.held_pages(rid)["full"] if rid in self._slots else 0
        need = ceil_div(slots, self.page_size) - held
        if need <= 0:
            return True
        got = self.allocator.alloc(need * self.page_size)
        if got is None:
            return False
        assert not bool((got // self.page_size == 0).any()), "SGLang handed out its padding page 0"
        self._slots.setdefault(rid, []).append(got)
        return True

    def _allocate(self, rid, num_tokens, lookahead):
        if self._reserve(rid, num_tokens + lookahead):
            self._slots.setdefault(rid, [])
            return True
        return False

    def _grow(self, rid, have, num_tokens, lookahead):
        return self._reserve(rid, have + num_tokens + lookahead)

    def _free(self, rid):
        import torch

        slots = self._slots.pop(rid)
        if slots:
            self.allocator.free(torch.cat(slots))
