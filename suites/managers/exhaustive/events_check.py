"""The explorer's event check (docs/contract.md, "KV cache events"): after every call of a configuration with
events on, a router's index fed the call's events must hold exactly the blocks the manager would match.

The index before a call is the blocks the state's manager would match (``kvcm.events.shadow.cached_blocks``):
by induction it is what the events up to that state gave, since every call before it was checked the same way,
so the search keeps no index of its own and states stay deduplicated by the manager alone. A refused call emits
nothing. A call whose events overflow the queue (a configuration with a small ``event_buffer_max_size``) must keep
the newest ones, numbered without a gap up to the last id given: what ``get_latest_events`` promises then.
"""

from __future__ import annotations

from kvcm.events.shadow import ShadowIndex, cached_blocks, differences


class EventCheck:
    def __init__(self, cfg):
        self.on = bool(cfg.events)

    def before(self, mgr) -> dict | None:
        return cached_blocks(mgr) if self.on else None

    def after(self, mgr, before: dict | None, *, refused: bool) -> str | None:
        """Drain the call's events and say what is wrong with them (None: nothing)."""
        if not self.on:
            return None
        queue = mgr._events.queue
        dropped = queue.dropped
        mgr.flush_iteration_events()
        events = mgr.get_latest_events(0)
        if refused:
            return f"a refused call emitted {[e.kind for e in events]}" if events else None
        if queue.dropped > dropped:
            ids = [e.event_id for e in events]
            want = list(range(queue.next_id - queue.max_size, queue.next_id))
            return None if ids == want else f"a full queue kept events {ids}, not the newest {want}"
        problems = differences(ShadowIndex(before).apply(events), cached_blocks(mgr))
        return "; ".join(problems[:4]) if problems else None
