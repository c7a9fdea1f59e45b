"""The pools TensorRT-LLM's V2 storage manager builds for a byte quota (docs/semantics.md 4.4), restated from
``tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py`` (commit 00f6bd61: ``cache_tier_granularity``,
``_compute_min_slots_from_constraints``, ``_compute_slot_count_for_level``), ``_storage/_core.py``
(``ratio_to_slot_count_list``, ``_grains_to_slots``) and ``_storage/_config.py`` (``create_storage_config``).

kvcm's own V2 pools come from exact bytes and refuse floors past the budget; ``trtllm_storage_plan()`` gives
upstream's number, and a ``BudgetExceededError`` carries it with the excess over the budget as the finding.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.layer_groups import build_layer_groups
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.storage_quota import plan_storage

from _build import GiB, build, one_layer

MiB = 2**20


@pytest.mark.parametrize("budget, grain_mib", [(512 * MiB, 2), (GiB, 2), (2 * GiB - 1, 2), (2 * GiB, 4),
                                               (3 * GiB, 4), (4 * GiB, 8), (16 * GiB, 32), (80 * GiB, 32)])
def test_grain_grows_with_the_quota(budget, grain_mib):
    """``cache_tier_granularity(GPU_MEM, quota)``: ``2 MiB << min(4, max(0, int(log2(quota / 1 GiB))))``: every
    pool is a whole number of these grains, and the quota is rounded up to one."""
    plan = plan_storage(one_layer(), build_layer_groups(one_layer(), 32), 32, budget)
    assert plan.granularity == grain_mib * MiB
    assert plan.quota_bytes == -(-budget // plan.granularity) * plan.granularity
    assert plan.pool_bytes <= plan.quota_bytes


def test_life_cycles_with_equal_slot_sizes_share_one_pool_group():
    """``create_storage_config`` merges life cycles whose slot size lists are equal into one pool group, whose
    floor is one slot per life cycle: two windows and full attention, all 8 KiB a block, make one group of
    three life cycles sharing 1 GiB / 8 KiB slots."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", 64, model_layer=0), LayerSpec(1, 64, "bfloat16", 128, model_layer=1),
                      LayerSpec(1, 64, "bfloat16", model_layer=2)), name="three-life-cycles")
    plan = plan_storage(spec, build_layer_groups(spec, 32), 32, GiB)
    [pool_group] = plan.pool_groups
    assert (pool_group.groups, pool_group.slot_sizes, pool_group.min_slots) == ((0, 1, 2), (8192,), 3)
    assert pool_group.num_slots == GiB // 8192 == plan.num_slots(0) == plan.num_slots(2)


def test_a_starved_pool_group_keeps_one_slot_per_life_cycle_in_whole_grains():
    """``ratio_to_slot_count_list`` pins a pool group at or under its floor (at least one slot per life cycle) to
    the slots its floor's grains hold: a ratio of 1e-9 for the window group still leaves it one 2 MiB grain, 256
    slots of 8 KiB; the full group (128 KiB a slot) gets the other grain, 16 slots."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", 64, model_layer=0), LayerSpec(8, 128, "bfloat16", model_layer=1)),
                     name="window-and-wide-full")
    plan = plan_storage(spec, build_layer_groups(spec, 32), 32, 4 * MiB, pool_ratio=(1e-9, 1.0))
    assert [(pg.slot_sizes, pg.min_slots, pg.num_slots) for pg in plan.pool_groups] == [((8192,), 1, 256),
                                                                                       ((131072,), 1, 16)]
    assert plan.pool_bytes == 4 * MiB and plan.excess_bytes == 0


def test_a_slots_buffers_of_different_sizes_are_pools_of_their_own():
    """``create_storage_config`` groups a life cycle's buffers by size, one pool per size, each rounded to
    grains on its own. DeepSeek-V4-Flash's full-length group (763,392 bytes a block) is three pools: 20 ratio-4
    COMPRESS rows (655,360), 20 fp8 INDEXER_COMPRESS rows (84,480) and 23 ratio-128 COMPRESS rows (23,552)."""
    mgr = kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(), KvCacheConfig(tokens_per_block=128,
                                                                           max_gpu_total_bytes=80 * GiB),
                                      max_batch_size=256, max_seq_len=8192, max_num_tokens=8192, device="meta")
    plan = mgr.trtllm_storage_plan()
    assert plan.pool_groups[1].slot_sizes == (655360, 84480, 23552)
    assert sum(plan.pool_groups[1].slot_sizes) == mgr.layer_groups[1].bytes_per_block
    assert plan.granularity == 32 * MiB and plan.pool_bytes == 80 * GiB and plan.excess_bytes == 0


def test_floors_past_the_budget_enlarge_the_pool():
    """``_compute_slot_count_for_level``: ``quota = max(min quota of the floors, rounded quota)``. One 8 KiB-a-block
    layer, N = 16384: the context constraint needs 512 blocks (4 MiB); a 1 MiB budget (one 2 MiB grain) becomes a
    4 MiB pool, 3 MiB over the budget (the finding). kvcm's manager refuses it and its error carries the plan."""
    with pytest.raises(kvcm.BudgetExceededError) as info:
        build("v2", one_layer(), KvCacheConfig(max_gpu_total_bytes=MiB), max_num_tokens=16384)
    plan = info.value.trtllm
    assert (plan.quota_bytes, plan.pool_bytes, plan.excess_bytes) == (4 * MiB, 4 * MiB, 3 * MiB)
    assert plan.pool_groups[0].num_slots == plan.pool_groups[0].min_slots == 512
    assert "enlarges the pool to its floors: 4194304 bytes (4.0 MiB), 3145728 bytes (3.0 MiB) over the budget" \
        in str(info.value)


def test_floors_of_two_life_cycles_in_one_pool_group_add_up():
    """A window-64 and a full layer of the same width share one pool group; one fresh request of 65,536 tokens
    (the context constraint at N = 65536) holds 2,048 blocks in each life cycle (nothing is stale at history 0),
    so the group's floor is 4,096 slots of 2 KiB: 8 MiB against a 1 MiB budget, 7 MiB over."""
    spec = ModelSpec((LayerSpec(1, 16, "bfloat16", 64, model_layer=0), LayerSpec(1, 16, "bfloat16", model_layer=1)),
                     name="window-and-full")
    with pytest.raises(kvcm.BudgetExceededError) as info:
        build("v2", spec, KvCacheConfig(max_gpu_total_bytes=MiB), max_num_tokens=65536)
    plan = info.value.trtllm
    assert [(pg.groups, pg.min_slots, pg.num_slots) for pg in plan.pool_groups] == [((0, 1), 4096, 4096)]
    assert (plan.quota_bytes, plan.excess_bytes) == (8 * MiB, 7 * MiB)


def test_within_the_budget_nothing_is_enlarged():
    """The same layer at 1 GiB: the floor (256 slots) is far below the budget; upstream builds 1 GiB / 8 KiB
    slots, exactly the budget in 2 MiB grains, as kvcm's exact split does for a budget that is whole grains."""
    mgr = build("v2", one_layer(), KvCacheConfig(max_gpu_total_bytes=GiB), max_num_tokens=8192)
    plan = mgr.trtllm_storage_plan()
    assert plan.excess_bytes == 0 and plan.pool_bytes == GiB
    assert plan.num_slots(0) == mgr.layer_groups[0].num_blocks == GiB // 8192
