"""V1's host tier: TensorRT-LLM's secondary pool (``kvCacheManager.cpp`` ``WindowBlockManager::getFreeBlock`` /
``onboardBlock``, ``evictionPolicy.cpp`` level 1), a second free queue per layer group in host memory.

Offload happens on eviction: when an allocation takes a cached GPU block whose priority is at least
``secondary_offload_min_priority`` (default 30), the host queue is not empty and ``onboard_blocks`` is on, the
block's KV is copied to the front host page and the block stays in the tree, at its priority, now in the host
queue; whatever cached block held that host page leaves the tree with its descendants. Otherwise the GPU block
leaves the tree with its descendants, as without a tier. Onboarding happens on reuse: a matched block in the host
tier gets a GPU page (which may offload another block), its KV is copied back and the host page goes back to the
host queue's default FIFO. Upstream swaps the memory behind two block objects rather than moving a block, so a
request can hold block ids >= the primary count; ``block_ids`` reports those ids (``getCacheBlockIds``) beside the
pages (memory rows) the block tables hold.

Host pages are pinned CPU memory when the GPU pool is on CUDA, plain CPU memory for a CPU pool, nothing on meta.
"""

from __future__ import annotations

import os

import torch

from ..errors import ConfigError
from ..free_queue import DEFAULT_PRIORITY, QueuedBlockPool
from .queued_cache import QueuedReuseCache
from .tree import Node, deepest_first
from ..policy import Decisions, rule, setting


def host_blocks(host_cache_size: int | None, bytes_per_block: int) -> int:
    """Secondary blocks for ``host_cache_size`` bytes: whole blocks, floored (``calculateSecondaryBlocks``:
    ``floor(bytes / bytes per token) / tpb``; primary blocks round up, secondary ones do not)."""
    if not host_cache_size or bytes_per_block <= 0:
        return 0
    return int(host_cache_size) // int(bytes_per_block)


def host_memory_available() -> int:
    """Bytes of host memory a new allocation can take now: ``MemAvailable`` (free memory plus the page cache the
    kernel can drop), or the free pages where /proc/meminfo has no such line."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_host_memory(host_cache_size: int, num_blocks: list[int], pools) -> None:
    """A host tier on a real device must fit the host memory available, checked before any of it is allocated:
    torch's allocator would refuse it without naming ``host_cache_size``, or (on Linux, which overcommits) hand it
    out and let the zeroing touch every page until the kernel kills the process."""
    if not pools or pools[0].device.type == "meta":
        return
    need = sum(n * pool.bytes_per_block for n, pool in zip(num_blocks, pools))
    available = host_memory_available()
    if need > available:
        raise ConfigError("host_cache_size", host_cache_size,
                          f"needs {need} bytes of host memory ({sum(num_blocks)} host blocks), more than the "
                          f"{available} bytes this machine has available; give at most {available} bytes")


def _host_storage(num_blocks: int, bytes_per_block: int, device: torch.device) -> torch.Tensor | None:
    if device.type == "meta" or num_blocks == 0:
        return None
    pin = device.type == "cuda" and torch.cuda.is_available()
    return torch.zeros((num_blocks, bytes_per_block), dtype=torch.uint8, pin_memory=pin)


class TieredReuseCache(QueuedReuseCache):
    """``QueuedReuseCache`` with a host queue per group behind the GPU one."""

    host_eviction_policies = ("lru",)      # the secondary pool's queue is TensorRT-LLM's LRUEvictionPolicy

    @classmethod
    def sized(cls, pools, groups, leaf_only, cfg, *, order, policy=None) -> "TieredReuseCache | None":
        """The tier ``cfg.host_cache_size`` makes: floor(bytes / block bytes) blocks a group (None when that is
        none)."""
        n = host_blocks(cfg.host_cache_size, sum(g.bytes_per_block for g in groups))
        if n == 0:
            return None
        check_host_memory(cfg.host_cache_size, [n] * len(pools), pools)
        return cls(pools, groups, leaf_only, order=order, num_host_blocks=n, onboard_blocks=cfg.onboard_blocks,
                   offload_min_priority=cfg.offload_min_priority, policy=policy)

    @staticmethod
    def plan(manager, host_bytes: int) -> dict:
        """``kvcm plan --host-cache-size``'s figures of this tier for ``manager``: the secondary blocks (every group
        has as many), and when blocks go there."""
        cfg = manager.kv_cache_config
        return {"host_blocks": host_blocks(host_bytes, sum(g.bytes_per_block for g in manager.layer_groups)),
                "onboard_blocks": cfg.onboard_blocks, "secondary_offload_min_priority": cfg.offload_min_priority}

    def __init__(self, pools, groups, leaf_only: list[bool], *, order, num_host_blocks: int, onboard_blocks: bool,
                 offload_min_priority: int, policy=None):
        super().__init__(pools, groups, leaf_only, order=order, policy=policy)
        self.onboard_blocks = onboard_blocks
        self.offload_min_priority = offload_min_priority
        self.host = []
        for pool in pools:
            host = QueuedBlockPool(num_host_blocks, pool.bytes_per_block, "meta", policy=self.policy)
            host.storage = _host_storage(num_host_blocks, pool.bytes_per_block, pool.device)
            host.clock = pool.clock
            self.host.append(host)
        self.host_node: list[dict[int, Node]] = [{} for _ in pools]
        self.row_id: list[dict[int, int]] = [{} for _ in pools]    # GPU row -> block id, where not the row
        self.host_id: list[dict[int, int]] = [{} for _ in pools]   # host row -> block id, where not P + row
        self.offloaded = 0
        self.onboarded = 0
        self.host_dropped = 0

    # ---- ids as upstream names them -------------------------------------------------------------------------
    def block_id(self, g: int, row: int) -> int:
        return self.row_id[g].get(row, row)

    def _host_block_id(self, g: int, row: int) -> int:
        return self.host_id[g].get(row, self.pools[g].num_blocks + row)

    def _swap_ids(self, g: int, row: int, host_row: int) -> None:
        a, b = self.block_id(g, row), self._host_block_id(g, host_row)
        self.row_id[g][row], self.host_id[g][host_row] = b, a

    # ---- offload: an allocation evicts a cached GPU block ----------------------------------------------------
    def _take_cached(self, g: int, page: int) -> None:
        node = self.page_node[g].get(page)
        if node is None or node.pages[g] != page:
            return
        host = self.host[g]
        if not (self.onboard_blocks and self.policy.offloadable(node.priority, self.offload_min_priority)
                and len(host.queue) > 0) or self._front_host_block_is_above(g, node):
            super()._take_cached(g, page)
            return
        self.events.moved(self, node, g, 0, 1)      # announced before the host block it displaces is removed
        target = host.allocate(1)[0]                 # the host queue's front: empty, or a cached host block
        self._drop_host_block(g, target)
        if host.storage is not None and self.pools[g].storage is not None:
            self.policy.tier_copy(host.storage, target, self.pools[g].storage, page)
        self._swap_ids(g, page, target)
        # the block keeps its place in the tree and its priority; its GPU page goes to the allocation
        del self.page_node[g][page]
        node.pages[g] = -1
        self.pools[g].num_reusable, host.num_reusable = self.policy.tier_counts_after_offload(
            self.pools[g].num_reusable, host.num_reusable)
        if node.parent is not None:
            node.parent.child_pages[g] -= 1
        node.host[g] = target
        self.host_node[g][target] = node
        host._used[target] = 1
        host.enqueue(target, node.priority if self.policy.offload_keeps_priority else DEFAULT_PRIORITY,
                     node.duration_ms)
        self.offloaded += 1

    def _front_host_block_is_above(self, g: int, node: Node) -> bool:
        """Whether the host block an offload would take next holds an ancestor of ``node``: taking it drops
        that ancestor with its descendants, ``node`` among them, so there is nothing left to offload and the GPU
        block is evicted as without a tier (found by the exhaustive explorer: the offload then deleted a page the
        drop had already taken out of the tree, a KeyError)."""
        victim = self.host_node[g].get(self.host[g].queue.peek())    # the host tier's victim, not taken yet
        if victim is None:
            return False
        up = node.parent
        while up is not None:
            if up is victim:
                return True
            up = up.parent
        return False

    def _drop_host_block(self, g: int, row: int) -> None:
        """The cached block on host page ``row`` (if any) leaves the tree with its descendants (``freeChildren``
        on the block whose memory the offload takes)."""
        node = self.host_node[g].get(row)
        if node is None or node.host[g] != row:
            return
        self._detach_subtree(node, g)
        self._unset_host(node, g)
        self.host_dropped += 1

    def _unset_host(self, node: Node, g: int) -> None:
        self.events.removed(self, node, g)
        row = node.host[g]
        del self.host_node[g][row]
        node.host[g] = -1
        host = self.host[g]
        host.num_reusable -= 1
        host._used[row] = 0
        self._prune(node)

    def _detach_subtree(self, node: Node, g: int) -> None:
        """As ``QueuedReuseCache._detach_subtree``, for descendants on either tier: a host descendant's page is
        empty where it waits in the host queue."""
        with self.events.silenced(not self.policy.removed_event_for_descendants):
            for child in deepest_first(node):
                if child.host[g] >= 0 and child.refs[g] == 0:
                    self._unset_host(child, g)
        super()._detach_subtree(node, g)

    # ---- lower-tier-only mode: every unheld cached block leaves the GPU at once ------------------------------
    def demote_unheld(self) -> None:
        """Each cached GPU block nobody holds, deepest first, goes to the host tier as an eviction would send it
        there (``_take_cached``: offloaded when its priority allows and the host has a page, else out of the tree
        with its descendants); its GPU page stays where it is in the free queue, now empty."""
        for g, pool in enumerate(self.pools):
            while True:
                unheld = [n for p, n in self.page_node[g].items() if n.pages[g] == p and n.refs[g] == 0
                          and n.host[g] < 0]
                if not unheld:
                    break
                node = max(unheld, key=lambda n: (n.depth, -n.serial))
                if not self.policy.demotion_frees_gpu_copy and self._copy_down(g, node):
                    continue
                page = node.pages[g]
                self._take_cached(g, page)
                pool.mark_empty(page)

    def _copy_down(self, g: int, node: Node) -> bool:
        """A host copy of a block that keeps its GPU page (only a defect does this: one block on both levels).
        False when the host has no empty page."""
        host = self.host[g]
        if host.num_free == 0 or self._front_host_block_is_above(g, node):
            return False
        row = host.allocate(1)[0]
        self._drop_host_block(g, row)
        node.host[g] = row
        self.host_node[g][row] = node
        host.num_reusable += 1
        host._used[row] = 1
        host.enqueue(row, node.priority, node.duration_ms)
        self.offloaded += 1
        return True

    # ---- onboard: a request reuses a block from the host tier ------------------------------------------------
    def claim_host(self, node: Node, g: int) -> None:
        """Hold a host block for a match before any GPU page is taken, so no offload can drop it (upstream's
        two-phase claim-then-onboard)."""
        if node.refs[g] == 0:
            self.host[g].queue.claim(node.host[g])
            self.host[g].num_reusable -= 1        # held: no longer a cached host block anyone could take
        node.refs[g] += 1

    def onboard(self, node: Node, g: int, page: int) -> int:
        """Copy a claimed host block into ``page`` (a fresh GPU page): the block is on the GPU again, held by the
        claiming request, and its host page is empty at the back of the default host FIFO."""
        host, row = self.host[g], node.host[g]
        if host.storage is not None and self.pools[g].storage is not None:
            self.policy.tier_copy(self.pools[g].storage, page, host.storage, row)
        self._swap_ids(g, page, row)
        del self.host_node[g][row]
        node.host[g] = -1
        host._used[row] = 0
        host.enqueue(row, DEFAULT_PRIORITY)
        return self.onboarded_to(node, g, page)

    def unclaim_host(self, node: Node, g: int) -> None:
        """Undo ``claim_host`` (a match that could not be completed)."""
        node.refs[g] -= 1
        if node.refs[g] == 0:
            self.host[g].queue.restore(node.host[g])
            self.host[g].num_reusable += 1

    def set_page(self, node: Node, g: int, page: int) -> None:
        """A block the tree already holds in the host tier keeps its block: ``storeBlocks`` finds the match (a
        secondary block too) and traverses it, so the request's own copy stays private and goes free with it (filing
        it beside the host copy put one block on both tiers, counted on each)."""
        if node.host[g] >= 0:
            return
        super().set_page(node, g, page)

    def reset(self) -> None:
        for g, host in enumerate(self.host):
            for row, node in list(self.host_node[g].items()):
                self.events.removed(self, node, g)
                host.queue.remove(row)
                node.host[g] = -1
                host._used[row] = 0
                host.enqueue(row, DEFAULT_PRIORITY)
            self.host_node[g].clear()
            host.num_reusable = 0
        super().reset()


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class HostTierDecisions(Decisions):
    SUBSYSTEM = "host tier"

    demotion_frees_gpu_copy = setting(
        True, "whether a block kvcm's lower-tier-only mode moves to the host gives its GPU page back (one page a "
        "block, on one level; V1's secondary pool and V2's host level alike); SGLang PR #34046 / #33777: write-back "
        "kept a host copy of a component that stayed resident on the device, the block held pages on both levels "
        "and exhausted the host pool")

    @rule("whether a cached block an allocation evicts may go to the host tier: at a priority at least "
          "secondary_offload_min_priority (evictionPolicy.cpp getFreeBlock tests level >= min; the docstring of "
          "KvCacheConfig says '>', and a block at exactly the minimum was then dropped)")
    def offloadable(priority: int, min_priority: int) -> bool:
        return priority >= min_priority

    offload_keeps_priority = setting(
        True, "whether an offloaded block waits in the host queue at its own priority ('Update the block as a "
        "secondary block (maintaining its priority)', kvCacheManager.cpp getFreeBlock); at the default (35), "
        "priorities lost on the way down let a long-kept system prompt go before a one-off answer once the host "
        "filled")

    @rule("the reusable counts (GPU, host) after a block moves to the host tier: one fewer on the GPU, one more on "
          "the host (TensorRT-LLM PR #12834 / #12297, issue #11879: the claim after the memory swap updated the "
          "other level's list, free > max and used < 0)")
    def tier_counts_after_offload(gpu_reusable: int, host_reusable: int) -> tuple[int, int]:
        return gpu_reusable - 1, host_reusable + 1

    @rule("copy one block's KV between the GPU and host tiers, ordered with its use: queued on the device's stream, "
          "after the kernels that wrote the block and before those that read it, the host not waiting "
          "(TensorRT-LLM kvCacheTransferManager.cpp: onboard and offload streams joined to the compute stream by "
          "events, syncWithBufferManager / syncTransfers; #8813: with host_cache_size a hit returned other prompts' "
          "tokens, the copy not synchronized with its use). A waiting copy stalled the host for the GPU's queue at "
          "every block: the engine's next step, launched before the last one finished, lost its overlap")
    def tier_copy(dst_storage, dst_row: int, src_storage, src_row: int) -> None:
        dst_storage[dst_row].copy_(src_storage[src_row], non_blocking=True)
