"""Manager-level checks for KV-cache bugs other engines shipped (pytest_kvcm/defects/trtllm_field.py and
vllm_field.py name each one's upstream issue or PR). Each has a second catcher at another level: a contract
suite or an engine test."""

import pytest

import kvcm
from kvcm.attention_types import SlidingWindow
from kvcm.layer_groups import LayerGroup, ceil_div

from _manager_specs import build, swa_spec, tiny_spec
from kvcm.versions import NAMES as ALL_VERSIONS


@pytest.mark.parametrize("drafts", [0, 4])
def test_available_tokens_return_a_bound_that_fits(drafts):
    """TensorRT-LLM PR #13935: the bound is clamped with E + drafts added, then they are taken away again."""
    m = build("v2", tiny_spec(), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=32 * 64), max_seq_len=4096,
              num_extra_kv_tokens=2, max_draft_len=drafts)
    assert m.get_num_available_tokens(token_num_upper_bound=1000, max_num_draft_tokens=drafts) == 1000


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_failed_dummy_batch_leaves_no_dummy(kvcm_version):
    """TensorRT-LLM PR #17162: dummies registered before the one that did not fit must be released too."""
    m = build(kvcm_version, tiny_spec(), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=32 * 8))
    free = m.get_num_free_blocks()
    assert m.add_dummy_requests(["a", "b", "c"], token_nums=[32, 32, 32 * 7], is_gen=True) is None
    assert m.get_num_free_blocks() == free and m.request_ids == []


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_warmup_dummies_hold_their_draft_slots(kvcm_version):
    """vLLM PR #50531: warmup must reserve the lookahead the runtime reserves, so every dummy of a speculative
    shape holds token_num + E + K slots (and the long one ends on the page boundary)."""
    m = build(kvcm_version, tiny_spec(), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=32 * 20), max_seq_len=2048,
              max_draft_len=3, num_extra_kv_tokens=1)
    seen = {}

    def on_fit(shape, dummies):
        seen[shape] = [(d.token_num, d.capacity) for d in dummies]

    report = kvcm.plan_warmup(m, on_fit=on_fit)
    assert report.ok, str(report)
    for shape, dummies in seen.items():
        assert all(cap == tok + 1 + shape.draft_len for tok, cap in dummies), (shape, dummies)
    long_capacity = seen[kvcm.WarmupShape(1, 3)][-1][1]
    assert long_capacity % 32 == 0, f"the bs=1 long dummy holds {long_capacity} slots, not a page boundary"


def test_sliding_layers_get_their_own_window_pool():
    """vLLM PR #14097: sliding-window layers are a group of their own, sized by windows, not as global layers."""
    m = build("v2", swa_spec(window=64), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=32 * 40))
    assert [(g.name, g.window) for g in m.layer_groups] == [("full", None), ("window64", 64)]
    assert [g.num_blocks for g in m.layer_groups] == [40, 4 * (64 // 32 + 1)]


def test_sliding_window_bound_is_one_window():
    """vLLM issue #49878: one request's sliding-window bound is its window (unaligned: + 1 block), counted once."""
    for window, tpb, sinks, expected in ((64, 32, 0, 3), (40, 16, 0, 4), (64, 32, 4, 4)):
        group = LayerGroup(0, (0,), SlidingWindow(window, sinks, tokens_per_block=tpb), 1)
        assert group.max_pages() == expected == ceil_div(window, tpb) + 1 + ceil_div(sinks, tpb)


@pytest.mark.parametrize("batch", [1, 4])
def test_token_quota_of_a_hybrid_model(batch):
    """The quota from max_tokens: T tokens in the full group and B windows in the sliding one, no more."""
    m = build("v2", swa_spec(window=96), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=32 * 16),
              max_batch_size=batch)
    full, window = m.layer_groups
    assert (full.num_blocks, window.num_blocks) == (16, batch * 4)
    assert m.budget_bytes == (16 + batch * 4) * full.bytes_per_block


def test_hybrid_available_tokens_count_only_the_window():
    """vLLM PR #40946: a hybrid model's long request needs its window in the sliding pool, not the sequence; the
    answer is the full pool's page boundary though the sliding pool is far smaller."""
    m = build("v2", swa_spec(window=64), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=32 * 40))
    assert m.layer_groups[1].num_blocks < 40
    assert m.get_num_available_tokens(token_num_upper_bound=4096) == 40 * 32
    assert m.add_dummy_requests(["long"], token_nums=[40 * 32], is_gen=True) is not None


def test_final_cache_keeps_its_budget_after_estimation():
    """TensorRT-LLM PR #15881: the estimation run's dummy workload must not become the final V2 cache's
    max_tokens; the final pool is the budget the user gave."""
    budget = 64 * 4096  # 64 blocks of the tiny spec at tpb 32
    est = kvcm.build_with_estimation("v2", tiny_spec(), kvcm.KvCacheConfig(tokens_per_block=32,
                                     max_gpu_total_bytes=budget),
                                     max_batch_size=4, max_seq_len=256, free_memory_bytes=4 * budget)
    assert est.warmups and est.warmups[0].long_token_nums, "the estimation cache was warmed up"
    assert est.manager.pool_bytes == budget, est.manager.describe()
