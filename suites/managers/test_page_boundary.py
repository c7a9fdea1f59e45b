"""The page-boundary contract (SEMANTICS 4.2, 6): a generation dummy sized by get_num_available_tokens fits.

The pool is 32 blocks of 32 tokens (max_tokens 1024), so the boundary is 32 x 32 = 1024 tokens of capacity.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig

from _manager_specs import tiny_spec


@pytest.mark.parametrize("extra", [0, 3])
def test_dummy_at_page_boundary_fits(kvcm_manager_factory, page_boundary_check, extra):
    def make(draft_len):
        return kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=4, max_seq_len=8192,
                                    max_draft_len=draft_len, num_extra_kv_tokens=extra, device="meta")

    results = page_boundary_check(make, draft_lens=(0, 4))
    for r in results:
        assert r.boundary == 1024  # 32 free blocks x 32 tokens
        assert r.capacity_held == 1024  # token_num + E + K lands exactly on the boundary
        assert r.available_tokens == 1024 - extra - r.draft_len  # 1024 - E - d


def test_dummy_at_page_boundary_with_window_group(page_boundary_check):
    """V2 with a sliding group: the full group (16 blocks) binds, the window group keeps only its window."""
    from _manager_specs import swa_spec

    def make(draft_len):
        return kvcm.KVCacheManagerV2(swa_spec(64), KvCacheConfig(max_gpu_total_bytes=32 * 2048, pool_ratio=(1, 1)),
                                     max_batch_size=4, max_seq_len=8192, max_draft_len=draft_len, device="meta")

    for r in page_boundary_check(make, draft_lens=(0, 4)):
        assert r.capacity_held == r.boundary == 16 * 32  # 512


def test_warmup_on_page_boundary_skips_nothing(kvcm_manager_factory, kvcm_results):
    """A budget of exactly 32 blocks: every shape's long dummy ends on a page boundary and must still fit.

    Shape (1, 0): available = 32 x 32 = 1024 (S - 1 = 8191 does not bind), capacity 1024 = 32 blocks: fits only
    if the dummy holds token_num + E + K and not one more token.
    """
    mgr = kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=4, max_seq_len=8192,
                               device="meta")
    report = kvcm.plan_warmup(mgr)
    kvcm_results.record(metric="warmup.skipped_shapes", value=len(report.skipped), passed=report.ok,
                        kvcm_version=mgr.version, extra=report.as_dict())
    assert [(s.batch_size, s.draft_len) for s in report.planned] == [(4, 0), (2, 0), (1, 0)]
    assert report.skipped == [], str(report)
    assert len(report.captured) == 3
    assert report.long_token_nums[kvcm.WarmupShape(1, 0)] == 1024
    assert mgr.get_num_free_blocks() == 32


def test_warmup_on_page_boundary_with_drafts(kvcm_manager_factory):
    mgr = kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=2, max_seq_len=8192,
                               max_draft_len=4, num_extra_kv_tokens=2, device="meta")
    report = kvcm.plan_warmup(mgr)
    assert report.skipped == [], str(report)
    # shape (1, 4): available = 1024 - E 2 - K 4 = 1018 tokens, capacity 1018 + 2 + 4 = 1024 = 32 blocks
    assert report.long_token_nums[kvcm.WarmupShape(1, 4)] == 1018
