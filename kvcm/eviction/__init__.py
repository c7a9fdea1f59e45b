"""Eviction: which cached page a full tier gives up, behind one interface (``EvictionPolicy``).

A tier (a GPU pool, V1's secondary pool, V2's host level) keeps the pages nobody holds in one order and asks it
for a victim at one place. The order is told four things: a release (an entry nobody holds joins it), a touch (a
request found it), a priority change, and an entry leaving it without being chosen (a claim, which ``restore``
undoes, or a removal for good). The orders kvcm ships, each an implementation of the interface:

============================  ==================================================  ==========================
tier                          order                                               selection point
============================  ==================================================  ==========================
V1 GPU pool, V1 host pool     ``kvcm.free_queue.FreeBlockQueue``: TensorRT-LLM's  ``QueuedBlockPool.allocate``
                              ``LRUEvictionPolicy``, one FIFO per priority, empty
                              and cached pages alike (V1's reuse cache sees it
                              through ``kvcm.reuse.queued_cache.QueuedPages``)
V2 GPU level                  ``kvcm.eviction.tree.EvictionQueue``: lowest         ``ReuseCache.evict``
                              priority, least recently released, leaves first
V2 host level                 ``KvCacheConfig.host_eviction_policy``: a module of  ``LeveledReuseCache._fall``
                              this package a value (``lru``, the default:
                              TensorRT-LLM's ``PrioritizedLRUEvictionPolicy``)
============================  ==================================================  ==========================

A host-level policy is a module of this package named as its ``KvCacheConfig.host_eviction_policy`` value, whose
``HOST_LEVEL`` is the class, built with ``(pages, policy)``: a new one is its module and its value in the config's ``Literal``
(``suites/managers/test_eviction.py`` checks that every value has its module and each module satisfies the
interface).
"""

from __future__ import annotations

import importlib
from typing import Hashable, Iterable, Protocol, runtime_checkable


@runtime_checkable
class EvictionPolicy(Protocol):
    """The order a tier's evictable entries (pages, or the blocks holding them) leave in."""

    lazy: bool
    """True for an order that checks an entry when it reaches the head (a claimed or removed entry is skipped
    there), so a claim or a removal needs no word: the hot paths skip the call."""

    def release(self, entry: Hashable, priority: int) -> None:
        """Nobody holds ``entry`` any more: it joins the order, the newest of its priority."""

    def claim(self, entry: Hashable) -> None:
        """A request holds ``entry`` again: out of the order until it is released or ``restore``d."""

    def restore(self, entry: Hashable) -> None:
        """``entry`` is evictable again where it was: a claim undone (or, in an order of leaves, a page whose last
        child page left)."""

    def remove(self, entry: Hashable) -> None:
        """``entry`` leaves the tier without being chosen (migrated, dropped with an ancestor, reset)."""

    def touch(self, entry: Hashable) -> None:
        """A request found ``entry`` (a hit): recency and frequency orders move it; a pure release order does not."""

    def reprioritize(self, entry: Hashable, priority: int) -> None:
        """``entry``'s retention priority changed (a duration ran out): it moves where the new priority puts it."""

    def victim(self, protected: Iterable = ()) -> Hashable | None:
        """Choose the next entry to evict (never one of ``protected``) and take it out of the order; None when
        none can go."""

    def clear(self) -> None:
        """Forget every entry (the tier was emptied)."""

    def order(self) -> list:
        """Every entry, the next victim first (for tests and the explorer's states)."""


def host_level(name: str):
    """The class of V2's host-level policy ``name`` (a ``KvCacheConfig.host_eviction_policy`` value, which the
    config checked): the ``HOST_LEVEL`` of module ``kvcm.eviction.<name>``."""
    return importlib.import_module(f"{__name__}.{name}").HOST_LEVEL
