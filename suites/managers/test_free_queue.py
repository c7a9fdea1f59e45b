"""V1's free queue on its own (``kvcm/free_queue.py``): the order rules of TensorRT-LLM's ``LRUEvictionPolicy``
(``evictionPolicy.cpp``: ``initialize``, ``addToFreeBlockQueue``, ``getFreeBlock``) and what a pool built on it
counts."""

from __future__ import annotations

import pytest

from kvcm.free_queue import FreeBlockQueue, QueuedBlockPool


def test_blocks_start_in_id_order_and_released_ones_join_the_back():
    q = FreeBlockQueue(6)
    taken = [q.pop() for _ in range(3)]
    assert taken == [0, 1, 2]
    for page in reversed(taken):               # a request releases its last block first
        q.push(page)
    assert q.queued() == [3, 4, 5, 2, 1, 0] and len(q) == 6


def test_a_rewound_block_goes_to_the_front_before_never_used_ones():
    """``releaseLastBlock`` inserts at the front: the block is handed out again next."""
    q = FreeBlockQueue(4)
    a, b = q.pop(), q.pop()
    q.push(b, front=True)
    q.push(a, front=True)
    assert [q.pop() for _ in range(4)] == [a, b, 2, 3]


def test_the_lowest_priority_goes_first_and_fifo_within_a_priority():
    q = FreeBlockQueue(4)
    pages = [q.pop() for _ in range(4)]
    q.push(pages[0], 80)
    q.push(pages[1], 10)
    q.push(pages[2], 80)
    q.push(pages[3], 10)
    assert [q.pop() for _ in range(4)] == [1, 3, 0, 2]
    with pytest.raises(RuntimeError, match="no free block"):
        q.pop()


def test_a_removed_page_restored_keeps_its_place():
    q = FreeBlockQueue(3)
    pages = [q.pop() for _ in range(3)]
    for page in pages:
        q.push(page)
    key = q.remove(1)
    assert q.queued() == [0, 2]
    q.restore(1, key)
    assert q.queued() == [0, 1, 2]


def test_pool_counts_empty_and_cached_pages_apart():
    """``num_free`` is the empty pages in the queue, ``num_available`` every queued page; a page queued twice (only
    the double-release defect does it) counts twice, the symptom vLLM #42571 showed."""
    pool = QueuedBlockPool(4, 16)
    pages = pool.allocate(2)
    assert (pool.num_free, pool.num_available, pool.num_used) == (2, 2, 2)
    pool.queue_cached(pages[0], 35)             # as the reuse cache does when a cached page is let go
    pool.num_reusable += 1
    assert (pool.num_free, pool.num_available) == (2, 3)
    pool.release([pages[1]])
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release([pages[1]])
    pool.push_free(pages[1])
    assert pool.num_available == 5 > pool.num_blocks
