"""The offload part of the contract: a host tier's pool of slots keeps its books (``_offload_tiers.py`` says which
class of each target is driven). What every tier owes: an allocation past what is free is refused with nothing
changed, freed slots come back exactly once, and never-used slots are handed out before freed ones, except by
TensorRT-LLM V2's slot allocator (kvcm V2's host level), which recycles first. The order freed slots come back in
differs (kvcm and SGLang first in first out, vLLM's chunks last in first out): it is printed, and docs/findings.md
records it."""

from __future__ import annotations

import pytest

from ._offload_tiers import tiers_of

CAPACITY = 8


@pytest.fixture
def tiers(kvcm_target, kvcm_target_name):
    return tiers_of(kvcm_target_name, CAPACITY)


def test_an_allocation_past_the_free_slots_is_refused_with_nothing_changed(tiers):
    for tier in tiers:
        taken = tier.alloc(CAPACITY - 2)
        assert taken is not None and len(set(taken)) == CAPACITY - 2, tier.name
        assert tier.available() == 2, tier.name
        assert tier.alloc(3) is None, f"{tier.name}: 3 slots granted with 2 free"
        assert tier.available() == 2, f"{tier.name}: a refused allocation changed the free count"
        assert len(tier.alloc(2)) == 2 and tier.available() == 0, tier.name


def test_freed_slots_come_back_once_and_never_past_the_capacity(tiers):
    for tier in tiers:
        taken = tier.alloc(CAPACITY)
        tier.free(taken[:3])
        assert tier.available() == 3, tier.name
        try:
            tier.free(taken[:1])               # freed twice: refused (kvcm, SGLang) or ignored (vLLM)
        except (RuntimeError, AssertionError):
            pass
        assert tier.available() == 3, f"{tier.name}: a slot freed twice counted twice (vLLM #42571's symptom)"
        again = tier.alloc(3)
        assert sorted(again) == sorted(taken[:3]), tier.name
        assert tier.alloc(1) is None, f"{tier.name}: more slots than its capacity"


def test_never_used_and_freed_slots_come_back_in_the_tiers_order(tiers, capsys):
    """Never-used slots go before freed ones (kvcm V1's host queue, vLLM, SGLang), except where the tier recycles
    first: TensorRT-LLM V2's ``SlotAllocator`` (kvcm V2's host level) hands ready recycled slots back, oldest
    first, before any new one (``test_storage_manager.py::test_recycled_slot_preserves_offset_slot_id``)."""
    for tier in tiers:
        first = tier.alloc(3)
        tier.free(first)
        nxt = tier.alloc(CAPACITY - 3)
        if tier.fresh_first:
            assert not set(nxt) & set(first), f"{tier.name}: handed out a freed slot while never-used ones were left"
        else:
            assert nxt[:3] == first, f"{tier.name}: recycled slots {first} not handed back first, oldest first: {nxt}"
        reuse = tier.alloc(3)
        with capsys.disabled():
            print(f"\n  {tier.name}: freed {first}, handed back {reuse if tier.fresh_first else nxt[:3]}")
        assert sorted(reuse if tier.fresh_first else nxt[:3]) == sorted(first), tier.name
        assert len(set(nxt) | set(reuse)) == CAPACITY, tier.name
