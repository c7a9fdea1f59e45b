"""A pool of fixed-size pages for one layer group: O(1) allocate and release, optional real torch storage.

Free pages are a stack plus a never-used high-water mark, so building a pool of a million pages costs nothing
and every operation is independent of the pool's size. With a device, the pages live in one uint8 tensor
``[num_blocks, bytes_per_block]`` that layers view in their own dtype.
"""

from __future__ import annotations

import torch


class BlockPool:
    def __init__(self, num_blocks: int, bytes_per_block: int, device: str | torch.device = "meta"):
        self.num_blocks = int(num_blocks)
        self.bytes_per_block = int(bytes_per_block)
        self.device = torch.device(device)
        self._free: list[int] = []
        self._fresh = 0
        self._used = bytearray(self.num_blocks)
        self.num_reusable = 0       # cached pages nobody holds, kept out of the free list by a reuse cache
        self.evict = None           # the reuse cache's ``evict(n)``: puts n cached pages back in the free list
        self.peak_held = 0          # most pages held by requests at once (``kvcm.engine.page_usage`` resets it)
        self.storage: torch.Tensor | None = None
        if self.device.type != "meta":
            # zeroed: masked-out slots are multiplied by zero weights, and 0 * NaN garbage would poison attention
            self.storage = torch.zeros((self.num_blocks, self.bytes_per_block), dtype=torch.uint8, device=self.device)

    @property
    def num_free(self) -> int:
        return len(self._free) + self.num_blocks - self._fresh

    @property
    def num_available(self) -> int:
        """Free pages plus cached pages nobody holds: what an allocation can get (it evicts the latter)."""
        return len(self._free) + self.num_blocks - self._fresh + self.num_reusable

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            if n > self.num_available or self.evict is None:
                raise RuntimeError(f"pool has {self.num_free} free blocks, {n} asked")
            self.evict(n - self.num_free)
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:
                block = self._fresh
                self._fresh += 1
            self._used[block] = 1
            out.append(block)
        held = self.num_used - self.num_reusable
        if held > self.peak_held:
            self.peak_held = held
        return out

    def release(self, blocks) -> None:
        for block in blocks:
            if block < 0:
                continue
            if not self._used[block]:
                raise RuntimeError(f"block {block} released twice")
            self._used[block] = 0
            self._free.append(block)

    def is_used(self, block: int) -> bool:
        return bool(self._used[block])

    def push_free(self, block: int) -> None:
        """Put one page back without the double-release check (``kvcm.seams.release_block`` makes it)."""
        self._used[block] = 0
        self._free.append(block)
