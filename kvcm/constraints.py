"""V2's constraints and pool split: how a byte budget becomes blocks per layer group.

A constraint is a batch (``BatchDesc``) the manager must always be able to hold; it puts a floor under every
group's pool. The typical step (or an explicit ``pool_ratio``) decides how the rest of the budget is shared.
Floors that cost more than the budget raise ``BudgetExceededError``: a pool is never sized past its budget in
silence (docs/semantics.md 4.3 and 6).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import BatchDesc, KVCacheDesc
from .errors import BudgetExceededError, ConfigError
from .layer_groups import LayerGroup
from .limits import Limits
from .units import ceil_div

#: The split used when neither a typical step nor a pool ratio is given: one long request.
DEFAULT_SPLIT_REQUEST = KVCacheDesc(2049, 2048)


@dataclass(frozen=True)
class NamedConstraint:
    name: str
    batch: BatchDesc


def batch_block_need(batch: BatchDesc, group: LayerGroup, tpb: int) -> int:
    """Blocks ``batch`` holds in ``group``: per request ``ceil(capacity/tpb)`` less stale blocks.

    The whole blocks of a shared system prompt are counted once in full-attention groups.
    """
    need = sum(group.pages_needed(kv.capacity, kv.history_length) for kv in batch.kv_caches)
    if group.is_full and batch.system_prompt_length and len(batch.kv_caches) > 1:
        shared = batch.system_prompt_length // tpb
        sharing = sum(1 for kv in batch.kv_caches if kv.capacity >= shared * tpb)
        need -= shared * max(0, sharing - 1)
    return need


def batch_bytes(batch: BatchDesc, groups: list[LayerGroup], tpb: int) -> int:
    return sum(batch_block_need(batch, g, tpb) * g.bytes_per_block for g in groups)


def generic_constraints(limits: Limits) -> list[NamedConstraint]:
    """Generic V2: only the context (chunked-prefill) constraint, when ``max_num_tokens`` is set.

    There is deliberately no longest-decode constraint here: it belongs to DeepSeek-V4 alone (docs/semantics.md 6).
    """
    if limits.max_num_tokens is None:
        return []
    return [NamedConstraint("context", BatchDesc([KVCacheDesc(limits.max_num_tokens + limits.num_extra_kv_tokens,
                                                              0)]))]


def longest_decode(limits: Limits) -> NamedConstraint:
    """DeepSeek-V4's longest decode: one request at ``max_seq_len`` beside ``B - 1`` short decoding ones."""
    s, b = limits.max_seq_len, limits.max_batch_size
    short = KVCacheDesc(1 + limits.max_draft_len + limits.num_extra_kv_tokens, 0)
    return NamedConstraint("longest_decode", BatchDesc([KVCacheDesc(s, s - 1)] + [short] * (b - 1)))


def typical_step_batch(avg_seq_len: int, limits: Limits) -> BatchDesc:
    """One context request plus ``B - 1`` decoding requests of ``avg_seq_len`` tokens."""
    if avg_seq_len > limits.max_seq_len:
        raise ConfigError("avg_seq_len", avg_seq_len, f"must be <= max_seq_len={limits.max_seq_len}")
    t = avg_seq_len
    first = KVCacheDesc((limits.max_num_tokens or t) + limits.num_extra_kv_tokens, 0)
    rest = [KVCacheDesc(t, max(0, t - limits.max_draft_len - 1))] * (limits.max_batch_size - 1)
    return BatchDesc([first, *rest])


def split_weights(groups: list[LayerGroup], tpb: int, *, pool_ratio, typical_step: BatchDesc | None) -> list[float]:
    """Byte weights of each group: the explicit ratio, else the bytes the typical step (or one long request) needs."""
    if pool_ratio is not None:
        if len(pool_ratio) != len(groups):
            raise ConfigError("pool_ratio", tuple(pool_ratio), f"needs exactly {len(groups)} weights, one per "
                              f"layer group ({', '.join(g.name for g in groups)})")
        return [float(r) for r in pool_ratio]
    batch = typical_step if typical_step is not None else BatchDesc([DEFAULT_SPLIT_REQUEST])
    return [max(batch_block_need(batch, g, tpb), 1) * g.bytes_per_block for g in groups]


def constraint_floors(constraints: list[NamedConstraint], groups: list[LayerGroup], tpb: int) -> list[int]:
    """Per group, the most blocks any one constraint needs there."""
    return [max((batch_block_need(c.batch, g, tpb) for c in constraints), default=0) for g in groups]


def split_quota(quota_bytes: int, groups: list[LayerGroup], weights: list[float],
                constraints: list[NamedConstraint], tpb: int) -> list[int]:
    """Blocks per group: split by weight, lift groups under their floor to it, re-split the rest.

    Raises ``BudgetExceededError`` naming the constraint when the floors alone cost more than ``quota_bytes``.
    """
    floors = constraint_floors(constraints, groups, tpb)
    floor_bytes = [f * g.bytes_per_block for f, g in zip(floors, groups)]
    if sum(floor_bytes) > quota_bytes:
        costs = [(batch_bytes(c.batch, groups, tpb), c) for c in constraints]
        worst_cost, worst = max(costs, key=lambda pair: pair[0])
        detail = "" if worst_cost > quota_bytes else f"all constraint floors together need {sum(floor_bytes)} bytes"
        raise BudgetExceededError(worst.name, max(worst_cost, sum(floor_bytes)), quota_bytes, detail)
    alloc = [0.0] * len(groups)
    active = set(range(len(groups)))
    remaining = float(quota_bytes)
    while active:
        total_w = sum(weights[i] for i in active)
        share = {i: remaining * weights[i] / total_w for i in active}
        lifted = [i for i in active if share[i] < floor_bytes[i]]
        if not lifted:
            for i in active:
                alloc[i] = share[i]
            break
        for i in lifted:
            alloc[i] = floor_bytes[i]
            remaining -= floor_bytes[i]
            active.discard(i)
    return [max(floors[i], int(alloc[i] // g.bytes_per_block)) for i, g in enumerate(groups)]


def tokens_quota_per_group(max_tokens: int, groups: list[LayerGroup], tpb: int, max_batch_size: int) -> list[int]:
    """Bytes per group that hold ``max_tokens`` in every full-attention group plus B windows in every sliding one."""
    return [(ceil_div(max_tokens, tpb) if g.is_full else max_batch_size * g.max_pages()) * g.bytes_per_block
            for g in groups]
