"""The pools TensorRT-LLM's V2 storage manager would build for a byte quota (docs/semantics.md 4.4).

kvcm's own V2 split (``kvcm.constraints.split_quota``) works in exact bytes and refuses floors that do not fit.
TensorRT-LLM's ``StorageManager`` (``tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py`` and
``_storage/_core.py``) does three things differently, and a reference has to be able to give *its* number:

* memory comes in grains: 2 MiB below 2 GiB of quota, doubled for every doubling past 1 GiB, at most 32 MiB
  (``cache_tier_granularity``); every pool is a whole number of grains;
* every pool group keeps at least one slot per life cycle, and at least what each constraint needs there;
* when those floors cost more grains than the quota, the quota is *enlarged* to them: the pool is built past the
  budget (the historic out-of-memory). :class:`StoragePlan` reports that excess as its finding.

A pool group is one or more life cycles whose slots have the same per-pool sizes (``create_storage_config``);
inside a slot, buffers of the same size form one pool (K and V of every layer of a plain model: one pool).
Ratios come from the typical step, else from the constraint floors, else from one ``KVCacheDesc(2049, 2048)``
request, each in grain-rounded bytes; an explicit ``pool_ratio`` is used as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import BatchDesc
from .constraints import DEFAULT_SPLIT_REQUEST, batch_block_need
from .policy import Decisions, resolve, rule
from .units import ceil_div, human_bytes


@dataclass(frozen=True)
class PoolGroupPlan:
    """One pool group: the kvcm layer groups (life cycles) it holds, its per-pool slot sizes and its slots."""

    groups: tuple[int, ...]
    slot_sizes: tuple[int, ...]
    min_slots: int
    num_slots: int

    def grains(self, granularity: int) -> int:
        return grains_for_slots(self.num_slots, self.slot_sizes, granularity)


@dataclass(frozen=True)
class StoragePlan:
    """TensorRT-LLM's GPU pools for one budget; ``excess_bytes`` > 0 is the finding (floors past the budget)."""

    budget_bytes: int
    granularity: int
    min_quota_bytes: int
    quota_bytes: int
    pool_groups: tuple[PoolGroupPlan, ...]

    @property
    def pool_bytes(self) -> int:
        return sum(pg.grains(self.granularity) for pg in self.pool_groups) * self.granularity

    @property
    def excess_bytes(self) -> int:
        return max(0, self.pool_bytes - self.budget_bytes)

    def num_slots(self, group: int) -> int:
        """Slots of the pool group that holds kvcm layer group ``group`` (shared when groups share a pool)."""
        return next(pg.num_slots for pg in self.pool_groups if group in pg.groups)

    def finding(self) -> str:
        if not self.excess_bytes:
            return (f"TensorRT-LLM's storage manager builds {self.pool_bytes} bytes ({human_bytes(self.pool_bytes)}) "
                    f"within the budget")
        return (f"TensorRT-LLM's storage manager enlarges the pool to its floors: {self.pool_bytes} bytes "
                f"({human_bytes(self.pool_bytes)}), {self.excess_bytes} bytes ({human_bytes(self.excess_bytes)}) over "
                f"the budget")

    def as_dict(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "granularity": self.granularity, "quota_bytes": self.quota_bytes,
                "pool_bytes": self.pool_bytes, "excess_bytes": self.excess_bytes,
                "pool_groups": [{"groups": list(pg.groups), "slot_sizes": list(pg.slot_sizes),
                                 "min_slots": pg.min_slots, "num_slots": pg.num_slots} for pg in self.pool_groups]}


# ---- grains ---------------------------------------------------------------------------------------------------
def grains_for_slots(num_slots: int, slot_sizes, granularity: int) -> int:
    """Grains ``num_slots`` take: each pool of the group rounds up on its own."""
    return sum(ceil_div(num_slots * size, granularity) for size in slot_sizes)


def slots_in_grains(grains: int, slot_sizes, granularity: int) -> tuple[int, int]:
    """``(slots, grains used)``: the most slots whose pools fit in ``grains``; (0, 0) when not one fits."""
    if grains < grains_for_slots(1, slot_sizes, granularity):
        return 0, 0
    lo, hi = 1, 2
    while grains_for_slots(hi, slot_sizes, granularity) <= grains:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if grains_for_slots(mid, slot_sizes, granularity) <= grains else (lo, mid)
    return lo, grains_for_slots(lo, slot_sizes, granularity)


def round_up(n: int, unit: int) -> int:
    return ceil_div(n, unit) * unit


# ---- the plan -----------------------------------------------------------------------------------------------------
def slot_sizes(model, group, tpb: int) -> tuple[int, ...]:
    """Per-pool slot sizes of one life cycle, largest first: its buffers grouped by size (K and V are two
    buffers of half a layer's block each; an MLA latent or a DeepSeek-V4 role is one)."""
    by_size: dict[int, int] = {}
    for li in group.layers:
        layer = model.layers[li]
        size = layer.bytes_per_block(tpb) // layer.kv_factor
        by_size[size] = by_size.get(size, 0) + layer.kv_factor
    return tuple(sorted((size * n for size, n in by_size.items()), reverse=True))


def _slots_for_batch(batch: BatchDesc, members, groups, tpb: int) -> list[int]:
    return [sum(batch_block_need(batch, groups[g], tpb) for g in lcs) for lcs in members]


def _bytes(slots: list[int], sizes: list[tuple[int, ...]], granularity: int) -> list[int]:
    return [grains_for_slots(n, s, granularity) * granularity for n, s in zip(slots, sizes)]


def distribute(quota: int, sizes: list[tuple[int, ...]], ratio: list[float], granularity: int,
               min_slots: list[int]) -> list[int]:
    """Slots per pool group for ``quota`` bytes (a whole number of grains) shared by ``ratio``: hand out grains
    smallest share first, pin every group at or under its floor to the floor, share the rest again."""
    remaining = quota // granularity
    out = [0] * len(sizes)
    active = list(range(len(sizes)))
    while active:
        budget = remaining
        got: dict[int, int] = {}
        order = sorted(active, key=lambda i: ratio[i])
        for k, i in enumerate(order):
            share = ratio[i] / sum(ratio[j] for j in order[k:])
            got[i], used = slots_in_grains(round(budget * share), sizes[i], granularity)
            budget -= used
        pinned = [i for i in active if got[i] <= min_slots[i]]
        if not pinned:
            for i in active:
                out[i] = got[i]
            break
        for i in pinned:
            out[i], used = slots_in_grains(grains_for_slots(min_slots[i], sizes[i], granularity), sizes[i],
                                           granularity)
            remaining -= used
        active = [i for i in active if i not in pinned]
        if active and remaining <= 0:
            raise ValueError("insufficient quota to satisfy the floors")
    return out


def plan_storage(model, groups, tpb: int, budget_bytes: int, *, constraints=(), typical_step: BatchDesc | None = None,
                 pool_ratio=None, policy=None) -> StoragePlan:
    """TensorRT-LLM's pools for kvcm's layer ``groups`` of ``model`` and one GPU budget; ``policy``: the
    manager's (None: the active one), whose ``pool_granularity`` and ``storage_quota`` it asks."""
    policy = resolve(policy)
    keys: dict[tuple[int, ...], list[int]] = {}
    for g in groups:
        keys.setdefault(slot_sizes(model, g, tpb), []).append(g.index)
    members = list(keys.values())
    sizes = list(keys)
    granularity = policy.pool_granularity(budget_bytes)
    min_slots = [len(lcs) for lcs in members]
    for batch in constraints:
        min_slots = [max(m, n) for m, n in zip(min_slots, _slots_for_batch(batch, members, groups, tpb))]
    if pool_ratio is not None:
        weights = [float(sum(pool_ratio[g] for g in lcs)) for lcs in members]
    elif typical_step is not None:
        weights = _bytes(_slots_for_batch(typical_step, members, groups, tpb), sizes, granularity)
    elif constraints:
        weights = _bytes(min_slots, sizes, granularity)
    else:
        weights = _bytes(_slots_for_batch(BatchDesc([DEFAULT_SPLIT_REQUEST]), members, groups, tpb), sizes,
                         granularity)
    total = sum(weights)
    ratio = [w / total for w in weights]
    min_quota = sum(_bytes(min_slots, sizes, granularity))
    quota = policy.storage_quota(round_up(budget_bytes, granularity), min_quota)
    slots = distribute(quota, sizes, ratio, granularity, min_slots)
    plans = tuple(PoolGroupPlan(tuple(lcs), s, m, n) for lcs, s, m, n in zip(members, sizes, min_slots, slots))
    return StoragePlan(budget_bytes, granularity, min_quota, quota, plans)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class StorageQuotaDecisions(Decisions):
    SUBSYSTEM = "TensorRT-LLM's V2 storage"

    @rule("the grain every GPU pool is a whole number of: 2 MiB, doubled for every doubling of the quota past "
          "1 GiB, at most 32 MiB (from 16 GiB on; TensorRT-LLM _storage_manager.py cache_tier_granularity); sizing "
          "in exact bytes gives other slot counts than the pools upstream builds")
    def pool_granularity(quota_bytes: int) -> int:
        page = 2 << 20
        return page << min(4, max(0, int(math.log(quota_bytes / (page * 512), 2))))

    @rule("the quota the storage manager builds: the budget in whole grains, enlarged to the constraint floors "
          "when they need more (TensorRT-LLM _compute_slot_count_for_level: max(min quota, rounded quota)); the "
          "enlargement past the budget is the seed's out-of-memory, and a plan that leaves it out hides it")
    def storage_quota(rounded_budget: int, min_quota: int) -> int:
        return max(min_quota, rounded_budget)
