"""The event API every manager has (``BaseKVCacheManager`` inherits it): TensorRT-LLM's switch and its two calls.

``KvCacheConfig(event_buffer_max_size=N)`` turns events on (0, the default, leaves them off: upstream builds no
event manager then); ``flush_iteration_events()`` publishes what the calls since the last flush emitted (an engine
calls it once a step); ``get_latest_events(timeout_ms)`` hands over what is published, at most ``N`` events, the
oldest dropped first. kvcm's managers are synchronous: everything an event reports has happened by the time the
call returns, so a read never waits (``timeout_ms`` is checked and has nothing to wait for).
"""

from __future__ import annotations

import math
import warnings

from ..errors import ConfigError
from . import hashing
from .emitter import NO_EVENTS, EventEmitter


def window_size(group, max_seq_len: int) -> int:
    """The window size events name a group by: its sliding window, its attention chunk, or ``max_seq_len`` for
    full attention (TensorRT-LLM keys full attention by the longest window, the sequence length)."""
    attention = group.attention
    return attention.window or attention.chunk_tokens or max_seq_len


class EventsMixin:
    def _init_events(self) -> None:
        """After the pools and the reuse cache: the version's queue (``versions``' ``events``), the emitter handed to
        the cache, and one created event a group."""
        cfg = self.kv_cache_config
        self._events = NO_EVENTS
        if not cfg.event_buffer_max_size:
            return
        queue_cls = self._version.event_queue_class
        algo = cfg.kv_cache_event_hash_algo
        fixed = queue_cls.fixed_hash_algo
        if fixed is not None and algo not in (hashing.AUTO, fixed):
            warnings.warn(f"kv_cache_event_hash_algo={algo!r}: these events always carry {fixed} hashes "
                          "(TensorRT-LLM's V1 warns and keeps them)", UserWarning, stacklevel=3)
        algo = fixed or (hashing.V1_BLOCK_KEY if algo == hashing.AUTO else algo)
        queue = queue_cls(cfg.event_buffer_max_size, algo, self.policy)
        windows = [window_size(g, self.max_seq_len) for g in self.layer_groups]
        self._events = EventEmitter(queue, windows, priority_events=queue_cls.priority_events)
        if self._reuse is not None:
            self._reuse.events = self._events
        host = getattr(self._reuse, "host", None)
        groups = range(len(self.pools))
        for g in sorted(groups, key=lambda g: (windows[g], g)) if queue_cls.created_in_window_order else groups:
            second = (host[g].num_blocks,) if host else (0,) if queue_cls.every_level_created else ()
            self._events.created(g, (self.pools[g].num_blocks,) + second)

    def flush_iteration_events(self) -> None:
        """Publish the events of the calls since the last flush (TensorRT-LLM's ``flushIterationEvents``)."""
        self._events.flush()

    def get_latest_events(self, timeout_ms=None) -> list:
        """The published events, oldest first, and none of them again (``getLatestEvents``); [] when events are
        off. ``timeout_ms``: None or milliseconds >= 0 (nothing to wait for here: see the module's docstring)."""
        if timeout_ms is not None:
            if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not (
                    math.isfinite(timeout_ms) and timeout_ms >= 0):
                raise ConfigError("timeout_ms", timeout_ms, "must be None or a finite number of milliseconds >= 0")
        return self._events.take()
