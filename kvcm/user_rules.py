"""A rule the user hands to ``kvcm.policy`` runs as all or nothing: a manager call in which it raises is undone.

``Policy.replacing(rule=fn)`` puts the user's code in the middle of the managers' arithmetic: a call may have
freed a request, evicted a block and filed an event before the rule it meets next raises. Its signature is checked
where it is handed in (``Decision.check``), but what it does when called cannot be. So a replaced rule is wrapped in
``UserRule``, which names the rule when its code raises (``UserCallbackError("policy.<name>")``), and a manager built
with such a policy snapshots itself before each call that may change it (``install``) and, when a user rule raised,
puts every object it had back as it was, in place: the objects an engine holds (pools, the reuse cache, the event
queue) stay the same objects, with their state before the call.

What is kept: every attribute of kvcm's own objects reachable from the manager, and the contents of the lists,
dicts, sets, deques and bytearrays among them. What is not: tensors (the KV pages and host-tier storage are data; a
call undone this way leaves the pages it wrote free again in the restored books), what declares itself
``immutable`` (a policy), functions and the user's own objects (a clock). A catalogued defect's replacements
are not wrapped (``Policy.with_catalogued``): a defect must act as the historic bug did, raising or not. The
default policy wraps nothing, so a manager built with it pays nothing: the snapshot is installed per manager,
only when its policy holds a user rule.
"""

from __future__ import annotations

import collections
import functools
import itertools

import torch

from .errors import KvcmError, UserCallbackError

# The calls of a manager that may change it (the explorer's alphabet, and what the engine calls between steps);
# a query (``get_num_available_tokens``, ``block_table``) changes nothing and is left as it is.
CHANGING_CALLS = ("add_request", "add_sequence", "add_tokens", "append_tokens", "add_dummy_requests",
                  "begin_context_chunk", "end_context_chunk", "begin_generation", "end_generation", "resize",
                  "rewind", "free_resources", "refresh_blocks", "reset_prefix_cache", "reset_page_usage",
                  "complete_transfers", "flush_iteration_events", "get_latest_events")


class UserRule:
    """A user's replacement of rule ``name``: called as the rule; what it raises comes out as a
    ``UserCallbackError`` naming ``policy.<name>``, but for kvcm's own errors, which a rule may raise as its
    default does (``checked_dummy_call``'s ``ConfigError``); either way the manager call around it is undone."""

    __slots__ = ("name", "fn", "__wrapped__")

    def __init__(self, name: str, fn):
        self.name, self.fn, self.__wrapped__ = name, fn, fn

    def __call__(self, *args, **kwargs):
        try:
            return self.fn(*args, **kwargs)
        except KvcmError:
            raise
        except Exception as exc:
            raise UserCallbackError(f"policy.{self.name}", f"raised {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"UserRule({self.name}, {self.fn!r})"


_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.Tensor, torch.device, torch.dtype, type,
           range, slice, UserRule)
_CONTAINERS = (list, dict, set, collections.deque, bytearray)


def _is_ours(obj) -> bool:
    module = type(obj).__module__
    return module == "kvcm" or module.startswith("kvcm.")


def _fields(obj) -> dict | None:
    """An object of kvcm's own attributes, or None for what is not kept (frozen, or not ours)."""
    params = getattr(type(obj), "__dataclass_params__", None)
    if params is not None and params.frozen:
        return None
    out = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out[slot] = getattr(obj, slot)
    for name, value in out.items():     # a serial counter advanced by the call: a new one at today's value
        if isinstance(value, itertools.count):
            out[name] = itertools.count(int(repr(value)[len("count("):-1]))
    return out


class Snapshot:
    """The state of every object reachable from ``root`` that a call may change, to put back in place."""

    def __init__(self, root):
        self.saved: list[tuple[object, object]] = []
        seen, stack = set(), [root]
        while stack:        # iterative: a free list or a reuse tree is deeper than Python's recursion limit
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, _LEAVES) or getattr(type(obj), "immutable", False) \
                    or callable(obj) and not _is_ours(obj):
                continue
            seen.add(id(obj))
            if isinstance(obj, _CONTAINERS):
                if isinstance(obj, dict):
                    state = list(obj.items())
                    stack.extend(v for kv in state for v in kv)
                elif isinstance(obj, bytearray):
                    state = bytes(obj)
                else:
                    state = list(obj)
                    stack.extend(state)
                self.saved.append((obj, state))
            elif isinstance(obj, (tuple, frozenset)):
                stack.extend(obj)
            elif _is_ours(obj):
                fields = _fields(obj)
                if fields is not None:
                    self.saved.append((obj, fields))
                    stack.extend(fields.values())

    def restore(self) -> None:
        for obj, state in self.saved:
            if isinstance(obj, dict):
                obj.clear()
                obj.update(state)
            elif isinstance(obj, (list, bytearray)):
                obj[:] = state
            elif isinstance(obj, (set, collections.deque)):
                obj.clear()
                obj.extend(state) if isinstance(obj, collections.deque) else obj.update(state)
            else:
                for name in set(getattr(obj, "__dict__", ())) - set(state):
                    object.__delattr__(obj, name)       # what the failed call added
                for name, value in state.items():
                    object.__setattr__(obj, name, value)


def install(manager) -> None:
    """Make each of ``manager``'s changing calls all or nothing (undone on any exception), when its policy holds a
    user's rule: the manager becomes an instance of a subclass of its class whose changing calls snapshot first
    (a subclass rather than wrappers on the instance, so a copy of the manager's attributes onto another manager
    calls that one's methods). A call made inside another keeps the outer call's snapshot."""
    if not manager.policy.user_rules:
        return
    cls = type(manager)
    if cls not in _UNDOING:
        calls = {name: _all_or_nothing(getattr(cls, name)) for name in CHANGING_CALLS if hasattr(cls, name)}
        _UNDOING[cls] = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                    "_undo_depth": 0, **calls})
    manager.__class__ = _UNDOING[cls]


_UNDOING: dict[type, type] = {}


def _all_or_nothing(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        outer = self._undo_depth
        if outer:
            return method(self, *args, **kwargs)
        snapshot = Snapshot(self)
        self._undo_depth = 1
        try:
            return method(self, *args, **kwargs)
        except Exception:        # a user's rule that raised, or refused as kvcm does (a ConfigError): all or nothing
            snapshot.restore()
            raise
        finally:
            self._undo_depth = outer

    return call
