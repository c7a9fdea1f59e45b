"""Eviction is one interface (``kvcm/eviction/__init__.py`` ``EvictionPolicy``): every order kvcm ships implements
it, every ``host_eviction_policy`` value names its module, each tier asks its order for a victim at one place, and
the reuse cache builds no order of its own (the version hands it the factory)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import kvcm
from kvcm.config import HOST_EVICTION_POLICIES
from kvcm.eviction import EvictionPolicy, host_level
from kvcm.eviction.lru import PrioritizedLRU
from kvcm.eviction.tree import EvictionQueue
from kvcm.free_queue import FreeBlockQueue
from kvcm.reuse.cache import ReuseCache
from kvcm.reuse.queued_cache import QueuedPages
from kvcm.reuse.tree import Node

ROOT = Path(__file__).resolve().parents[2]
INTERFACE = [name for name, member in vars(EvictionPolicy).items()
             if callable(member) and not name.startswith("_")]
ORDERS = [FreeBlockQueue, QueuedPages, EvictionQueue, *(host_level(name) for name in HOST_EVICTION_POLICIES)]

SELECTION_POINTS = {                 # file -> the functions that ask an order for its victim, one per tier
    "kvcm/free_queue.py": {"allocate"},                 # V1's GPU pool and V1's host pool
    "kvcm/reuse/cache.py": {"evict"},                   # V2's GPU level
    "kvcm/reuse/host_level.py": {"evict", "_fall"},     # V2's GPU level with a host level behind it; the host level
}


def test_the_interface_is_what_the_issue_names():
    assert {"victim", "release", "touch", "reprioritize"} <= set(INTERFACE)


@pytest.mark.parametrize("order", ORDERS, ids=lambda c: c.__name__)
def test_every_order_implements_the_interface(order):
    for name in INTERFACE:
        assert callable(getattr(order, name, None)), f"{order.__name__} has no {name}"
        want = len(inspect.signature(getattr(EvictionPolicy, name)).parameters)
        try:        # called as the interface calls it: positionally, with as many arguments
            inspect.signature(getattr(order, name)).bind(*range(want))
        except TypeError as exc:
            raise AssertionError(f"{order.__name__}.{name} cannot be called as the interface's {name}: {exc}")
    assert isinstance(order.lazy, bool)


@pytest.mark.parametrize("name", HOST_EVICTION_POLICIES)
def test_every_host_eviction_policy_value_is_a_module_of_kvcm_eviction(name):
    assert isinstance(host_level(name)(4), EvictionPolicy)


def _victim_calls(path: Path) -> set[str]:
    """The functions of ``path`` that call some ``.victim(...)`` (a method named victim that calls ``self.evict`` is
    the order itself)."""
    tree, out = ast.parse(path.read_text()), set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name != "victim":
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "victim"
                   for n in ast.walk(fn)):
                out.add(fn.name)
    return out


def test_each_tier_asks_its_order_for_a_victim_at_one_place():
    found = {}
    for path in sorted((ROOT / "kvcm").rglob("*.py")):
        calls = _victim_calls(path)
        if calls:
            found[str(path.relative_to(ROOT))] = calls
    assert found == SELECTION_POINTS


def test_the_reuse_cache_is_handed_its_order():
    assert inspect.signature(ReuseCache).parameters["order"].default is inspect.Parameter.empty
    source = (ROOT / "kvcm" / "reuse" / "cache.py").read_text()
    assert "eviction" not in {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)
                              for _ in [0] if n.module}


def _nodes(n):
    root = Node((), None, 1)
    return [Node((i,), root, 1) for i in range(n)]


def test_host_lru_goes_by_priority_then_arrival_and_sets_a_protected_block_aside():
    """TensorRT-LLM V2's PrioritizedLRUEvictionPolicy: the lowest priority first, the first arrived within it; a
    page a match is migrating is passed over and keeps its place (``batched_lock_to_gpu``)."""
    a, b, c, d = _nodes(4)
    order = PrioritizedLRU(4)
    for node, priority in ((a, 50), (b, 35), (c, 35), (d, 10)):
        order.release(node, priority)
    assert order.order() == [d, b, c, a]
    assert order.victim({d}) is b
    assert order.order() == [d, c, a]
    order.remove(c)
    assert order.victim() is d and order.victim() is a and order.victim() is None


def test_tree_order_checks_at_its_head_and_restores_a_claim_at_its_place():
    """V2's GPU order is lazy: a claim costs nothing, a held page is passed over at the head, and a claim undone
    comes back at its own release stamp."""
    mgr = kvcm.create_kv_cache_manager("v2", kvcm.ModelSpec.uniform(2, 1, 8),
                                       kvcm.KvCacheConfig(tokens_per_block=2, max_tokens=16), max_batch_size=4,
                                       max_seq_len=16, device="meta")
    for rid, tokens in (("a", [1, 2, 3]), ("b", [4, 5, 6])):
        mgr.add_sequence(rid, tokens)
        mgr.begin_context_chunk(rid, 0, 3, 3)
        mgr.end_context_chunk(rid, 3)
        mgr.free_resources(rid)
    order, cache = mgr._reuse.orders[0], mgr._reuse
    first, second = order.order()
    cache.claim(first, 0)
    assert order.order() == [second]
    cache.unclaim(first, 0)
    assert order.order() == [first, second]
