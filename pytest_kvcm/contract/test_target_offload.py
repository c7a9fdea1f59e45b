"""The offload part of the contract: a host tier's pool of slots keeps its books (``_offload_tiers.py`` says which
class of each target is driven). What every tier owes: an allocation past what is free is refused with nothing
changed, freed slots come back exactly once, and never-used slots are handed out before freed ones. The order
freed slots come back in differs (kvcm and SGLang first in first out, vLLM's chunks last in first out): it is
printed, and docs/findings.md records it."""

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


def test_never_used_slots_go_before_freed_ones(tiers, capsys):
    for tier in tiers:
        first = tier.alloc(3)
        tier.free(first)
        nxt = tier.alloc(CAPACITY - 3)
        assert not set(nxt) & set(first), f"{tier.name}: handed out a freed slot while never-used ones were left"
        reuse = tier.alloc(3)
        with capsys.disabled():
            print(f"\n  {tier.name}: freed {first}, handed back {reuse}")
        assert sorted(reuse) == sorted(first), tier.name
