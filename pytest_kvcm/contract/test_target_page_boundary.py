"""Page boundary through the contract: after ``bs - 1`` one-token requests, a request that exactly fills the
free pages (lookahead included) fits and one token more does not, for batch sizes 1-3 and lookahead 0 and 4.

The same contract TensorRT-LLM's CUDA-graph warmup relies on (docs/semantics.md 4.2, 7) and the check this project
started from, now asked of every target.
"""

import pytest

from pytest_kvcm.targets import PoolSpec


@pytest.mark.parametrize("lookahead", [0, 4])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_request_filling_the_free_pages_fits_and_one_more_token_does_not(kvcm_target, batch_size, lookahead, request):
    spec = PoolSpec(num_pages=12)
    target = kvcm_target(spec)
    target.xfail_finding(request, "block_count")       # a request of exactly the free pages asks one page more
    ps = target.page_size
    shorts = [f"short{i}" for i in range(batch_size - 1)]
    assert target.allocate_batch(shorts, [1] * len(shorts), lookahead), f"{target}: {len(shorts)} short requests"
    free = target.free_pages()
    assert free == target.usable_pages - len(shorts), f"{target}: each one-token request takes one page"
    longest = free * ps - lookahead
    assert target.allocate("longest", longest, lookahead), (
        f"{target}: {longest} tokens + lookahead {lookahead} = exactly {free} free pages of {ps}, refused")
    assert target.free_pages() == 0, f"{target}: {target.free_pages()} pages left after filling the pool"
    target.free("longest")
    assert target.free_pages() == free
    assert not target.allocate("longest", longest + 1, lookahead), (
        f"{target}: {longest + 1} tokens + lookahead {lookahead} need {free + 1} pages, {free} free, admitted")
    assert target.free_pages() == free
