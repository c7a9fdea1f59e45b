"""A pool of fixed-size pages for one layer group: O(1) allocate and release, optional real torch storage.

Free pages are a stack plus a never-used high-water mark, so building a pool of a million pages costs nothing
and every operation is independent of the pool's size. The in-use flags grow with the high-water mark (doubling
past ``FLAGS_CHUNK``), not with the pool, so a meta pool's cost never grows with the budget a user types:
``kvcm plan --max-tokens 1e15`` builds its pools as fast as ``--max-tokens 1000``. With a device, the pages live in one uint8 tensor
``[num_blocks, bytes_per_block]`` that layers view in their own dtype.
"""

from __future__ import annotations

import torch

from .policy import resolve

FLAGS_CHUNK = 1 << 16
"""In-use flags held from the start; a pool of at most this many pages has all of its flags at once."""


class BlockPool:
    def __init__(self, num_blocks: int, bytes_per_block: int, device: str | torch.device = "meta", *, policy=None):
        """``policy``: the manager's decisions (None: the active policy), which a queued pool asks."""
        self.policy = resolve(policy)
        self.num_blocks = int(num_blocks)
        self.bytes_per_block = int(bytes_per_block)
        self.device = torch.device(device)
        self._free: list[int] = []
        self._fresh = 0
        self._used = bytearray(min(self.num_blocks, FLAGS_CHUNK))  # pages below the high-water mark
        self.num_reusable = 0       # cached pages nobody holds, kept out of the free list by a reuse cache
        self.evict = None           # the reuse cache's ``evict(n)``: puts n cached pages back in the free list
        self.peak_held = 0          # most pages held by requests at once since ``reset_peak``
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
                if block == len(self._used):
                    self._used.extend(bytes(min(len(self._used), self.num_blocks - block)))
            self._used[block] = 1
            out.append(block)
        held = self.num_used - self.num_reusable
        if held > self.peak_held:
            self.peak_held = held
        return out

    @property
    def num_held(self) -> int:
        """Pages requests hold (used, less the cached pages nobody holds)."""
        return self.num_used - self.num_reusable

    def reset_peak(self) -> None:
        """Count the peak afresh from what is held now."""
        self.peak_held = self.num_held

    def release(self, blocks) -> None:
        for block in blocks:
            if block < 0:
                continue
            if block >= self._fresh or not self._used[block]:
                raise RuntimeError(f"block {block} released twice")
            self._used[block] = 0
            self._free.append(block)

    def free_order(self) -> list[int]:
        """The free pages in the order ``allocate`` hands them out (for tests: the most recently freed first,
        then the never-used ones; V1's ``QueuedBlockPool`` has its own order)."""
        return self._free[::-1] + list(range(self._fresh, self.num_blocks))

    def is_used(self, block: int) -> bool:
        return 0 <= block < self._fresh and bool(self._used[block])

    def push_free(self, block: int) -> None:
        """Put one page back without the double-release check (the policy's ``release_block`` makes it)."""
        self._used[block] = 0
        self._free.append(block)
