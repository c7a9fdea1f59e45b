"""A retention clock is the user's code (``set_clock``): checked when it is handed in, read once before a call
changes anything, and a clock that fails fails the call with the manager exactly as it was (issue 52).

Before, a clock that raised inside ``free_resources`` left the request gone and its blocks in use with no owner
until ``reset_prefix_cache()``; one that returned a string or took an argument failed later with a raw
``TypeError`` and the same half-done free; a NaN clock, or one running backwards, was accepted and durations never
ran out. "Exactly as it was" is checked on everything the manager keeps (its pools, free queues and timers, its
requests and reuse tree), pickled, not only on what a caller can see.
"""

from __future__ import annotations

import math
import pickle

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import ConfigError, UserCallbackError
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.reuse.retention import KvCacheRetentionConfig as Retention, TokenRangeRetentionConfig as Range

SPEC = ModelSpec((LayerSpec(1, 64, "bfloat16", None, model_layer=0),), name="one-layer")
TIMED = Retention(token_range_retention_configs=(Range(0, None, 80, 10),), decode_retention_priority=20,
                  decode_duration_ms=5)


class Clock:
    """Milliseconds that move when a test moves them; ``fail`` makes later reads fail the way it names."""

    def __init__(self, now: float = 0.0):
        self.now, self.fail = now, None

    def __call__(self):
        if self.fail == "raises":
            raise RuntimeError("the clock's source is gone")
        if self.fail == "backwards":
            return self.now - 1
        if self.fail == "nan":
            return math.nan
        if self.fail == "string":
            return "12:00"
        return self.now


def build(kind="v1", blocks=6, **cfg):
    mgr = kvcm.create_kv_cache_manager(kind, SPEC, KvCacheConfig(tokens_per_block=4, max_tokens=blocks * 4, **cfg),
                                       max_batch_size=8, max_seq_len=256, device="meta")
    clock = Clock()
    mgr.set_clock(clock)
    return mgr, clock


def run(mgr, rid, tokens, **kw):
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    mgr.append_tokens(rid, [7])
    return n


def kept(mgr) -> bytes:
    """Everything the manager keeps between calls (the explorer's state): pools with their free queues and
    timers, requests, the reuse tree and its counters."""
    return pickle.dumps((mgr.pools, mgr._seqs, mgr.stale_released, mgr._reuse, mgr._reuse_totals))


def held_with_timed_blocks(**cfg):
    """A V1 manager holding a request whose release starts timers (a timed prefix, a timed decode block)."""
    mgr, clock = build(**cfg)
    run(mgr, "r", list(range(9)), retention_config=TIMED)
    mgr.begin_generation("r")
    mgr.end_generation("r", 10)
    mgr.append_tokens("r", [8])
    return mgr, clock


CALLS = {
    "free_resources": lambda m: m.free_resources("r"),
    "refresh_blocks": lambda m: m.refresh_blocks(),
    "rewind": lambda m: m.rewind("r", 1),
    "begin_generation": lambda m: m.begin_generation("r", 8),      # past the blocks held: it allocates
    "add_sequence": lambda m: m.add_sequence("new", list(range(9)), retention_config=TIMED),
    "begin_context_chunk": lambda m: m.begin_context_chunk("new", 0, 8, 8),
    "add_dummy_requests": lambda m: m.add_dummy_requests(["w"], token_nums=[8]),
}


@pytest.mark.parametrize("fail", ["raises", "backwards", "nan", "string"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_clock_that_fails_leaves_the_manager_exactly_as_before_the_call(call, fail):
    """The issue's case first: a clock that raises inside ``free_resources`` (the request was gone, its blocks in
    use with no owner); then every call that may start or check a timer, with every way a clock can fail."""
    mgr, clock = held_with_timed_blocks()
    if call == "rewind":
        mgr.begin_generation("r", 0)         # a slot past history to rewind
    clock.now = 3
    mgr.refresh_blocks()                     # the last reading: 3 ("backwards" reads 2)
    before = kept(mgr)
    clock.fail = fail
    with pytest.raises(UserCallbackError, match="clock_ms") as err:
        CALLS[call](mgr)
    assert err.value.callback == "clock_ms"
    clock.fail = None
    assert kept(mgr) == before, f"{call} with a clock that {fail} changed the manager"
    CALLS[call](mgr)                         # the same call with a good clock goes through


def test_a_decode_step_within_the_blocks_held_reads_no_clock():
    """The engine's hot path (a decode step that needs no new block, the tokens it appends) starts no timer, so it
    neither reads the clock nor fails with a broken one."""
    mgr, clock = held_with_timed_blocks()
    clock.fail = "raises"
    history = mgr.get_history("r")
    mgr.begin_generation("r")
    mgr.end_generation("r", history + 2)
    mgr.append_tokens("r", [9])
    with pytest.raises(UserCallbackError):
        mgr.free_resources("r")


def test_the_error_says_what_the_clock_did():
    mgr, clock = held_with_timed_blocks()
    clock.now = 5
    mgr.refresh_blocks()
    clock.fail = "backwards"
    with pytest.raises(UserCallbackError, match=r"clock_ms returned 4(\.0)?, below its last reading 5"):
        mgr.free_resources("r")
    clock.fail = "raises"
    with pytest.raises(UserCallbackError, match="clock_ms raised RuntimeError: the clock's source is gone") as err:
        mgr.free_resources("r")
    assert isinstance(err.value.__cause__, RuntimeError)


@pytest.mark.parametrize("clock, field_or_callback, fragment", [
    (lambda: "12:00", ConfigError, "must return a finite number of milliseconds"),
    (lambda: math.nan, ConfigError, "must return a finite number of milliseconds"),
    (lambda: math.inf, ConfigError, "must return a finite number of milliseconds"),
    (lambda: True, ConfigError, "must return a finite number of milliseconds"),
    (lambda now: now, UserCallbackError, "takes no argument"),
    (lambda: 1 / 0, UserCallbackError, "raised ZeroDivisionError"),
    (5, ConfigError, "must be a callable"),
])
@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_a_bad_clock_is_refused_when_it_is_handed_in(kind, clock, field_or_callback, fragment):
    """``set_clock`` calls the clock once: one that cannot be read, or reads no finite number, is refused there,
    naming ``clock_ms`` (V2 keeps no durations, but takes the same clock the same way)."""
    mgr, _ = build(kind)
    before = kept(mgr)
    with pytest.raises(field_or_callback, match=fragment) as err:
        mgr.set_clock(clock)
    assert (err.value.field if field_or_callback is ConfigError else err.value.callback) == "clock_ms"
    assert kept(mgr) == before


def test_a_new_clock_may_not_read_earlier_than_the_old_one_did():
    """Timers started on the old clock keep their expiry: a new clock that starts below the last reading would
    hold them for as long again."""
    mgr, clock = held_with_timed_blocks()
    clock.now = 50
    mgr.free_resources("r")                  # timers end at 55 and 60
    with pytest.raises(ConfigError, match=r"clock_ms=0(\.0)? is invalid: .*below the last reading 50"):
        mgr.set_clock(Clock(0))
    mgr.set_clock(Clock(50))                 # the same time is fine


def test_the_clock_is_called_once_when_handed_in_and_once_a_call():
    calls = []

    def clock():
        calls.append(1)
        return 0.0

    mgr, _ = held_with_timed_blocks()
    mgr.set_clock(clock)
    assert len(calls) == 1
    mgr.free_resources("r")                  # releases five blocks, two of them timed: one reading for all
    assert len(calls) == 2


def test_the_host_tier_runs_on_the_clock_set_later():
    """The host tier's pools took the GPU pools' clock when built; ``set_clock`` now reaches them too."""
    mgr, clock = build(host_cache_size=1 << 16)
    cache = mgr._reuse
    assert all(host.clock is mgr.pools[0].clock for host in cache.host)
