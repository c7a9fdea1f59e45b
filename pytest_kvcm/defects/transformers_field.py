"""transformers' KV-cache bugs, put back into kvcm's managers through their decisions (``kvcm.policy``).

transformers 5.17 itself runs behind the contract as the ``hf-5.17`` target (``pytest_kvcm/targets/
hf_blocks_target.py``), where its bug is a strict xfail citing the release; the defect here puts the same arithmetic
into kvcm's V1, so ``kvcm sensitivity`` keeps proving that the contract and the manager tests catch it.
"""

from __future__ import annotations

from ._registry import defect

_LIFE = "pytest_kvcm/contract/test_target_lifecycle.py::"
_BOUNDARY = "pytest_kvcm/contract/test_target_page_boundary.py::"


def scheduler_517_blocks(tokens: int, tpb: int) -> int:
    """transformers 5.17's count for a request with no room yet: ((n + 1) // page) + 1."""
    return (tokens + 1) // tpb + 1


@defect("blocks-one-past-a-page", upstream="transformers 5.17.0 generation/continuous_batching/scheduler.py "
        "Scheduler._allocate_blocks_if_needed (((n - room + 1) // block_size) + 1 blocks; PR #47809, 5.18, moved the "
        "count to the allocators, which take ceil)",
        story="a request of a whole number of pages, or one token short of it, took one block too many: a 16-token "
              "prompt on pages of 16 held 2, and a request that fills the free pages exactly was refused",
        catchers=(_BOUNDARY + "test_request_filling_the_free_pages_fits_and_one_more_token_does_not[kvcm-v1-1-0]",
                  _BOUNDARY + "test_request_filling_the_free_pages_fits_and_one_more_token_does_not[kvcm-v1-2-4]",
                  _LIFE + "test_no_page_leaks_after_free[kvcm-v1]",
                  _LIFE + "test_refused_batch_allocation_leaves_nothing_allocated[kvcm-v1]"))
def blocks_one_past_a_page():
    return {"v1_blocks_for_tokens": scheduler_517_blocks}
