"""The explorer's alphabet: every call an engine makes on a manager, as small hashable operations.

The driver state says what each request slot holds, so that only the calls an engine could make next are
enabled: a slot is empty or holds ``Req(prompt, ids, done, gen)`` (prompt index, made with its token ids or by
its first chunk, prompt tokens computed, tokens generated). One operation is one engine action: an admission
(``add_sequence`` alone, or with the whole rest of the prompt as one chunk: refused there, the engine frees the
request), a context chunk
(``begin_context_chunk`` then ``end_context_chunk``, the first token appended at the prompt's end) or a decode
step (``begin_generation`` with d draft tokens, ``end_generation`` accepting a of them, the accepted tokens
appended), so a refusal can only come from its first call. Bad input is in the alphabet too: an operation whose
name ends in ``?`` must be refused with ``ConfigError`` or ``UnknownRequestError``.

A configuration with ``retention`` also admits requests with a ``KvCacheRetentionConfig`` (a timed high priority
on the first block, a timed low one on decode blocks: TensorRT-LLM's token ranges and ``decode_duration_ms``),
moves the manager's clock a millisecond at a time (``tick``, a few times at most, so the states stay finite) and
calls ``refresh_blocks``; there every other operation is also tried with a clock that fails (``clock-raises?``
and, on a release, ``clock-backwards?`` and ``clock-nan?``): it raises ``UserCallbackError`` with the manager
exactly as it was (the search compares every byte it keeps, not only what a caller sees), or reads no clock and
goes through. One with ``scopes`` admits under a ``cache_salt`` and a ``lora_task_id`` too, whose blocks no
other scope may match (the salt equals the LoRA id, so a key that did not tell the two apart would share their
blocks). One with ``events`` (``event_buffer_max_size``) reads them as a router does between steps
(``flush_iteration_events``, ``get_latest_events``; the search itself reads them after every call,
``events_check.py``) and asks with a negative wait. One with ``async_load`` leaves an admission whose hit comes
from the host tier loading: the engine may only free it (an abort while its copies are in flight) or call
``complete_transfers`` for every copy or the oldest one (``complete``), and a context chunk for it or a poll of
no copy is bad input; one with ``user_rules`` (every rule of ``kvcm.policy`` a user's) tries the first operation
of each kind again with its first, third or eighth rule raising (``rule-raises@K?``): the call must raise
``UserCallbackError`` naming the rule and leave every byte as it was, or run fewer rules and go through;
``lower_tier`` needs no operation of its own (every call ends with the cached blocks on
the host).

A new manager operation or option joins this alphabet (``enabled`` and ``apply``) in the same change.
"""

from __future__ import annotations

from typing import NamedTuple

from kvcm.errors import ConfigError, OutOfPagesError, UnknownRequestError, UserCallbackError
from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

REFUSALS = (OutOfPagesError,)
BAD_INPUT = (ConfigError, UnknownRequestError)
DUMMIES = {"ctx": (("w0",), lambda t: [t + 1], False), "gen2": (("w0", "w1"), lambda t: [1, t], True)}


MAX_TICKS = 3                      # the clock's last millisecond: durations of 1 and 2 run out before it


class StepClock:
    """The manager's clock as the explorer sets it (``set_clock``): milliseconds that move only on ``tick``, kept
    with the pools in a state's pickle."""

    def __init__(self, t: int = 0):
        self.t = t

    def __call__(self) -> int:
        return self.t

    def __repr__(self) -> str:
        return f"StepClock({self.t})"


class FailingClock:
    """A clock that reads ``t`` once (``set_clock`` calls it when handed in), then fails as ``how`` says: it
    raises (``raises``), reads a millisecond earlier (``backwards``), or reads NaN (``nan``)."""

    def __init__(self, t: int, how: str):
        self.t, self.how, self.read = t, how, False

    def __call__(self):
        if not self.read:
            self.read = True
            return self.t
        if self.how == "raises":
            raise RuntimeError("the clock's source is gone")
        return self.t - 1 if self.how == "backwards" else float("nan")

    def __repr__(self) -> str:
        return f"FailingClock({self.t}, {self.how!r})"




def retention(cfg) -> KvCacheRetentionConfig:
    """The first block kept at 80 for 1 ms once released, decode blocks at 20 for 2 ms (the default is 35)."""
    return KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, cfg.tpb, 80, 1),),
                                  decode_retention_priority=20, decode_duration_ms=2)


ADMISSIONS = {"admit": {}, "add": {}}          # op -> add_sequence's options (configs add to it below)


def admissions(cfg) -> dict:
    out = dict(ADMISSIONS)
    if cfg.retention:
        out["admit-ret"] = {"retention_config": retention(cfg)}
    if cfg.scopes:
        out["admit-salt"] = {"cache_salt": 7}
        out["admit-lora"] = {"lora_task_id": 7}
    return out


def scope_of(kind: str) -> str:
    """The reuse scope an admission files its blocks under: "" (none), "salt" or "lora"."""
    return {"admit-salt": "salt", "admit-lora": "lora"}.get(kind, "")


class Req(NamedTuple):
    prompt: int
    ids: bool
    done: int
    gen: tuple
    scope: str = ""        # scope_of its admission ("" for a request made by its first chunk)


class Driver(NamedTuple):
    slots: tuple           # None or Req per slot
    dummies: str | None    # the DUMMIES key of the warmup dummies held


def rid(slot: int) -> str:
    return f"r{slot}"


class Refused(Exception):
    """The operation's first call was refused as documented: the manager must be as it was."""


def enabled(cfg, prompts, drv: Driver, mgr) -> list[tuple]:
    """The operations an engine could call next (reads the manager's history and capacity, changes nothing)."""
    ops, scale = [], cfg.scale
    cap_len = (cfg.blocks + 2) * scale
    first_empty = next((s for s, r in enumerate(drv.slots) if r is None), None)
    for s, req in enumerate(drv.slots):
        if req is None:
            if s != first_empty:
                continue                    # empty slots are alike: admit into the first one only
            for p, prompt in enumerate(prompts):
                if cfg.ids:
                    ops += [(kind, s, p) for kind in admissions(cfg)]
                ops += [("chunk", s, p, n) for n in _chunks(len(prompt), scale)]
            continue
        length = len(prompts[req.prompt])
        if req.done < length and cfg.async_load and mgr.is_loading(rid(s)):
            ops.append(("chunk-loading?", s))          # only an abort (free) or complete_transfers may come next
        elif req.done < length:
            ops += [("chunk", s, req.prompt, n) for n in _chunks(length - req.done, scale)]
        else:
            history = mgr.get_history(rid(s))
            for d in range(cfg.draft + 1):
                if history + 2 + d > cap_len:
                    continue
                for a in range(d + 1):
                    tokens = (1, 2) if req.ids and d == 0 else (1,)
                    ops += [("decode", s, d, a, t) for t in tokens]
            ops.append(("bad-end?", s))
            if cfg.version == "v1" and mgr.get_capacity(rid(s)) > history:
                ops.append(("rewind", s))
            if cfg.version != "v1":
                ops.append(("grow", s))
        ops.append(("free", s))
        if req.ids and s == 0:
            ops.append(("add-held?", s))
    if first_empty is not None:
        ops.append(("free-unknown?", first_empty))
    ops += [("undummy",)] if drv.dummies else [("dummy", k) for k in DUMMIES] + [("bad-dummy?",)]
    ops.append(("reset",))
    if cfg.async_load and mgr._reuse.loads.pending():
        ops += [("complete", None), ("complete", 1), ("complete-zero?",)]
    if cfg.host or cfg.retention:
        ops.append(("refresh",))
    if cfg.retention and hasattr(mgr.pools[0], "clock"):              # V1's clock
        if mgr.pools[0].clock() < MAX_TICKS:
            ops.append(("tick",))
        ops += _with_failing_clock(ops)
    if cfg.events:
        ops += [("events",), ("bad-events?",)]
    if cfg.user_rules:
        from .failing_rules import with_failing_rule

        ops += with_failing_rule(ops)
    return ops


def first_of_each_kind(ops: list) -> dict[str, tuple]:
    """The first enabled operation of each kind, bad input and ``tick`` left out: what a failing clock or rule is
    tried on (the kinds are what differs; their arguments only pick pages)."""
    first: dict[str, tuple] = {}
    for op in ops:
        if not op[0].endswith("?") and op[0] != "tick":
            first.setdefault(op[0], op)
    return first


def _with_failing_clock(ops: list) -> list:
    """The first operation of each kind again, with a clock that raises; a release also with one that runs
    backwards and one that reads NaN."""
    first = first_of_each_kind(ops)
    out = [("clock-raises?",) + op for op in first.values()]
    if "free" in first:
        out += [(f"clock-{how}?",) + first["free"] for how in ("backwards", "nan")]
    return out


def _chunks(rest: int, scale: int) -> list[int]:
    """The whole rest of the prompt, or one block of it when more is left."""
    return [rest] if rest <= scale else [rest, scale]


def apply(m, cfg, prompts, drv: Driver, op: tuple) -> Driver:
    """Make the operation's calls on manager ``m``; the next driver state, or ``Refused``. Any other exception
    escapes (a violation, unless the operation is bad input and it is a documented one)."""
    kind = op[0]
    if kind.startswith("clock-"):
        return _with_clock_that_fails(m, cfg, prompts, drv, op)
    if kind.startswith("rule-raises@"):
        from .failing_rules import with_rule_that_fails

        return with_rule_that_fails(m, cfg, prompts, drv, op)
    if kind.endswith("?"):
        try:
            _bad_input(m, cfg, prompts, drv, op)
        except BAD_INPUT:
            raise Refused from None
        raise AssertionError(f"{op} was accepted: bad input must raise ConfigError or UnknownRequestError")
    slots = list(drv.slots)
    if kind in ("add", "admit", "admit-ret", "admit-salt", "admit-lora"):
        _, s, p = op
        try:
            n = m.add_sequence(rid(s), list(prompts[p]), **admissions(cfg)[kind])
        except REFUSALS:
            raise Refused from None
        # docs/semantics.md 11.2: the last token is always recomputed; DeepSeek-V4 reuses whole blocks only
        assert 0 <= n < len(prompts[p]), f"add_sequence reused {n} of {len(prompts[p])} tokens"
        assert cfg.version != "dsv4" or n % cfg.tpb == 0, f"DeepSeek-V4 reused {n} tokens, not whole blocks"
        loading = cfg.async_load and m.is_loading(rid(s))
        if not loading:
            _reused_pages_are_cached(m, cfg, rid(s), n)
        slots[s] = Req(p, True, n, (), scope_of(kind))
        if kind != "add" and not loading:   # the whole rest of the prompt in one chunk; refused, the engine frees it
            length = len(prompts[p])
            try:
                m.begin_context_chunk(rid(s), n, length - n, length)
            except REFUSALS:
                m.free_resources(rid(s))
                slots[s] = None
                return Driver(tuple(slots), drv.dummies)
            m.end_context_chunk(rid(s), length)
            m.append_tokens(rid(s), [1])
            slots[s] = Req(p, True, length, (1,), scope_of(kind))
    elif kind == "chunk":
        _, s, p, n = op
        req = slots[s] or Req(p, False, 0, ())
        length = len(prompts[p])
        _refusable(m.begin_context_chunk, rid(s), req.done, n, length)
        m.end_context_chunk(rid(s), req.done + n)
        gen = req.gen
        if req.done + n == length:
            gen = (1,)
            if req.ids:
                m.append_tokens(rid(s), [1])
        slots[s] = req._replace(done=req.done + n, gen=gen)
    elif kind == "decode":
        _, s, d, a, tok = op
        history = m.get_history(rid(s))
        _refusable(m.begin_generation, rid(s), d)
        m.end_generation(rid(s), history + 2 + a, d, a)
        if slots[s].ids:
            m.append_tokens(rid(s), [tok] * (a + 1))
        slots[s] = slots[s]._replace(gen=slots[s].gen + (tok,) * (a + 1))
    elif kind == "free":
        m.free_resources(rid(op[1]))
        slots[op[1]] = None
    elif kind == "rewind":
        m.rewind(rid(op[1]), 1)
    elif kind == "grow":
        if not m.resize(rid(op[1]), m.get_capacity(rid(op[1])) + cfg.scale):
            raise Refused
    elif kind == "dummy":
        names, tokens, is_gen = DUMMIES[op[1]]
        if m.add_dummy_requests(list(names), token_nums=tokens(cfg.scale), is_gen=is_gen,
                                max_num_draft_tokens=cfg.draft) is None:
            raise Refused
        return Driver(drv.slots, op[1])
    elif kind == "undummy":
        for name in DUMMIES[drv.dummies][0]:
            m.free_resources(name)
        return Driver(drv.slots, None)
    elif kind == "tick":
        m.set_clock(StepClock(m.pools[0].clock() + 1))
    elif kind == "refresh":          # once a step upstream; a priority falling back to 35 changes no count
        before = [(p.num_free, p.num_reusable) for p in m.pools], m.get_host_block_counts(0)
        m.refresh_blocks()
        after = [(p.num_free, p.num_reusable) for p in m.pools], m.get_host_block_counts(0)
        assert before == after, f"refresh_blocks with no durations moved the counts: {before} -> {after}"
    elif kind == "reset":
        if not m.reset_prefix_cache():
            raise Refused
    elif kind == "complete":         # every copy in flight lands, or the oldest one; the requests named may run
        loading = [rid(s) for s, req in enumerate(drv.slots) if req is not None and m.is_loading(rid(s))]
        done = m.complete_transfers(op[1])
        still = [r for r in loading if m.is_loading(r)]
        assert sorted(done + still) == sorted(loading) and (op[1] is not None or not still), \
            f"complete_transfers({op[1]}) returned {done}; loading were {loading}, {still} still are"
        for r in done:                 # the blocks each one loaded are cached pages of its table now
            _reused_pages_are_cached(m, cfg, r, m.get_prepopulated_prompt_len(r))
    elif kind == "events":           # a router's read between steps: the check drained the last call's already
        m.flush_iteration_events()
        assert m.get_latest_events(0) == [] and m.get_latest_events() == [], "events read twice"
    else:
        raise ValueError(op)
    return Driver(tuple(slots), drv.dummies)


def _with_clock_that_fails(m, cfg, prompts, drv: Driver, op: tuple) -> Driver:
    """``op[1:]`` with a clock that fails, then the good clock back at the same time. A call that reads the clock
    raises ``UserCallbackError`` before it changes anything (the search checks every byte); one that reads none
    (a decode step within the blocks held) goes through, or is refused, as with the good clock."""
    how, inner = op[0][len("clock-"):-1], op[1:]
    now = m.pools[0].clock()
    m.set_clock(FailingClock(now, how))
    try:
        return apply(m, cfg, prompts, drv, inner)
    except UserCallbackError:
        raise Refused from None
    finally:
        m.set_clock(StepClock(now))


def _reused_pages_are_cached(m, cfg, request_id, n: int) -> None:
    """The whole blocks a match reused are cached pages in every group that keeps them (V1: every group; V2: the
    full ones): a reused length no group has cached would hand over pages never written for this prompt."""
    cache = getattr(m, "_reuse", None)
    if cache is None or not n:
        return
    table = m.block_table(request_id)
    for group in m.layer_groups:
        if cfg.version != "v1" and not group.is_full:
            continue
        for i, page in enumerate(table[group.index][:n // cfg.tpb]):
            assert cache.is_tree_page(group.index, page), (f"{request_id!r} reused {n} tokens, but block {i} of "
                                                           f"group {group.index} is not a cached page")


def _refusable(call, *args) -> None:
    try:
        call(*args)
    except REFUSALS:
        raise Refused from None


def _bad_input(m, cfg, prompts, drv: Driver, op: tuple) -> None:
    kind, s = op + (None,) * (2 - len(op))
    if kind == "bad-dummy?":          # a token count that is not an int, after a good one
        m.add_dummy_requests(["w0", "w1"], token_nums=[1, str(cfg.tpb)], is_gen=True)
    elif kind == "bad-end?":            # num_tokens at history: a step that computed nothing
        m.end_generation(rid(s), m.get_history(rid(s)))
    elif kind == "add-held?":         # a request id already held
        m.add_sequence(rid(s), list(prompts[0]))
    elif kind == "complete-zero?":    # a poll that lands no copy is a mistake, not a no-op
        m.complete_transfers(0)
    elif kind == "chunk-loading?":    # its cached prefix is still on its way from the host tier
        req = drv.slots[s]
        length = len(prompts[req.prompt])
        m.begin_context_chunk(rid(s), req.done, length - req.done, length)
    elif kind == "free-unknown?":
        m.free_resources(rid(s))
    elif kind == "bad-events?":       # a negative wait
        m.get_latest_events(timeout_ms=-1)
    else:
        raise ValueError(op)


def describe(op: tuple) -> str:
    return " ".join(map(str, op))
