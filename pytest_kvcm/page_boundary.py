"""The page-boundary check: the contract every KV cache manager must keep with CUDA-graph warmup.

Query the available tokens, allocate a generation dummy of exactly that size, and it must fit, with its
capacity on the page boundary, for every draft length. A manager under test (yours or kvcm's) needs:

* ``tokens_per_block``, ``num_extra_kv_tokens``
* ``get_num_free_blocks()``
* ``get_num_available_tokens(*, token_num_upper_bound, batch_size=1, max_num_draft_tokens=0)``
* ``add_dummy_requests(request_ids, token_nums=None, is_gen=False, max_num_draft_tokens=0,
  kv_reserve_draft_tokens=None)`` returning a list, or None with nothing allocated
* ``get_capacity(request_id)`` and ``free_resources(request_id)``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest


@dataclass
class PageBoundaryResult:
    draft_len: int
    tokens_per_block: int
    free_blocks: int
    available_tokens: int
    capacity_asked: int
    capacity_held: int | None
    boundary: int

    @property
    def ok(self) -> bool:
        return self.capacity_held is not None and self.capacity_held == self.capacity_asked <= self.boundary

    def __str__(self):
        held = "nothing (allocation failed)" if self.capacity_held is None else f"{self.capacity_held}"
        return (f"draft_len={self.draft_len}: get_num_available_tokens={self.available_tokens}, tpb="
                f"{self.tokens_per_block}, free blocks={self.free_blocks} (boundary {self.boundary} tokens), "
                f"capacity asked={self.capacity_asked}, capacity held={held}")


def check_page_boundary(make_manager: Callable[[int], object], draft_lens=(0, 4), *,
                        token_num_upper_bound: int | None = None, request_id="page-boundary") -> list[PageBoundaryResult]:
    """Run the check for each draft length on a fresh manager ``make_manager(draft_len)``; raise AssertionError
    naming the numbers when any draft length fails."""
    results = []
    for d in draft_lens:
        manager = make_manager(d)
        tpb, e = manager.tokens_per_block, manager.num_extra_kv_tokens
        free = manager.get_num_free_blocks()
        upper = token_num_upper_bound or (free + 1) * tpb * 2  # beyond the pool: the answer is the boundary
        available = manager.get_num_available_tokens(token_num_upper_bound=upper, max_num_draft_tokens=d)
        dummies = manager.add_dummy_requests([request_id], token_nums=[available], is_gen=True,
                                             max_num_draft_tokens=d)
        held = None if not dummies else manager.get_capacity(request_id)
        results.append(PageBoundaryResult(d, tpb, free, available, available + e + d, held, free * tpb))
        if dummies:
            manager.free_resources(request_id)
    failed = [r for r in results if not r.ok or r.capacity_asked != r.boundary]
    if failed:
        raise AssertionError("page-boundary check failed:\n  " + "\n  ".join(str(r) for r in failed))
    return results


@pytest.fixture
def page_boundary_check():
    """``page_boundary_check(make_manager, draft_lens=(0, 4))``: see ``check_page_boundary``."""
    return check_page_boundary
