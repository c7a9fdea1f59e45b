"""An independent model of full attention without reuse: how many tokens each request holds, and whether a call
fits, from docs/semantics.md 3 (V1) and 4.1 (V2) alone. It shares no code with the managers.

Its state is one capacity per request slot and the dummies' capacities. A request holds ``ceil(capacity / tpb)``
blocks of every full group (V1: of every group, since V1 keeps every block of a window too); a call fits when
the blocks after it, summed over requests, are at most the pool. Where it applies (``Config.oracle_applies``:
reuse off, or no request made with token ids) the explorer checks the manager's capacities and full-group counts
against it after every call, and that a call it refuses is refused (and, with full attention only, that a call
it accepts is accepted).
"""

from __future__ import annotations

from typing import NamedTuple


class Oracle(NamedTuple):
    caps: tuple            # per slot: None or capacity
    dummies: tuple         # capacities of the dummies held


def _blocks(tokens: int, tpb: int) -> int:
    return (tokens + tpb - 1) // tpb


def empty(slots: int) -> Oracle:
    return Oracle((None,) * slots, ())


def used(o: Oracle, tpb: int) -> int:
    return sum(_blocks(c, tpb) for c in o.caps if c is not None) + sum(_blocks(c, tpb) for c in o.dummies)


def step(cfg, prompts, drv, o: Oracle, op: tuple) -> tuple[bool, Oracle, int]:
    """(does the call fit, the state after it, the most blocks held during it). Bad input never changes it."""
    kind, e, k, tpb = op[0], cfg.extra, cfg.draft, cfg.tpb
    kind = "admit" if kind.startswith("admit") else kind     # an admission's options change no capacity
    caps = list(o.caps)
    peak_extra = 0
    if kind.endswith("?") or kind == "reset":
        return True, o, used(o, tpb)
    if kind == "add":
        caps[op[1]] = 0
    elif kind == "admit":             # the whole prompt in one chunk, or (refused) nothing held
        need = len(prompts[op[2]]) + e
        caps[op[1]] = need
        after = Oracle(tuple(caps), o.dummies)
        if used(after, tpb) > cfg.blocks:
            caps[op[1]] = None
            after = Oracle(tuple(caps), o.dummies)
        return True, after, used(after, tpb)   # whether it was admitted shows in the slot
    elif kind == "chunk":
        _, s, p, n = op
        req = drv.slots[s]
        done, cap = (0, 0) if req is None else (req.done, caps[s])
        if cfg.version == "v1":       # the first chunk (no prompt token computed yet) reserves prompt + E
            caps[s] = max(cap, len(prompts[p]) + e) if done == 0 else cap
        else:                         # each chunk: max(capacity, start + n + E)
            caps[s] = max(cap, done + n + e)
    elif kind == "decode":
        _, s, d, a, _tok = op
        reserve = max(d, k) if cfg.version == "v1" else d
        begin = caps[s] + 1 + reserve
        peak_extra = _blocks(begin, tpb) - _blocks(caps[s], tpb)
        caps[s] = caps[s] + 1 + a
    elif kind == "free":
        caps[op[1]] = None
    elif kind == "rewind":
        caps[op[1]] -= 1
    elif kind == "grow":
        caps[op[1]] += tpb
    elif kind == "dummy":
        tokens, is_gen = _dummy(op[1], tpb)
        dummies = tuple(t + e + (k if is_gen else 0) for t in tokens)
        after = Oracle(tuple(caps), dummies)
        return used(after, tpb) <= cfg.blocks, after, used(after, tpb)
    elif kind == "undummy":
        after = Oracle(tuple(caps), ())
        return True, after, used(o, tpb)
    after = Oracle(tuple(caps), o.dummies)
    peak = max(used(after, tpb), used(o, tpb) + peak_extra)
    return peak <= cfg.blocks, after, peak


def _dummy(kind: str, tpb: int) -> tuple[list[int], bool]:
    from .ops import DUMMIES

    _, tokens, is_gen = DUMMIES[kind]
    return tokens(tpb), is_gen
