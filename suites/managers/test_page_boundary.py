"""The page-boundary contract (docs/semantics.md 4.2, 6): a generation dummy sized by get_num_available_tokens
fits, and with ``bs - 1`` short dummies already held it fills exactly the blocks they leave.

The pool is 32 blocks of 32 tokens (max_tokens 1024), so the boundary is (32 - (bs - 1)) x 32 tokens of capacity.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig

from _manager_specs import tiny_spec
from kvcm.versions import NAMES as ALL_VERSIONS


@pytest.mark.parametrize("extra", [0, 3])
def test_dummy_at_page_boundary_fits(kvcm_manager_factory, page_boundary_check, extra):
    def make(draft_len):
        return kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=4, max_seq_len=8192,
                                    max_draft_len=draft_len, num_extra_kv_tokens=extra, device="meta")

    results = page_boundary_check(make, draft_lens=(0, 4), batch_sizes=(1, 2, 3))
    assert len(results) == 6
    for r in results:
        boundary = (32 - (r.batch_size - 1)) * 32  # each short dummy holds one block
        assert r.boundary == boundary
        assert r.capacity_held == boundary  # token_num + E + K lands exactly on the boundary
        assert r.available_tokens == boundary - extra - r.draft_len


def test_dummy_at_page_boundary_with_window_group(page_boundary_check):
    """V2 with a sliding group: the full group (16 blocks) binds, the window group keeps only its window."""
    from _manager_specs import swa_spec

    def make(draft_len):
        return kvcm.KVCacheManagerV2(swa_spec(64), KvCacheConfig(max_gpu_total_bytes=32 * 2048, pool_ratio=(1, 1)),
                                     max_batch_size=4, max_seq_len=8192, max_draft_len=draft_len, device="meta")

    for r in page_boundary_check(make, draft_lens=(0, 4), batch_sizes=(1, 2, 3)):
        assert r.capacity_held == r.boundary == (16 - (r.batch_size - 1)) * 32  # 512, 480, 448


def test_long_dummy_fills_what_the_short_dummies_leave(kvcm_manager_factory):
    """8 blocks of 32 tokens, one full-attention layer, B=3: warmup holds two short generation dummies (one block
    each) and then asks. TensorRT-LLM's clamp_max_seq_len_for_mem counts from the pool's total slots less the
    two one-token requests: 6 blocks, 192 tokens. Counting from the free blocks as well took the shorts away
    twice and answered 128."""
    mgr = kvcm_manager_factory(kvcm.ModelSpec.uniform(1, 1, 64), KvCacheConfig(max_tokens=256), max_batch_size=3,
                               max_seq_len=8192, device="meta")
    assert mgr.add_dummy_requests(["s0", "s1"], is_gen=True) is not None
    assert mgr.get_num_free_blocks() == 6
    available = mgr.get_num_available_tokens(token_num_upper_bound=4096, batch_size=3)
    assert available == 192
    assert mgr.add_dummy_requests(["long"], token_nums=[available], is_gen=True) is not None
    assert mgr.get_num_free_blocks() == 0


def test_warmup_on_page_boundary_skips_nothing(kvcm_manager_factory, kvcm_results):
    """A budget of exactly 32 blocks: every shape's long dummy ends on a page boundary and must still fit.

    Shape (1, 0): available = 32 x 32 = 1024 (S - 1 = 8191 does not bind), capacity 1024 = 32 blocks: fits only
    if the dummy holds token_num + E + K and not one more token.
    """
    mgr = kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=4, max_seq_len=8192,
                               device="meta")
    report = kvcm.plan_warmup(mgr)
    kvcm_results.record(metric="warmup.skipped_shapes", value=len(report.skipped), passed=report.ok,
                        kvcm_version=mgr.kvcm_version, extra=report.as_dict())
    assert [(s.batch_size, s.draft_len) for s in report.planned] == [(4, 0), (2, 0), (1, 0)]
    assert report.skipped == [], str(report)
    assert len(report.captured) == 3
    assert report.long_token_nums[kvcm.WarmupShape(1, 0)] == 1024
    # bs 2 and 4: the long dummy fills the 31 and 29 blocks its short companions leave
    assert report.long_token_nums[kvcm.WarmupShape(2, 0)] == 31 * 32
    assert report.long_token_nums[kvcm.WarmupShape(4, 0)] == 29 * 32
    assert mgr.get_num_free_blocks() == 32


def test_warmup_on_page_boundary_with_drafts(kvcm_manager_factory):
    mgr = kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=2, max_seq_len=8192,
                               max_draft_len=4, num_extra_kv_tokens=2, device="meta")
    report = kvcm.plan_warmup(mgr)
    assert report.skipped == [], str(report)
    # shape (1, 4): available = 1024 - E 2 - K 4 = 1018 tokens, capacity 1018 + 2 + 4 = 1024 = 32 blocks
    assert report.long_token_nums[kvcm.WarmupShape(1, 4)] == 1018


def test_deepseek_v4_dummy_at_page_boundary_with_shorts_held(page_boundary_check):
    """DeepSeek-V4 (two HCA and two CSA layers, tpb 128; an explicit pool ratio, so no longest-decode floor
    lifts the full-length group past S): the compressed full-length group binds (98 blocks; 39 with D = 4, whose
    three MTP layers widen every block), and with the short dummies held the long one still fills exactly the
    blocks they leave."""
    from kvcm.deepseek_v4 import DeepseekV4CacheManager, DeepseekV4Spec

    spec = DeepseekV4Spec(compress_ratios=(128, 4, 128, 4))

    def make(draft_len):
        cfg = KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=64 * 2**20, pool_ratio=(4, 1, 4))
        return DeepseekV4CacheManager(spec, cfg, max_batch_size=4, max_seq_len=16384, max_draft_len=draft_len,
                                      device="meta")

    results = page_boundary_check(make, draft_lens=(0, 4), batch_sizes=(1, 2, 3))
    assert [r.free_blocks for r in results] == [98, 97, 96, 39, 38, 37]
    assert all(r.capacity_held == r.boundary for r in results)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_pool_larger_than_max_seq_len_checks_the_limit_it_has_and_names_the_one_to_change(version):
    """Issue 28.5: a pool of 8,192 tokens with max_seq_len=1024 has no page boundary one request can reach; the
    check tests the max_seq_len bound instead (no raw ConfigError about token_nums) and says which limit to move."""
    import warnings

    import kvcm
    from pytest_kvcm.page_boundary import PageBoundaryUntested, check_page_boundary

    def make(d, max_tokens=8192):
        return kvcm.create_kv_cache_manager(version, kvcm.load_spec("qwen3-0.6b"),
                                            kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=max_tokens),
                                            max_batch_size=4, max_seq_len=1024, max_num_tokens=1024,
                                            max_draft_len=d, device="meta")

    with pytest.warns(PageBoundaryUntested, match=r"max_seq_len=1024 stops every dummy before the pool does .*"
                                                   r"at most 32 blocks are free .* raise max_seq_len to at least 8192"):
        results = check_page_boundary(make, draft_lens=(0, 4))
    assert {(r.limit, r.available_tokens, r.capacity_held - r.draft_len) for r in results} == {("max_seq_len", 1024, 1024)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PageBoundaryUntested)  # a pool one request can fill: the page boundary
        results = check_page_boundary(lambda d: make(d, max_tokens=1024), draft_lens=(0, 4))
    assert all(r.limit == "pages" and r.capacity_held == r.boundary for r in results)
