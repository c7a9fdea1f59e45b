"""Available tokens: TensorRT-LLM's ``get_num_available_tokens`` and the ``clamp_max_seq_len_for_mem`` under it,
restated against kvcm (docs/semantics.md 4.2).

Upstream sources: ``tensorrt_llm/runtime/kv_cache_manager_v2/_core/_kv_cache_manager.py``
(``clamp_max_seq_len_for_mem``) and ``tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py``
(``get_num_available_tokens``), plus the unit tests each case names.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

from _build import build, one_layer, sliding_then_full, v4
from kvcm.versions import NAMES as ALL_VERSIONS


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_long_dummy_fills_what_two_short_dummies_leave(kvcm_version):
    """Source: ``clamp_max_seq_len_for_mem`` starts from ``storage.num_slots`` (each pool's total) and takes
    ``bs - 1`` one-token requests away. Pool of 8 blocks (tpb 32, one full-attention layer), B=3, two short
    generation dummies held: 8 - 2 = 6 blocks, 192 tokens (V1 counts free blocks and ignores batch_size: also
    192)."""
    mgr = build(kvcm_version, one_layer(), KvCacheConfig(max_tokens=256), max_batch_size=3)
    assert mgr.add_dummy_requests(["s0", "s1"], is_gen=True) is not None
    assert mgr.get_num_available_tokens(token_num_upper_bound=4096, batch_size=3) == 192


@pytest.mark.upstream("test_clamp_max_seq_len_counts_pages")
def test_other_single_token_sequences_take_one_block_each():
    """Upstream ``test_clamp_max_seq_len_counts_pages`` (kv_cache_manager_v2 arena tests): at batch 4 the three
    other single-token sequences take one unit each (a page there, a block here). 16 blocks of 32: batch 1
    answers 512, batch 4 answers 13 x 32 = 416."""
    mgr = kvcm.KVCacheManagerV2(one_layer(), KvCacheConfig(max_tokens=512), max_batch_size=4, max_seq_len=65536,
                                device="meta")
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**6, batch_size=1) == 16 * 32
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**6, batch_size=4) == 13 * 32


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
@pytest.mark.upstream("test_clamp_max_seq_len_counts_pages")
def test_bound_below_capacity_is_returned_unchanged(kvcm_version):
    """Upstream ``test_clamp_max_seq_len_counts_pages``: ``clamp_max_seq_len_for_mem(1, 500) == 500`` when the
    pool holds more than 500 tokens; the answer is the bound itself, not rounded to a block."""
    mgr = build(kvcm_version, one_layer(), KvCacheConfig(max_tokens=4096))
    assert mgr.get_num_available_tokens(token_num_upper_bound=500) == 500


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
@pytest.mark.upstream("test_real_v2_separates_logical_length_from_reused_physical_capacity")
def test_max_tokens_caps_the_answer(kvcm_version):
    """Upstream ``test_real_v2_separates_logical_length_from_reused_physical_capacity``: ``max_tokens=9_280``,
    tpb 64, one layer of 2 KV heads x 16 (fp16): ``get_num_available_tokens(token_num_upper_bound=32_768)`` is
    9_280 (145 blocks of 64)."""
    mgr = build(kvcm_version, one_layer(2, 16, "float16"), KvCacheConfig(tokens_per_block=64, max_tokens=9_280,
                                                                     dtype="float16"), max_batch_size=1)
    assert mgr.layer_groups[0].num_blocks == 145
    assert mgr.get_num_available_tokens(token_num_upper_bound=32_768) == 9_280


def test_extra_and_draft_tokens_are_added_to_the_bound_and_taken_from_the_answer():
    """Source: ``get_num_available_tokens`` in ``pyexecutor/kv_cache/kv_cache_manager_v2.py``:
    ``clamp(bs, bound + extra) - extra`` with ``extra = num_extra_kv_tokens + max_num_draft_tokens``. 10 blocks of
    32, E = 3, 4 drafts: 320 - 7 = 313; a bound of 100 fits and comes back as 100."""
    mgr = kvcm.KVCacheManagerV2(one_layer(), KvCacheConfig(max_tokens=320), max_batch_size=4, max_seq_len=65536,
                                num_extra_kv_tokens=3, device="meta")
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**4, max_num_draft_tokens=4) == 313
    assert mgr.get_num_available_tokens(token_num_upper_bound=100, max_num_draft_tokens=4) == 100


def test_explicit_max_tokens_caps_below_the_pool():
    """Source: ``get_num_available_tokens`` caps by ``_gpu_max_tokens - extra_tokens`` when ``max_tokens`` is
    set. max_tokens 300 makes ceil(300 / 32) = 10 blocks (320 tokens), yet the answer is 300 - 7 = 293."""
    mgr = kvcm.KVCacheManagerV2(one_layer(), KvCacheConfig(max_tokens=300), max_batch_size=4, max_seq_len=65536,
                                num_extra_kv_tokens=3, device="meta")
    assert mgr.layer_groups[0].num_blocks == 10
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**4, max_num_draft_tokens=4) == 293


@pytest.mark.upstream("test_the_sequence_length_clamp_does_not_depend_on_the_layer_subset")
def test_the_clamp_does_not_depend_on_layer_widths():
    """Upstream ``test_the_sequence_length_clamp_does_not_depend_on_the_layer_subset``: the longest sequence a
    batch fits follows from the block counts and the life cycles alone. Two models with the same life cycles
    (full + window 64) and other layer widths, pools split to the same block counts, answer alike for batch
    sizes 1, 2, 5, 12 and bounds 16 ... 2^20; the pools bind (0 < clamp(1, 2^20) < 2^20) and batch 12 answers
    less than batch 1."""
    wide = ModelSpec((LayerSpec(4, 128, "bfloat16", model_layer=0), LayerSpec(4, 128, "bfloat16", 64, model_layer=1)))
    narrow = sliding_then_full(64)
    managers = []
    for spec in (wide, narrow):
        bpb = [g.bytes_per_block for g in kvcm.KVCacheManagerV2(spec, KvCacheConfig(max_tokens=64), max_batch_size=1,
                                                                 max_seq_len=65536, device="meta").layer_groups]
        ratio = tuple(b * 40 for b in bpb)  # 40 blocks in each pool
        cfg = KvCacheConfig(max_gpu_total_bytes=sum(ratio), pool_ratio=ratio)
        managers.append(kvcm.KVCacheManagerV2(spec, cfg, max_batch_size=16, max_seq_len=65536, device="meta"))
    assert [[g.num_blocks for g in m.layer_groups] for m in managers] == [[40, 40], [40, 40]]
    clamps = {}
    for bs in (1, 2, 5, 12):
        for bound in (16, 160, 512, 4096, 1 << 20):
            answers = [m.get_num_available_tokens(token_num_upper_bound=bound, batch_size=bs) for m in managers]
            assert answers[0] == answers[1], (bs, bound)
            clamps[bs, bound] = answers[0]
    assert 0 < clamps[1, 1 << 20] < 1 << 20
    assert clamps[12, 1 << 20] < clamps[1, 1 << 20]


def test_sliding_blocks_out_of_the_window_are_not_counted():
    """Source: ``clamp_max_seq_len_for_mem``'s ``get_num_slots`` takes each life cycle's stale range away. Full
    and window-64 pools of 10 blocks each (tpb 32): the long request keeps only its window in the sliding pool,
    so the full pool binds at 320 tokens."""
    mgr = kvcm.KVCacheManagerV2(sliding_then_full(64), KvCacheConfig(max_gpu_total_bytes=40 * 1024,
                                                                     pool_ratio=(1, 1)),
                                max_batch_size=4, max_seq_len=65536, device="meta")
    assert [g.num_blocks for g in mgr.layer_groups] == [10, 10]
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**4) == 320


def test_deepseek_v4_long_dummy_fills_what_the_shorts_leave():
    """Source: ``clamp_max_seq_len_for_mem`` over DeepSeek-V4's life cycles. With an explicit pool ratio the
    compressed full-length group (group 1) binds; with two short dummies held the answer is its free blocks x
    128 exactly, and a dummy of that size fits."""
    mgr = v4((128, 4, 128, 4), KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=64 * 2**20,
                                             pool_ratio=(4, 1, 4)), max_seq_len=16384)
    assert mgr.add_dummy_requests(["s0", "s1"], is_gen=True) is not None
    free = mgr.pools[1].num_free
    available = mgr.get_num_available_tokens(token_num_upper_bound=16000, batch_size=3)
    assert available == free * 128 == (mgr.layer_groups[1].num_blocks - 2) * 128
    assert mgr.add_dummy_requests(["long"], token_nums=[available], is_gen=True) is not None
