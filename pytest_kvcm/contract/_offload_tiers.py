"""The host-tier bookkeeping of each target that has a tier whose classes run on a CPU, behind one small shape:
``alloc(n)`` -> n slot ids or None (refused, nothing changed), ``free(ids)``, ``available()``, ``capacity``.

- kvcm (``kvcm-v1``): ``kvcm.free_queue.QueuedBlockPool``, the host pool V1's host tier keeps per layer group.
- kvcm (``kvcm-v2``): ``kvcm.reuse.host_level.HostSlots``, the slots of V2's host level (TensorRT-LLM V2's
  ``SlotAllocator`` order: recycled slots first, oldest first, then never-used ones).
- vLLM 0.32 (``vllm``): ``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` with its ``lru`` and ``arc``
  policies; a slot is a chunk: ``prepare_store`` allocates (a store in flight), ``complete_store(success=False)``
  gives it back (the only public way a chunk returns before eviction). The counts are its ``_get_num_free_chunks``.
- SGLang at its pinned release (``sglang``): ``sglang.srt.mem_cache.pool_host.base.HostKVCache`` (abstract) under a subclass
  with no buffers (``is_dummy=True``), driven through ``alloc`` / ``free`` / ``available_size`` a page at a time.

Not driven: vLLM's ``SimpleCPUOffloadScheduler`` and its connector (they need a VllmConfig and worker output),
SGLang's ``UnifiedRadixCache`` with HiCache (its cache controller starts CUDA streams); see docs/findings.md.
"""

from __future__ import annotations

import pytest


class KvcmHostPool:
    name = "kvcm QueuedBlockPool (V1 host tier)"
    fresh_first = True            # never-used slots before freed ones

    def __init__(self, capacity: int):
        from kvcm.free_queue import QueuedBlockPool

        self.capacity = capacity
        self.pool = QueuedBlockPool(capacity, 16)

    def alloc(self, n: int):
        return None if n > self.pool.num_available else self.pool.allocate(n)

    def free(self, ids) -> None:
        self.pool.release(list(ids)[::-1])       # release takes a request's pages and gives the last first

    def available(self) -> int:
        return self.pool.num_available


class KvcmV2HostLevel:
    name = "kvcm HostSlots (V2 host level)"
    fresh_first = False           # TensorRT-LLM V2's SlotAllocator: ready recycled slots, then new ones

    def __init__(self, capacity: int):
        from kvcm.reuse.host_level import HostSlots

        self.capacity = capacity
        self.pool = HostSlots(capacity, 16)

    def alloc(self, n: int):
        return None if n > self.pool.num_free else self.pool.allocate(n)

    def free(self, ids) -> None:
        self.pool.release(list(ids))

    def available(self) -> int:
        return self.pool.num_free


class VllmCpuChunks:
    fresh_first = True
    def __init__(self, capacity: int, policy: str):
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        self.name = f"vLLM CPUOffloadingManager ({policy})"
        self.capacity = capacity
        self.mgr = CPUOffloadingManager(num_chunks=capacity, cache_policy=policy)
        self.ctx = ReqContext("contract")
        self._make_key = make_offload_key
        self._serial = 0
        self.key_of: dict[int, object] = {}

    def alloc(self, n: int):
        keys = []
        for _ in range(n):
            self._serial += 1
            keys.append(self._make_key(self._serial.to_bytes(8, "little"), 0))
        out = self.mgr.prepare_store(keys, self.ctx)
        if out is None:
            return None
        ids = list(out.store_spec.block_ids) if hasattr(out.store_spec, "block_ids") else list(out.store_spec)
        ids = [int(i) for i in ids]
        self.key_of.update(zip(ids, out.keys_to_store))
        return ids

    def free(self, ids) -> None:
        keys = [self.key_of.pop(i) for i in ids if i in self.key_of]
        self.mgr.complete_store(keys, self.ctx, success=False)

    def available(self) -> int:
        return self.mgr._get_num_free_chunks()


class SglangHostPages:
    fresh_first = True
    name = "SGLang HostKVCache (dummy buffers)"

    def __init__(self, capacity: int):
        import torch
        from sglang.srt.mem_cache.pool_host.base import HostKVCache

        class _Pages(HostKVCache):          # the abstract pool's bookkeeping, with no buffers behind it
            def get_size_per_token(self):
                return 1

            def init_kv_buffer(self):
                return None

            def load_to_device_per_layer(self, *a, **k):
                raise NotImplementedError

            def backup_from_device_all_layer(self, *a, **k):
                raise NotImplementedError

            def get_data_page(self, *a, **k):
                raise NotImplementedError

            def get_dummy_flat_data_page(self):
                raise NotImplementedError

            def set_from_flat_data_page(self, *a, **k):
                raise NotImplementedError

        self.capacity = capacity
        self._torch = torch
        self.pool = _Pages(dtype=torch.float16, device_capacity_tokens=capacity, size_per_token=1, start_layer=0,
                           end_layer=1, host_to_device_ratio=1.0, host_size=0, page_size=1, layout="layer_first",
                           pin_memory=False, device="cpu", is_dummy=True, host_token_capacity=capacity)

    def alloc(self, n: int):
        out = self.pool.alloc(n)
        return None if out is None else [int(i) for i in out.tolist()]

    def free(self, ids) -> None:
        self.pool.free(self._torch.tensor(list(ids), dtype=self._torch.int64))

    def available(self) -> int:
        return int(self.pool.available_size())


def tiers_of(target_name: str, capacity: int) -> list:
    """The host pools of a contract target (none: the target has no tier that runs here; the test skips)."""
    try:
        if target_name == "kvcm-v1":
            return [KvcmHostPool(capacity)]
        if target_name == "kvcm-v2":
            return [KvcmV2HostLevel(capacity)]
        if target_name == "vllm":
            return [VllmCpuChunks(capacity, "lru"), VllmCpuChunks(capacity, "arc")]
        if target_name == "sglang":
            return [SglangHostPages(capacity)]
    except ImportError as exc:
        pytest.skip(f"target {target_name}: its host tier does not import here ({exc})")
    pytest.skip(f"target {target_name}: no host tier whose classes run on a CPU")
