"""The page-boundary check: the contract every KV cache manager must keep with CUDA-graph warmup.

Query the available tokens, allocate a generation dummy of exactly that size, and it must fit, with its
capacity on the page boundary, for every draft length and batch size. A manager under test (yours or kvcm's) needs:

* ``tokens_per_block``, ``num_extra_kv_tokens``
* ``get_num_free_blocks()``
* ``get_num_available_tokens(*, token_num_upper_bound, batch_size=1, max_num_draft_tokens=0)``
* ``add_dummy_requests(request_ids, token_nums=None, is_gen=False, max_num_draft_tokens=0,
  kv_reserve_draft_tokens=None)`` returning a list, or None with nothing allocated
* ``get_capacity(request_id)`` and ``free_resources(request_id)``

With ``batch_size > 1`` the ``batch_size - 1`` short dummies are held before the question is asked, exactly as
warmup does, and the long dummy must fill what they leave to the block (TensorRT-LLM's
``clamp_max_seq_len_for_mem`` counts from each pool's total slots; docs/semantics.md 4.2).

With ``cached_prefix_blocks=N`` (a manager with block reuse: ``add_sequence``, ``get_block_counts``) a warm
request of ``N`` blocks' worth of prompt runs and ends first, so its blocks sit in the pool cached and held by
nobody when the question is asked. They count as free (TensorRT-LLM and vLLM report them so), hence the long
dummy must evict every one of them to land on the boundary, and the pool's split (free, reusable, in use) must
add up to the pool with nothing counted twice, before and after (SGLang #35270, TensorRT-LLM PR #11490).

A pool larger than one request may hold (``max_seq_len`` below the blocks the shorts leave) has no page boundary
a request can reach: the dummy is bounded by ``max_seq_len`` first. Such a shape checks the boundary that limit
allows instead (the answer asked with ``token_num_upper_bound=max_seq_len`` is ``max_seq_len``, and a dummy of it
fits with exactly its capacity), its result says ``limit="max_seq_len"``, and when no shape reached the page
boundary a ``PageBoundaryUntested`` warning names the two ways to make it reachable: a pool of at most so many
tokens, or a ``max_seq_len`` of at least so many.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import pytest


class PageBoundaryUntested(UserWarning):
    """Every shape was bounded by ``max_seq_len`` before the pool: the page boundary itself was not reached."""


@dataclass
class PageBoundaryResult:
    draft_len: int
    tokens_per_block: int
    free_blocks: int
    available_tokens: int
    capacity_asked: int
    capacity_held: int | None
    boundary: int
    batch_size: int = 1
    cached_before: int = 0            # cached blocks nobody held when the question was asked
    cached_after: int = 0             # ... once the long dummy held its blocks (all evicted: 0)
    split_errors: tuple = ()          # where free + reusable + in use did not add up to the pool
    limit: str = "pages"              # what bounded the long dummy: "pages" (the pool) or "max_seq_len"

    @property
    def ok(self) -> bool:
        return (self.capacity_held is not None and self.capacity_held == self.capacity_asked <= self.boundary
                and not self.split_errors and (self.capacity_held is None or self.cached_after == 0))

    def __str__(self):
        held = "nothing (allocation failed)" if self.capacity_held is None else f"{self.capacity_held}"
        bounded = (f"boundary {self.boundary} tokens" if self.limit == "pages" else
                   f"bounded by max_seq_len: {self.boundary} tokens of capacity")
        return (f"batch_size={self.batch_size} draft_len={self.draft_len}: get_num_available_tokens="
                f"{self.available_tokens}, tpb={self.tokens_per_block}, free blocks={self.free_blocks} after "
                f"{self.batch_size - 1} short dummies ({bounded}), capacity asked="
                f"{self.capacity_asked}, capacity held={held}"
                + (f", cached blocks {self.cached_before} before / {self.cached_after} after" if self.cached_before
                   else "") + "".join(f"; {e}" for e in self.split_errors))


def hold_cached_prefix(manager, blocks: int, request_id) -> int:
    """Run a warm request of ``blocks`` full blocks (plus one token) to its end and free it, so its blocks stay
    cached; returns how many blocks the pool then holds cached and unreferenced."""
    if not getattr(manager, "enable_block_reuse", False) or not hasattr(manager, "add_sequence"):
        raise AssertionError(f"page-boundary check with a cached prefix: {type(manager).__name__} has no block "
                             "reuse on (add_sequence, enable_block_reuse)")
    n = blocks * manager.tokens_per_block + 1
    manager.add_sequence(request_id, [7 + i % 50 for i in range(n)])
    manager.begin_context_chunk(request_id, 0, n, n)
    manager.end_context_chunk(request_id, n)
    manager.free_resources(request_id)
    cached = manager.get_block_counts().reusable
    if cached < blocks:
        raise AssertionError(f"page-boundary check: a warm request of {n} tokens left {cached} cached blocks, "
                             f"{blocks} expected")
    return cached


def _split_error(manager, when: str) -> str | None:
    counts = manager.get_block_counts()
    free = manager.get_num_free_blocks()
    if counts.free + counts.reusable + counts.in_use != counts.total or free != counts.free + counts.reusable:
        return (f"{when}: free {counts.free} + reusable {counts.reusable} + in use {counts.in_use} of "
                f"{counts.total} blocks, get_num_free_blocks()={free}")
    return None


def _one_shape(manager, d: int, bs: int, upper: int | None, request_id,
               cached_prefix_blocks: int = 0) -> PageBoundaryResult:
    """Hold ``bs - 1`` short generation dummies first (as CUDA-graph warmup does), then size the long one."""
    tpb, e = manager.tokens_per_block, manager.num_extra_kv_tokens
    cached = hold_cached_prefix(manager, cached_prefix_blocks, (request_id, "warm")) if cached_prefix_blocks else 0
    errors = []
    short_ids = [(request_id, "short", i) for i in range(bs - 1)]
    if short_ids and manager.add_dummy_requests(short_ids, is_gen=True, max_num_draft_tokens=d) is None:
        raise AssertionError(f"page-boundary check: {bs - 1} short dummies (draft_len={d}) do not fit at all")
    held_ids = list(short_ids)
    try:
        free = manager.get_num_free_blocks()
        if cached:
            errors.append(_split_error(manager, "before the long dummy"))
            cached = manager.get_block_counts().reusable
        bound = upper or (free + bs + 1) * tpb * 2  # beyond the pool: the answer is the boundary
        max_seq_len, limit, boundary = getattr(manager, "max_seq_len", None), "pages", free * tpb
        if isinstance(max_seq_len, int) and free * tpb - e - d > max_seq_len:
            # no request may grow to the pool's boundary: check the one max_seq_len allows
            bound, limit, boundary = min(bound, max_seq_len), "max_seq_len", min(bound, max_seq_len) + e + d
        available = manager.get_num_available_tokens(token_num_upper_bound=bound, batch_size=bs,
                                                     max_num_draft_tokens=d)
        dummies = manager.add_dummy_requests([request_id], token_nums=[available], is_gen=True,
                                             max_num_draft_tokens=d) if available > 0 else None
        held = None if not dummies else manager.get_capacity(request_id)
        if dummies:
            held_ids.append(request_id)
        after = 0
        if cached:
            errors.append(_split_error(manager, "with the long dummy held"))
            after = manager.get_block_counts().reusable
        return PageBoundaryResult(d, tpb, free, available, available + e + d, held, boundary, bs, cached, after,
                                  tuple(x for x in errors if x), limit)
    finally:
        for rid in held_ids:
            manager.free_resources(rid)


def check_page_boundary(make_manager: Callable[[int], object], draft_lens=(0, 4), *, batch_sizes=(1, 2, 3),
                        token_num_upper_bound: int | None = None, request_id="page-boundary",
                        cached_prefix_blocks: int = 0) -> list[PageBoundaryResult]:
    """For each draft length and batch size, on a fresh manager ``make_manager(draft_len)``: hold the
    ``batch_size - 1`` short dummies, ask for the available tokens, allocate the long dummy. It must fit and end
    exactly on the page boundary the shorts leave (the pool's free blocks x tpb). With ``cached_prefix_blocks``,
    a warm request's blocks are cached first and must all be evicted to make room. Raises AssertionError naming
    the numbers of every failing shape."""
    __tracebackhide__ = True  # a failure shows the caller's line and the shapes' numbers
    results = []
    for d in draft_lens:
        for bs in batch_sizes:
            results.append(_one_shape(make_manager(d), d, bs, token_num_upper_bound, request_id,
                                      cached_prefix_blocks))
    failed = [r for r in results if not r.ok or r.capacity_asked != r.boundary]
    if failed:
        raise AssertionError("page-boundary check failed:\n  " + "\n  ".join(str(r) for r in failed))
    if results and all(r.limit == "max_seq_len" for r in results):
        warnings.warn(untested_message(make_manager(max(draft_lens)), results), PageBoundaryUntested, stacklevel=2)
    return results


def untested_message(manager, results) -> str:
    """Which limit to change so that a request can reach the page boundary."""
    worst = max(results, key=lambda r: r.free_blocks)
    tpb, msl, e = worst.tokens_per_block, manager.max_seq_len, manager.num_extra_kv_tokens
    room = -(-(msl + e + worst.draft_len) // tpb)  # blocks one request of max_seq_len may hold
    return (f"page boundary not reached: max_seq_len={msl} stops every dummy before the pool does (up to "
            f"{worst.free_blocks} free blocks of {tpb} tokens = {worst.free_blocks * tpb} tokens after the short "
            f"dummies); the check tested the max_seq_len bound instead. To test the page boundary, size the pool "
            f"so that at most {room} blocks are free beside the shorts (fewer max_tokens), or raise max_seq_len to "
            f"at least {worst.free_blocks * tpb - e - worst.draft_len}")


@pytest.fixture
def page_boundary_check():
    """``page_boundary_check(make_manager, draft_lens=(0, 4), batch_sizes=(1, 2, 3), cached_prefix_blocks=0)``:
    see ``check_page_boundary``."""
    return check_page_boundary
