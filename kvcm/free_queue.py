"""V1's pool order: TensorRT-LLM's ``LRUEvictionPolicy`` free queue (``evictionPolicy.cpp``), one FIFO per
retention priority holding every block no request holds, empty and cached alike.

Upstream starts with every block in the default-priority queue in id order, appends a released block at the
back (a request releases its last block first), puts a rewound block at the front (``releaseLastBlock``) and
hands out the front of the lowest non-empty priority, evicting the block from the reuse tree if it was cached.
So a cached block near the front goes before an empty one released later, and the ids a request gets are the
ones ``BlockManagerReuseTest`` pins. kvcm's ``BlockPool`` hands out the most recently freed page and evicts
only when no empty page is left, which is V2's order; V1 uses ``QueuedBlockPool`` instead.

Never-used pages stay a high-water mark (positions ``0..N-1`` at the default priority), so a pool of a million
pages still costs nothing to build; the rest is a heap of ``(priority, position)`` with lazy deletion.
``FreeBlockQueue`` is an ``kvcm.eviction.EvictionPolicy`` over pages; ``QueuedBlockPool.allocate`` is the one
place it is asked for a victim.
"""

from __future__ import annotations

import collections
import heapq
import itertools

from .block_pool import BlockPool
from .policy import Decisions, rule, setting
from .retention_clock import monotonic_ms

DEFAULT_PRIORITY = 35
"""TensorRT-LLM's ``kDefaultRetentionPriority``: the queue every block starts in."""


class FreeBlockQueue:
    """The blocks of one pool that no request holds, in the order ``getFreeBlock`` takes them.

    Three sources, each already in order: never-used pages (``fresh``), pages appended to the default FIFO (a
    deque: positions only grow, which is nearly every release) and the rest (other priorities, the front of the
    default FIFO, restored places: a heap). An entry is live while ``_key`` still maps its page to its key.
    ``claimed`` keeps the place of each page a request claimed, until it is released again or ``restore``d."""

    lazy = False

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.fresh = 0                         # pages [fresh, num_blocks) never queued: (35, id) each
        self._heap: list[tuple[int, int, int]] = []
        self._back35: collections.deque = collections.deque()   # (position, page) at the back of FIFO 35
        self._key: dict[int, tuple[int, int]] = {}   # queued page -> its (priority, position)
        self._back = num_blocks                # next position at the back (after every never-used page)
        self._front = 0                        # last position given at the front (decreasing)
        self._ghosts: set[tuple[int, int, int]] = set()   # second entries of a page queued twice (a defect)
        self.claimed: dict[int, tuple[int, int]] = {}     # claimed page -> the key it had

    def __len__(self) -> int:
        return len(self._key) + len(self._ghosts) + self.num_blocks - self.fresh

    def __contains__(self, page: int) -> bool:
        return page in self._key or page >= self.fresh

    def key(self, page: int) -> tuple[int, int] | None:
        if page in self._key:
            return self._key[page]
        return (DEFAULT_PRIORITY, page) if page >= self.fresh else None

    def release(self, page: int, priority: int = DEFAULT_PRIORITY, *, front: bool = False) -> None:
        """``addToFreeBlockQueue``: at the back of its priority's FIFO, or at the front (a rewound block)."""
        if self.claimed:
            self.claimed.pop(page, None)      # released again: a claim's place is forgotten
        if front:
            self._front -= 1
            self._place(page, (priority, self._front))
            return
        position = self._back
        self._back += 1
        if priority == DEFAULT_PRIORITY:
            self._key[page] = (priority, position)
            self._back35.append((position, page))
            if len(self._back35) > 2 * len(self._key) + 64:
                self._back35 = collections.deque(e for e in self._back35 if self._key.get(e[1]) == (35, e[0]))
        else:
            self._place(page, (priority, position))

    def push_many(self, pages: list[int]) -> None:
        """``push`` of each page, in order, at the back of the default FIFO (a whole request's release at once)."""
        positions = range(self._back, self._back + len(pages))
        self._back += len(pages)
        self._key.update(zip(pages, zip(itertools.repeat(DEFAULT_PRIORITY), positions)))
        self._back35.extend(zip(positions, pages))
        if len(self._back35) > 2 * len(self._key) + 64:
            self._back35 = collections.deque(e for e in self._back35 if self._key.get(e[1]) == (35, e[0]))

    def push_again(self, page: int) -> None:
        """Queue a page that is queued already, as a second entry (only a historic defect does this: vLLM #42571,
        TensorRT-LLM PR #14937, where a block released twice is handed out twice)."""
        if page not in self:
            return self.release(page)
        entry = (DEFAULT_PRIORITY, self._back, page)
        self._back += 1
        self._ghosts.add(entry)
        heapq.heappush(self._heap, entry)

    def _place(self, page: int, key: tuple[int, int]) -> None:
        self._key[page] = key
        heapq.heappush(self._heap, (key[0], key[1], page))
        if len(self._heap) > 2 * len(self._key) + 64:
            self._heap = [(p, pos, page) for page, (p, pos) in self._key.items()] + list(self._ghosts)
            heapq.heapify(self._heap)

    def remove(self, page: int) -> tuple[int, int]:
        """Take a queued page out for good; returns the key it had."""
        return self._key.pop(page)

    def claim(self, page: int) -> None:
        """``claimBlock``: a request holds the queued page (a cached block it reuses); its place is kept for
        ``restore``."""
        self.claimed[page] = self._key.pop(page)

    def restore(self, page: int) -> None:
        """A claim undone: the page is back where it was, as if it had never left (nothing if it was not claimed)."""
        key = self.claimed.pop(page, None)
        if key is not None:
            self._place(page, key)

    def touch(self, page: int) -> None:
        """A hit claims the block; upstream's queue orders by release, not by use."""

    def reprioritize(self, page: int, priority: int, *, front: bool = False) -> None:
        """A queued page at another priority: the back of that priority's FIFO (``refresh``: the front with
        ``front``)."""
        self._key.pop(page)
        self.release(page, priority, front=front)

    def clear(self) -> None:
        """Every page queued afresh, in id order (the pool is empty)."""
        self.__init__(self.num_blocks)

    def _top(self):
        """The first live entry of the heap and of the default FIFO's back, whichever comes first."""
        heap, back, key = self._heap, self._back35, self._key
        while heap:
            p, pos, page = heap[0]
            if key.get(page) == (p, pos) or heap[0] in self._ghosts:
                break
            heapq.heappop(heap)
        while back and key.get(back[0][1]) != (DEFAULT_PRIORITY, back[0][0]):
            back.popleft()
        h = heap[0] if heap else None
        b = (DEFAULT_PRIORITY, back[0][0], back[0][1]) if back else None
        if h is None or (b is not None and b < h):
            return b
        return h

    def _fresh_first(self, top) -> bool:
        return self.fresh < self.num_blocks and (top is None or (DEFAULT_PRIORITY, self.fresh) < top[:2])

    def peek(self) -> int | None:
        top = self._top()
        if self._fresh_first(top):
            return self.fresh
        return None if top is None else top[2]

    def fresh_run(self, n: int) -> range:
        """Up to ``n`` never-used pages that come before every queued page, taken at once (a long context's
        blocks from a fresh pool: one slice, not one heap look a page)."""
        top = self._top()
        if not self._fresh_first(top):
            return range(0)
        before_all = top is None or top[:2] > (DEFAULT_PRIORITY, self.num_blocks - 1)
        k = min(n, self.num_blocks - self.fresh) if before_all else 1
        run = range(self.fresh, self.fresh + k)
        self.fresh += k
        return run

    def victim(self, protected=()) -> int | None:
        """``getFreeBlock``: the front of the lowest non-empty priority (None when the queue is empty). Every
        queued page may go: a held one is never queued."""
        top = self._top()
        if self._fresh_first(top):
            self.fresh += 1
            return self.fresh - 1
        if top is None:
            return None
        if self._back35 and top == (DEFAULT_PRIORITY, self._back35[0][0], self._back35[0][1]):
            self._back35.popleft()
        else:
            heapq.heappop(self._heap)
        if top in self._ghosts:
            self._ghosts.discard(top)
        else:
            del self._key[top[2]]
        return top[2]

    def order(self) -> list[int]:
        """Every queued page, front first (for tests and the explorer's invariants)."""
        entries = [(key, page) for page, key in self._key.items()]
        entries += [((p, pos), page) for p, pos, page in self._ghosts]
        fresh = [((DEFAULT_PRIORITY, p), p) for p in range(self.fresh, self.num_blocks)]
        return [page for _, page in sorted(entries + fresh)]


class QueuedBlockPool(BlockPool):
    """A ``BlockPool`` whose free pages and unheld cached pages are one ``FreeBlockQueue``.

    ``num_free`` is the empty pages in the queue, ``num_reusable`` the cached ones (the reuse cache keeps that
    count), ``num_available`` both. ``on_take(page)`` (set by the reuse cache) is told when an allocation takes
    a queued page, so a cached one leaves the tree first."""

    def __init__(self, num_blocks: int, bytes_per_block: int, device="meta", *, policy=None):
        super().__init__(num_blocks, bytes_per_block, device, policy=policy)
        self.queue = FreeBlockQueue(self.num_blocks)
        self.on_take = None
        self.on_expire = None                  # told of a queued page whose priority fell back to 35
        self.release_priority = DEFAULT_PRIORITY   # the FIFO ``push_free`` appends to (set around a release)
        self.release_duration = None               # and how long it keeps it
        self.clock = monotonic_ms              # milliseconds; a V1 manager shares its RetentionClock (``set_clock``)
        self._expiring: list = []              # (expiry, serial, page, queue key) of timed queued pages
        self._serial = itertools.count()

    @property
    def num_free(self) -> int:
        return len(self.queue) - self.num_reusable

    @property
    def num_available(self) -> int:
        return len(self.queue)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.queue):
            raise RuntimeError(f"pool has {self.num_free} free blocks, {n} asked")
        out: list[int] = []
        while len(out) < n:
            run = self.queue.fresh_run(n - len(out))
            if run:
                self._grow_flags(run.stop)
                self._used[run.start:run.stop] = b"\x01" * len(run)
                out.extend(run)
                continue
            block = self.queue.victim()
            self._grow_flags(block + 1)
            if self.on_take is not None and self._used[block]:
                self.on_take(block)            # a cached block: evicted from the reuse tree
            self._used[block] = 1
            out.append(block)
        held = self.num_used - self.num_reusable
        if held > self.peak_held:
            self.peak_held = held
        return out

    def _grow_flags(self, stop: int) -> None:
        """In-use flags up to page ``stop`` (doubling, as ``BlockPool`` grows them)."""
        if stop > self._fresh:
            self._fresh = stop
            while len(self._used) < stop:
                self._used.extend(bytes(min(len(self._used), self.num_blocks - len(self._used))))

    def release(self, blocks, priorities=None, *, front: bool = False) -> None:
        """A request's pages, last first (``releaseBlocks`` walks its blocks in reverse); each goes to the back
        of its priority's FIFO, or to the front with ``front`` (``removeToken``'s ``releaseLastBlock``)."""
        blocks = list(blocks)
        if priorities is None and not front:           # the common release: one bulk append to FIFO 35
            pages = [b for b in reversed(blocks) if b >= 0]
            used, high = self._used, self._fresh
            for i, block in enumerate(pages):
                if block >= high or not used[block]:
                    for done in pages[:i]:
                        used[done] = 1       # nothing moved: the pages before it stay held
                    raise RuntimeError(f"block {block} released twice")
                used[block] = 0
            self.queue.push_many(pages)
            return
        for i in reversed(range(len(blocks))):
            block = blocks[i]
            if block < 0:
                continue
            if block >= self._fresh or not self._used[block]:
                raise RuntimeError(f"block {block} released twice")
            self._used[block] = 0
            priority, duration = (DEFAULT_PRIORITY, None) if priorities is None else priorities[i]
            self.enqueue(block, priority, duration, front=front)

    def free_order(self) -> list[int]:
        """Every queued page, empty or cached, in the order ``allocate`` takes them."""
        return self.queue.order()

    def push_free(self, block: int) -> None:
        """One page back without the double-release check (the policy's ``release_block`` makes it)."""
        self._used[block] = 0
        if block in self.queue:
            self.queue.push_again(block)
        else:
            self.enqueue(block, self.release_priority, self.release_duration)

    # ---- what the reuse cache does with cached pages -------------------------------------------------------
    def queue_cached(self, block: int, priority: int, duration_ms=None, *, front: bool = False) -> None:
        """A cached page nobody holds any more joins the back of its priority's FIFO (still in use: cached)."""
        self.enqueue(block, priority, duration_ms, front=front)

    # ---- retention durations ----------------------------------------------------------------------------------
    def enqueue(self, block: int, priority: int, duration_ms=None, *, front: bool = False) -> None:
        """``releaseBlock``: queue the page; one with a duration and a priority other than 35 starts its timer
        now (a claimed page never decays: its entry no longer matches once it leaves the queue)."""
        self.queue.release(block, priority, front=front)
        if duration_ms is not None and priority != DEFAULT_PRIORITY:
            heapq.heappush(self._expiring, (self.clock() + duration_ms, next(self._serial), block,
                                            self.queue.key(block)))

    def refresh(self) -> list[int]:
        """``LRUEvictionPolicy::refresh``: every queued page whose time is up moves to the back of the default
        FIFO at priority 35; returns them (the reuse cache lowers the cached ones' node priority)."""
        now, out = self.clock(), []
        while self._expiring and self._expiring[0][0] <= now:
            _, _, block, key = heapq.heappop(self._expiring)
            if self.policy.timer_live(key, self.queue.key(block)):
                self.queue.reprioritize(block, DEFAULT_PRIORITY, front=self.policy.expired_to_front)
                out.append(block)
                if self.on_expire is not None:
                    self.on_expire(block)
        return out

    def mark_empty(self, block: int) -> None:
        """A queued cached page that left the tree (a descendant of an evicted block) is empty where it is."""
        self._used[block] = 0


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class FreeQueueDecisions(Decisions):
    SUBSYSTEM = "V1's free queue and retention durations"

    expired_to_front = setting(
        False, "whether a block whose retention duration ran out goes to the front of the default (35) queue: no, "
        "to its back (LRUEvictionPolicy::refresh addToFreeBlockQueue(block, toFront=false)); at the front it was "
        "the next victim although other default-priority blocks had waited longer")

    @rule("whether a duration timer still applies to a queued block: only the entry of the release that started it "
          "(claimBlock erases the block from the expiring heap, so a block reused and released again starts anew); "
          "a stale timer dropped a just-released block's priority early")
    def timer_live(started_key, current_key) -> bool:
        return started_key == current_key
