"""Gemma 3 270M's pools at 1 GiB against what TensorRT-LLM's V2 would give for the same budget.

Source: ``tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py`` (commit 00f6bd61),
``StorageManager.__init__``: the initial pool ratio comes from the typical batch when there is one; else, when
there are constraints, from the constraints' own slot bytes ("Use the constraint slot counts as the ratio
basis"); else from one request ``KVCacheDesc(capacity=2049, history_length=2048)``. Slot bytes there are
rounded up to the GPU pool granularity (2 MiB at 1 GiB) before they become a ratio, and each pool is a whole
number of grains: ``trtllm_storage_plan()`` restates upstream's counts exactly (docs/semantics.md 4.4), kvcm's
own split uses exact bytes.

Gemma 3 270M at tpb 32, bf16: the sliding group (15 layers, window 512) takes 480 KiB a block, the full group
(3 layers) 96 KiB.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig

from _build import GiB, build

SLIDING, FULL = 480 * 1024, 96 * 1024


def _gemma(max_num_tokens):
    cfg = KvCacheConfig(max_gpu_total_bytes=GiB, tokens_per_block=32)
    return build("v2", kvcm.load_spec("gemma-3-270m"), cfg, max_batch_size=256, max_seq_len=8192,
                 max_num_tokens=max_num_tokens)


def _split(weights):
    """Blocks per group when 1 GiB is shared in proportion to ``weights`` (bytes), as upstream's ratio does."""
    total = sum(weights)
    return [int(GiB * w / total) // size for w, size in zip(weights, (SLIDING, FULL))]


# no constraint, no typical step: both split by the (2049, 2048) request. It holds in the sliding group
# ceil(2049 / 32) - (2049 - 512) // 32 = 65 - 48 = 17 blocks, in the full group 65.
DEFAULT_REQUEST = _split([17 * SLIDING, 65 * FULL])


@pytest.mark.parametrize("group, name", [(0, "window512"), (1, "full")])
def test_without_constraints_each_group_gets_upstreams_default_share(group, name):
    mgr = _gemma(None)
    assert mgr.layer_groups[group].name == name
    assert mgr.constraints == [] and mgr.typical_step is None
    assert mgr.layer_groups[group].num_blocks == DEFAULT_REQUEST[group]    # [1236, 4733]


@pytest.mark.parametrize("group, name", [(0, "window512"), (1, "full")])
def test_with_the_context_constraint_kvcm_keeps_the_default_share_where_upstream_uses_the_constraint(group, name):
    """Deviation (docs/semantics.md 4.3, "Gemma 3"): with N = 8192 set and no typical step, upstream's ratio is
    the context constraint's bytes, 256 blocks in each group (8,192 tokens, nothing cached, nothing stale), so
    5:1 by bytes: about 1,820 blocks in each group, V1's layout (7 requests of 8,192 tokens). kvcm uses a
    constraint only as a floor and splits the rest by the (2049, 2048) request: 1,237 and 4,733 blocks, 18
    requests of 8,192 tokens. Both hold the constraint; kvcm's split holds more long requests."""
    mgr = _gemma(8192)
    upstream = _split([256 * SLIDING, 256 * FULL])
    assert upstream == [1820, 1820]
    assert mgr.constraint_names == ["context"]
    assert mgr.layer_groups[group].name == name
    assert [g.num_blocks for g in mgr.layer_groups][group] == [1237, 4733][group]
    assert mgr.layer_groups[group].num_blocks >= 256                      # the floor holds in both
    assert mgr.layer_groups[group].num_blocks != upstream[group]


def test_upstream_default_share_is_grain_rounded():
    """``ratio_from_batch`` rounds the (2049, 2048) request's slot bytes up to 2 MiB grains before taking the
    ratio: 17 x 480 KiB (7.97 MiB) and 65 x 96 KiB (6.09 MiB) both become 4 grains, so upstream splits 1 GiB
    1:1 by bytes: 256 grains each, 1,092 sliding and 5,461 full slots, where kvcm's exact-byte split gives 1,237
    and 4,733 (18 requests of 8,192 tokens against upstream's 21)."""
    plan = _gemma(None).trtllm_storage_plan()
    assert [plan.num_slots(g) for g in (0, 1)] == [1092, 5461]
    assert [pg.grains(plan.granularity) for pg in plan.pool_groups] == [256, 256]


def test_upstream_constraint_share_is_grain_rounded():
    """With N = 8192 and no typical step the ratio is the context constraint's floors in grains (256 blocks:
    120 MiB and 24 MiB, 5:1); the smaller share goes first, ``round(512 / 6) = 85`` grains, 1,813 full slots;
    the sliding group takes the other 427 grains, 1,821 slots. Both keep the 256-block floor."""
    plan = _gemma(8192).trtllm_storage_plan()
    assert [plan.num_slots(g) for g in (0, 1)] == [1821, 1813]
    assert [pg.min_slots for pg in plan.pool_groups] == [256, 256]
