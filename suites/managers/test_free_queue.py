"""V1's free queue on its own (``kvcm/free_queue.py``): the order rules of TensorRT-LLM's ``LRUEvictionPolicy``
(``evictionPolicy.cpp``: ``initialize``, ``addToFreeBlockQueue``, ``getFreeBlock``) and what a pool built on it
counts."""

from __future__ import annotations

import pytest

from kvcm.free_queue import FreeBlockQueue, QueuedBlockPool


def test_blocks_start_in_id_order_and_released_ones_join_the_back():
    q = FreeBlockQueue(6)
    taken = [q.victim() for _ in range(3)]
    assert taken == [0, 1, 2]
    for page in reversed(taken):               # a request releases its last block first
        q.release(page)
    assert q.order() == [3, 4, 5, 2, 1, 0] and len(q) == 6


def test_a_rewound_block_goes_to_the_front_before_never_used_ones():
    """``releaseLastBlock`` inserts at the front: the block is handed out again next."""
    q = FreeBlockQueue(4)
    a, b = q.victim(), q.victim()
    q.release(b, front=True)
    q.release(a, front=True)
    assert [q.victim() for _ in range(4)] == [a, b, 2, 3]


def test_the_lowest_priority_goes_first_and_fifo_within_a_priority():
    q = FreeBlockQueue(4)
    pages = [q.victim() for _ in range(4)]
    q.release(pages[0], 80)
    q.release(pages[1], 10)
    q.release(pages[2], 80)
    q.release(pages[3], 10)
    assert [q.victim() for _ in range(4)] == [1, 3, 0, 2]
    assert q.victim() is None


def test_a_claimed_page_restored_keeps_its_place():
    q = FreeBlockQueue(3)
    pages = [q.victim() for _ in range(3)]
    for page in pages:
        q.release(page)
    q.claim(1)
    assert q.order() == [0, 2]
    q.restore(1)
    assert q.order() == [0, 1, 2]
    q.claim(1)
    q.release(1)                # released again: the claim's place is forgotten
    q.restore(1)
    assert q.order() == [0, 2, 1]


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
