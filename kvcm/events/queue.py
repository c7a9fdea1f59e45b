"""The event queue of one manager, with the version's rules for batching, ordering and a full queue.

Both versions keep two lists, as TensorRT-LLM does: the events of the iteration under way (``pending``) and the
ones published for readers (``published``). ``flush`` (``flush_iteration_events``, once an engine step) moves the
pending ones over; past ``max_size`` the oldest published events are dropped (V1's worker thread erases the oldest
first, then the front of the new batch; V2's ``_publish_events_unlocked`` pops from the left: the same events
stay). ``take`` (``get_latest_events``) hands the published ones over and empties the list.

What differs (``KVCacheEventManager`` in ``kvCacheEventManager.cpp`` and in ``kv_cache_manager_v2/_event_manager.py``):

* V1 (``V1Queue``): one stored event per store call and group, its blocks the chain that call filed (emitted when
  the call ends, groups in window order as ``mWindowBlockManagers`` iterates); a removed block joins the last
  pending event when that is a removed event of the same group, else opens one; every other event stands alone.
* V2 (``V2Queue``): a stored event per block and group, merged into the group's latest stored event of the
  iteration when it continues that chain and no removal waits; removed blocks wait per group and are emitted as
  one event before the next event of any other kind (and before a stored event of their group), or at the flush.
"""

from __future__ import annotations

import dataclasses

from ..policy import Decisions, setting
from .types import KVCacheEvent, KVCacheRemovedData, KVCacheStoredData


class EventQueue:
    fixed_hash_algo: str | None = None      # the algorithm its events always use (None: the config's)
    priority_events = False                 # a match that changes a block's priority is announced
    every_level_created = False             # created events name the host level even without one (0 blocks)
    created_in_window_order = False         # created events go out by window size, not by group

    def __init__(self, max_size: int, hash_algo: str, policy):
        self.max_size = max_size
        self.hash_algo = hash_algo
        self.policy = policy
        self.next_id = 0
        self.pending: list[KVCacheEvent] = []
        self.published: list[KVCacheEvent] = []
        self.dropped = 0                      # published events a full queue let go (oldest first)

    def _new(self, data, window: int, group: int) -> KVCacheEvent:
        event = KVCacheEvent(self.next_id, data, window, self.hash_algo, group)
        self.next_id += 1
        self.pending.append(event)
        return event

    def created(self, window: int, group: int, data) -> None:
        self._new(data, window, group)

    def updated(self, window: int, group: int, data) -> None:
        self._new(data, window, group)

    def end_store(self) -> None:
        """A store call ended (V1 emits its stored events now)."""

    def flush(self) -> None:
        self.published.extend(self.pending)
        self.pending = []
        excess = len(self.published) - self.max_size
        if excess > 0:
            del self.published[:excess]
            self.dropped += excess

    def take(self) -> list[KVCacheEvent]:
        out, self.published = self.published, []
        return out


class V1Queue(EventQueue):
    """TensorRT-LLM V1's ``KVCacheEventManager`` fed by its ``WindowBlockManager``s: ``v1_block_key`` hashes
    whatever is asked (it warns), ``[primary, secondary]`` created once a window in window order
    (``mWindowBlockManagers`` is a map by window size), priority updates from ``loadOrAllocateBlocks``."""

    fixed_hash_algo = "v1_block_key"
    priority_events = True
    every_level_created = True
    created_in_window_order = True

    def __init__(self, max_size: int, hash_algo: str, policy):
        super().__init__(max_size, hash_algo, policy)
        self._batches: dict[int, list] = {}    # group -> [window, parent hash, blocks] of the store call under way

    def stored(self, window: int, group: int, parent_hash, block) -> None:
        batch = self._batches.get(group)
        if batch is not None and batch[2][-1].block_hash == parent_hash:
            batch[2].append(block)
            return
        if batch is not None:
            self._emit_batch(group)
        self._batches[group] = [window, parent_hash, [block]]

    def _emit_batch(self, group: int) -> None:
        window, parent, blocks = self._batches.pop(group)
        self._new(KVCacheStoredData(parent, tuple(blocks)), window, group)

    def end_store(self) -> None:
        for group in sorted(self._batches, key=lambda g: (self._batches[g][0], g)):
            self._emit_batch(group)

    def removed(self, window: int, group: int, block_hash) -> None:
        self.end_store()
        target = self._merge_target(window, group)
        if target is None:
            self._new(KVCacheRemovedData((block_hash,)), window, group)
            return
        event = self.pending[target]
        merged = KVCacheRemovedData(event.data.block_hashes + (block_hash,))
        self.pending[target] = dataclasses.replace(event, data=merged)

    def _merge_target(self, window: int, group: int) -> int | None:
        """The pending removed event this removal joins: the last event, when it is one of the same group
        (``enqueueRemovedEvent``), or with the policy's ``removed_event_merge_scope`` of ``"latest_of_group"`` the
        group's latest removed event wherever it is, past later events (the ordering defect)."""
        scope = self.policy.removed_event_merge_scope
        for i in range(len(self.pending) - 1, -1, -1):
            event = self.pending[i]
            if isinstance(event.data, KVCacheRemovedData) and (event.window_size, event.layer_group_id) == (window,
                                                                                                          group):
                return i
            if scope == "last":
                return None
        return None

    def created(self, window: int, group: int, data) -> None:
        self.end_store()
        super().created(window, group, data)

    def updated(self, window: int, group: int, data) -> None:
        self.end_store()
        super().updated(window, group, data)

    def flush(self) -> None:
        self.end_store()
        super().flush()


class V2Queue(EventQueue):
    """TensorRT-LLM V2's ``_event_manager.py``: the hash algorithm asked, the levels it has, by layer group, and
    no priority updates (V2 sets priorities by callback)."""

    def __init__(self, max_size: int, hash_algo: str, policy):
        super().__init__(max_size, hash_algo, policy)
        self._latest_stored: dict[int, int] = {}       # group -> index in pending of its latest stored event
        self._removed: dict[int, list] = {}             # group -> (window, hashes) of removals not emitted yet

    def _new(self, data, window: int, group: int) -> KVCacheEvent:
        if not isinstance(data, KVCacheRemovedData):
            self._emit_removed()
        event = super()._new(data, window, group)
        if not isinstance(data, KVCacheStoredData):
            self._latest_stored.pop(group, None)
        return event

    def _emit_removed(self, group: int | None = None) -> None:
        for g in ([group] if group is not None else list(self._removed)):
            entry = self._removed.pop(g, None)
            if entry is not None:
                self._new(KVCacheRemovedData(tuple(entry[1])), entry[0], g)

    def stored(self, window: int, group: int, parent_hash, block) -> None:
        self._emit_removed(group)
        at = self._latest_stored.get(group)
        if not self._removed and at is not None and self.pending[at].data.blocks[-1].block_hash == parent_hash:
            event = self.pending[at]
            data = KVCacheStoredData(event.data.parent_hash, event.data.blocks + (block,))
            self.pending[at] = dataclasses.replace(event, data=data)
            return
        self._new(KVCacheStoredData(parent_hash, (block,)), window, group)
        self._latest_stored[group] = len(self.pending) - 1

    def removed(self, window: int, group: int, block_hash) -> None:
        self._removed.setdefault(group, (window, []))[1].append(block_hash)
        self._latest_stored.pop(group, None)

    def flush(self) -> None:
        self._emit_removed()
        self._latest_stored.clear()
        super().flush()


class QueueDecisions(Decisions):
    SUBSYSTEM = "kv cache events"

    removed_event_merge_scope = setting(
        "last", "which pending removed event a V1 removal joins: the last event, when it is a removed event of the "
        "same group (enqueueRemovedEvent); with 'latest_of_group', the group's latest removed event past later "
        "events, which reorders a removal before a store it followed (TensorRT-LLM PR #11883: removals must reach a "
        "router in order with the stores around them)", choices=("last", "latest_of_group"))
