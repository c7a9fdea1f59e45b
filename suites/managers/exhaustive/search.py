"""Breadth-first search over the alphabet of ``ops.py`` from an empty manager, deduplicated by a canonical state.

A state is kept as the pickle of the manager's mutable parts (pools, requests, reuse cache and counters; the
model, limits and layer groups are shared with a template and never copied): restoring one costs one
``pickle.loads`` of a few kilobytes, where replaying its sequence would cost every call of it again. The
manager's ``kvcm.policy.Policy`` (kept by its pools and reuse cache) and the functions its parts take from it are
shared too, by reference, never copied: a policy is immutable, and a defect's replacement is often a ``lambda``,
which ``pickle`` cannot copy (every configuration errored under 38 of the 65 catalogued defects before). A refused
call leaves the manager as it was, so the next operation of the same state runs on it without a restore.

The canonical state is cheap and deliberately coarse: free and reusable counts per group, each request's counters
and block tables with pages renamed by first appearance, the reuse tree's shape with its pages renamed, their
reference counts and the eviction order of unheld pages, the driver's state and the oracle's. Statistics are
left out (they only grow). Two states with the same form behave the same up to the names of pages.

Checked on every call: only documented exceptions escape; a refused call leaves ``observe`` as it was (a call
whose clock failed leaves every byte of the state as it was); the oracle agrees where it applies; with events on,
a router's index fed the call's events holds exactly the blocks the manager would match (``events_check.py``). On
every new state: ``check_books`` and ``check_reused_tokens``, the queries an
engine makes (``query_check.py``: agreeing counts, an admission credit within what is held, V1's available
tokens; none changes anything), and freeing everything then ``reset_prefix_cache`` leaves every block free. The first violation of each
kind is kept with its sequence, the shortest that reaches it (breadth first), and the search does not go on from a
violating state.
"""

from __future__ import annotations

import io
import pickle
import time
import types
from dataclasses import dataclass, field

import kvcm.policy
from kvcm.errors import KvcmError

from _observe import all_free_after_reset, check_books, check_reused_tokens, observe

from . import oracle as oracle_model
from .configs import Config, build
from .events_check import EventCheck
from .ops import Driver, Refused, apply, enabled
from .query_check import check_queries
from .replay import replay_text


_SHARED: list = []      # what states refer to rather than copy: a state holds an index, restored as the same object
_INDEX: dict[int, int] = {}


def _shared(index: int):
    return _SHARED[index]


class _StatePickler(pickle.Pickler):
    """Keeps a manager's policy, the functions its parts take from it (the reuse tree's key hash, say) and the
    classes of its parts by reference: a defect replaces functions with lambdas, and a class saved by its name is
    refused when its module was imported again since (pytester's in-process runs drop the modules they import).
    ``reducer_override``, not a ``dispatch_table``: pickle saves functions and classes by name before it looks at
    the table (one Python call an object: within noise of plain pickle.dumps on four configurations)."""

    def reducer_override(self, obj):
        if not (type(obj) is types.FunctionType or isinstance(obj, (kvcm.policy.Policy, type))) or obj is _shared:
            return NotImplemented
        index = _INDEX.get(id(obj))
        if index is None:
            index = _INDEX[id(obj)] = len(_SHARED)
            _SHARED.append(obj)     # kept alive, so the id stays this object's
        return _shared, (index,)


def _dumps(state) -> bytes:
    """``pickle.dumps(state, 5)``, each policy and function in it kept by reference (this process's ``_SHARED``)."""
    out = io.BytesIO()
    _StatePickler(out, 5).dump(state)
    return out.getvalue()


@dataclass
class Violation:
    kind: str
    message: str
    ops: list


@dataclass
class Report:
    cfg: Config
    sequences: int = 0          # operations run (each extends one sequence of the search by one)
    states: int = 0             # distinct canonical states reached, the empty one included
    depth: int = 0              # deepest level expanded
    seconds: float = 0.0
    cpu_seconds: float = 0.0    # this process's CPU time: what the search costs whatever else the machine runs
    restores: int = 0
    complete: bool = False      # nothing new was left: every sequence up to any length was searched
    violations: list = field(default_factory=list)
    broken: str | None = None   # why the search could not run to its budget (no manager, past its time): no verdict

    def line(self) -> str:
        if self.broken:
            return f"{self.cfg.name}: BROKEN after {self.states} distinct states: {self.broken}"
        bound = "all of them" if self.complete else "stopped at the budget"
        return (f"{self.cfg.name}: {self.sequences} sequences, {self.states} distinct states ({bound}), depth "
                f"{self.depth}, {len(self.violations)} violations, {self.seconds:.1f} s ({self.cpu_seconds:.1f} s CPU)")


def search(cfg: Config, states: int, seconds: float | None = None, first_violation: bool = False) -> Report:
    """One configuration's search, as ``Explorer(cfg).run`` does it, but for a configuration that cannot be built:
    every configuration of the explorer is a valid one that the managers build, so kvcm refusing it (a
    ``KvcmError``: a budget its own constraints exceed) is a failed check, kind ``build`` (a defect that sizes pools
    wrong is caught there); anything else raised is a search that could not run, ``broken``."""
    try:
        explorer = Explorer(cfg)
    except KvcmError as exc:
        report = Report(cfg)
        report.violations.append(Violation("build", f"the configuration cannot be built: {type(exc).__name__}: "
                                                    f"{exc}", []))
        return report
    except Exception as exc:  # noqa: BLE001 - no manager to search: said, not raised
        return Report(cfg, broken=f"{type(exc).__name__}: {exc}")
    try:
        return explorer.run(states, seconds=seconds, first_violation=first_violation)
    except Exception as exc:  # noqa: BLE001 - the search itself failed: said, not raised
        return Report(cfg, broken=f"{type(exc).__name__}: {exc}")


class Explorer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.template = build(cfg)
        self.prompts = cfg.prompts()
        self.full = [g.index for g in self.template.layer_groups if g.is_full]
        self.oracle_on = cfg.oracle_applies and (cfg.version == "v1" or bool(self.full))
        # V1 keeps every block in every group; V2 with full attention only is the oracle's model exactly
        self.oracle_exact = cfg.version == "v1" or len(self.full) == len(self.template.layer_groups)
        self.events = EventCheck(cfg)

    # ---- states -------------------------------------------------------------------------------------------
    def snapshot(self, mgr) -> bytes:
        cache = mgr._reuse
        if cache is not None:
            cache.groups = None
        try:
            return _dumps((mgr.pools, mgr._seqs, mgr.stale_released, cache, mgr._reuse_totals, mgr._events))
        finally:
            if cache is not None:
                cache.groups = self.template.layer_groups

    def restore(self, blob: bytes):
        mgr = object.__new__(type(self.template))
        mgr.__dict__.update(self.template.__dict__)
        mgr.pools, mgr._seqs, mgr.stale_released, mgr._reuse, mgr._reuse_totals, mgr._events = pickle.loads(blob)
        if mgr._reuse is not None:
            mgr._reuse.groups = self.template.layer_groups
        return mgr

    def key(self, mgr, drv: Driver, orc) -> int:
        names = [{} for _ in mgr.pools]

        def name(g, page):
            return -1 if page < 0 else names[g].setdefault(page, len(names[g]))

        seqs = mgr._seqs
        # request slots are alike: visited in the order of what they hold (pages aside), renamed by that order
        slots = sorted(((req, cap, _seq_counters(seqs[f"r{s}"])), f"r{s}")
                       for s, (req, cap) in enumerate(zip(drv.slots, orc.caps)) if req is not None)
        parts = [drv.dummies, orc.dummies, tuple((p.num_free, p.num_reusable) for p in mgr.pools)]
        if self.cfg.host:
            parts.append(tuple(mgr.get_host_block_counts(g) for g in range(len(mgr.pools))))
        if self.cfg.retention and hasattr(mgr.pools[0], "clock"):   # V1: the clock and the timers still running
            now = mgr.pools[0].clock()
            parts.append(now)
            parts.append(tuple(tuple(sorted((expiry - now, name(g, page), pool.queue.key(page) == queue)
                                            for expiry, _, page, queue in pool._expiring))
                               for g, pool in enumerate(mgr.pools)))
        for rid_ in [r for _, r in slots] + [r for r in seqs if r[0] == "w"]:
            seq = seqs[rid_]
            parts.append((_seq_counters(seq), tuple(tuple(name(g, b) for b in blocks)
                                                     for g, blocks in enumerate(seq.blocks))))
        parts.append(tuple(signature for signature, _ in slots))
        loads = getattr(mgr._reuse, "loads", None)
        if loads is not None and loads.pending():       # copies in flight, and requests freed before they landed
            who = {id(seqs[r]): i for i, (_, r) in enumerate(slots)}
            for _, seq in loads.aborted:
                who[id(seq)] = f"aborted {len(who)}"
                parts.append((_seq_counters(seq), tuple(tuple(name(g, b) for b in blocks)
                                                         for g, blocks in enumerate(seq.blocks))))
            parts.append(tuple((who.get(id(load.seq)), load.group, name(load.group, load.page), load.node.depth,
                                load.node.tokens) for load in loads.in_flight))
        cache = mgr._reuse
        if cache is not None:
            order = []
            for g in range(len(mgr.pools)):
                unheld = sorted((n.stamps[g], n.serial) for n in cache.page_node[g].values() if n.refs[g] == 0)
                order.append({serial: i for i, (_, serial) in enumerate(unheld)})

            # the host tier: which blocks are there, in the host's eviction order (V2) or just there (V1)
            host_orders = getattr(cache, "host_orders", None)
            host_order = [{n.host[g]: i for i, n in enumerate(order.order())} for g, order in enumerate(host_orders)] \
                if host_orders is not None else None
            if host_orders is not None:     # an adaptive order's target steers its next victims
                parts.append(tuple(getattr(order, "target_t1", None) for order in host_orders))

            def node(n):
                kids = tuple(node(c) for _, c in sorted(n.children.items()))
                host = tuple(None if h < 0 else (host_order[g].get(h) if host_order else True)
                             for g, h in enumerate(n.host))
                return (n.tokens, tuple((name(g, p), n.refs[g], order[g].get(n.serial)) for g, p in enumerate(n.pages)),
                        host, n.priority if self.cfg.retention else None, kids)

            parts.append(tuple((scope, node(root)) for scope, root in sorted(cache.tree.roots.items(), key=repr)))
        return hash(tuple(parts))

    # ---- the search ---------------------------------------------------------------------------------------
    def run(self, max_states: int | None = None, seconds: float | None = None, first_violation: bool = False) -> Report:
        """The search up to ``max_states`` distinct states; past ``seconds`` (None: no limit) it stops and the
        report is ``broken``: a manager made that slow is not searched, and not passed either. ``first_violation``
        stops at the first violation (``catches.py`` asks only whether a defect is caught)."""
        cfg, limit = self.cfg, max_states or self.cfg.max_states
        report = Report(cfg)
        start, cpu = time.perf_counter(), time.process_time()
        deadline = None if seconds is None else start + seconds
        empty = build(cfg)
        empty.flush_iteration_events()             # its created events: read before the first call
        empty.get_latest_events(0)
        drv0, orc0 = Driver((None,) * cfg.slots, None), oracle_model.empty(cfg.slots)
        seen = {self.key(empty, drv0, orc0)}
        frontier = [(self.snapshot(empty), drv0, orc0, None)]
        kinds = set()
        while frontier and len(seen) < limit:
            report.depth += 1
            nxt = []
            for blob, drv, orc, path in frontier:
                self._expand(blob, drv, orc, path, seen, nxt, report, kinds, limit)
                if len(seen) >= limit or (first_violation and report.violations):
                    break
                if deadline is not None and time.perf_counter() > deadline:
                    report.broken = f"ran past its time budget of {seconds:.0f} s (depth {report.depth})"
                    break
            frontier = nxt
            if report.broken or (first_violation and report.violations):
                break
        report.states = len(seen)
        report.complete = not frontier
        report.seconds = time.perf_counter() - start
        report.cpu_seconds = time.process_time() - cpu
        return report

    def _expand(self, blob, drv, orc, path, seen, nxt, report, kinds, limit) -> None:
        cfg, prompts = self.cfg, self.prompts
        mgr, dirty, before = self.restore(blob), False, None
        report.restores += 1
        index = self.events.before(mgr)          # a router's index of this state (kvcm.events.shadow)
        for op in enabled(cfg, prompts, drv, mgr):
            if dirty:
                mgr, dirty = self.restore(blob), False
                report.restores += 1
            fits, orc_next, _ = oracle_model.step(cfg, prompts, drv, orc, op) if self.oracle_on else (True, orc, 0)
            report.sequences += 1
            try:
                drv_next = apply(mgr, cfg, prompts, drv, op)
            except Refused:
                problem = self.events.after(mgr, index, refused=True)
                if problem:
                    self._violation(report, kinds, "events", f"{op}: {problem}", path, op)
                if self.snapshot(mgr) != blob:
                    before = before or observe(self.restore(blob))
                    if op[0].startswith(("clock-", "rule-")):   # a failed clock or rule: nothing kept may differ
                        self._violation(report, kinds, f"{op[0].split('-')[0]}-changed", f"{op} changed the manager (what a "
                                        f"caller sees {'too' if observe(mgr) != before else 'alike'})", path, op)
                    elif observe(mgr) != before:
                        self._violation(report, kinds, "refused-changed", f"refused {op} changed the manager",
                                        path, op)
                    dirty = True
                if self.oracle_on and self.oracle_exact and fits and not op[0].endswith("?") and op[0] != "reset":
                    self._violation(report, kinds, "oracle", f"{op} was refused; the oracle says it fits", path, op)
                continue
            except Exception as exc:  # noqa: BLE001 - any other exception is the finding
                self._violation(report, kinds, "raised", f"{op} raised {exc!r}", path, op)
                dirty = True
                continue
            dirty = True
            problem = self.events.after(mgr, index, refused=False)
            if problem:
                self._violation(report, kinds, "events", f"after {op}: {problem}", path, op)
                continue
            problem = self._oracle_problem(mgr, drv_next, orc_next, fits, op) if self.oracle_on else None
            if problem:
                self._violation(report, kinds, "oracle", problem, path, op)
                continue
            k = self.key(mgr, drv_next, orc_next)
            if k in seen:
                continue
            seen.add(k)
            new_blob = self.snapshot(mgr)
            problem = self._state_problem(mgr, new_blob, drv_next)
            if problem:
                self._violation(report, kinds, problem[0], problem[1], path, op)
                continue
            try:
                all_free_after_reset(mgr)
            except Exception as exc:  # noqa: BLE001
                self._violation(report, kinds, "free-all", f"after {op}, freeing all and resetting: {exc!r}", path, op)
                continue
            nxt.append((new_blob, drv_next, orc_next, (path, op)))
            if len(seen) >= limit:
                return

    def _state_problem(self, mgr, blob: bytes, drv: Driver) -> tuple[str, str] | None:
        try:
            check_books(mgr)
            check_reused_tokens(mgr)
            if self.cfg.lower_tier:     # docs/semantics.md 11.8: no cached block stays on the GPU unheld
                left = [p.num_reusable for p in mgr.pools]
                assert not any(left), f"lower_tier_only: cached blocks nobody holds left on the GPU: {left}"
        except AssertionError as exc:
            return "books", str(exc)
        try:
            check_queries(mgr, drv, self.cfg, self.prompts, lambda: self.restore(self.snapshot(mgr)))
        except AssertionError as exc:
            return "query", str(exc)
        except Exception as exc:  # noqa: BLE001 - a query (or the probe's dummy) raising is the finding
            return "query", f"a query raised {exc!r}"
        if self.snapshot(mgr) != blob and observe(mgr) != observe(self.restore(blob)):
            return "query", "a query changed the manager"
        return None

    def _oracle_problem(self, mgr, drv: Driver, orc, fits: bool, op) -> str | None:
        cfg = self.cfg
        if not fits:
            return f"{op} was accepted; the oracle says it does not fit in {cfg.blocks} blocks"
        for s, cap in enumerate(orc.caps):
            if (cap is None) != (drv.slots[s] is None):
                return f"after {op}: r{s} is {'not ' * (drv.slots[s] is None)}held, the oracle says otherwise"
            if cap is not None and mgr.get_capacity(f"r{s}") != cap:
                return f"after {op}: r{s} has capacity {mgr.get_capacity(f'r{s}')}, the oracle {cap}"
        want = oracle_model.used(orc, cfg.tpb)
        groups = range(len(mgr.pools)) if cfg.version == "v1" else self.full
        for g in groups:
            if mgr.pools[g].num_used - mgr.pools[g].num_reusable != want:
                return (f"after {op}: group {g} holds {mgr.pools[g].num_used - mgr.pools[g].num_reusable} blocks, "
                        f"the oracle {want}")
        return None

    def _violation(self, report, kinds, kind, message, path, op) -> None:
        ops = _ops(path) + [op]
        signature = (kind, op[0])
        if signature in kinds:
            return
        kinds.add(signature)
        report.violations.append(Violation(kind, message, ops))


def _seq_counters(seq) -> tuple:
    state = seq.reuse
    return (seq.capacity, seq.history, seq.reserved_draft, tuple(seq.stale_done),
            None if state is None else (state.started, state.stored_full, state.prepopulated, state.loading))


def _ops(path) -> list:
    out = []
    while path is not None:
        path, op = path
        out.append(op)
    return out[::-1]


def explain(report: Report) -> str:
    """Each violation with its sequence as a plain test that replays it."""
    return "\n\n".join(f"{v.kind}: {v.message}\n{replay_text(report.cfg, v)}" for v in report.violations)
