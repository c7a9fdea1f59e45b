"""A request of ``max_model_len`` tokens is admissible exactly when the pool can hold it, the pages the engine
holds back from every request (vLLM's null block) counted.

vLLM PR #47272: the startup check compared ``max_model_len`` with the *total* block count; a pool of exactly
``ceil(max_model_len / block_size)`` blocks passed it and then hung at 0 tok/s, one usable block short. Sizing a
pool for ``max_model_len`` must add ``reserved_pages``; ``pages_for_max_model_len`` is that sizing rule.
"""

import pytest

from pytest_kvcm.targets import PoolSpec
from pytest_kvcm.targets import contract


@pytest.mark.parametrize("spare", [0, -1], ids=["exact", "one-page-short"])
def test_max_model_len_request_fits_exactly_when_the_pool_holds_it(kvcm_target, spare):
    probe = kvcm_target(PoolSpec(num_pages=8))
    max_model_len = 5 * probe.page_size + 3
    pages = contract.pages_for_max_model_len(max_model_len, probe.page_size, probe.reserved_pages) + spare
    target = kvcm_target(PoolSpec(num_pages=pages, max_model_len=max_model_len, page_size=probe.page_size))
    admitted = target.allocate("longest", max_model_len)
    if spare and target.differs("exact_pool_size", "a pool asked one page short may hold more: its admission is not "
                                                   "judged (the pool asked exactly must admit it, as always)"):
        return
    assert admitted == (spare == 0), (
        f"{target}: max_model_len={max_model_len} needs 6 pages of {target.page_size}; pool of {pages} with "
        f"{target.reserved_pages} reserved {'refused' if not admitted else 'admitted'} it")


def test_pool_sized_by_the_rule_serves_max_model_len_beside_a_null_page():
    """The sizing rule on the CPU lane: kvcm V2 with one page held back the way vLLM's BlockPool holds block 0."""
    from pytest_kvcm.targets.kvcm_targets import KvcmV2Target

    max_model_len = 5 * 16 + 3
    pages = contract.pages_for_max_model_len(max_model_len, 16, reserved_pages=1)
    target = KvcmV2Target(PoolSpec(num_pages=pages, max_model_len=max_model_len))
    assert target.allocate("null", 1), "the held-back page"
    assert target.allocate("longest", max_model_len), (
        f"a pool of {pages} pages sized for max_model_len={max_model_len} with one reserved page refused it")
