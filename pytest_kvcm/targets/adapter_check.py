"""A user's adapter is checked once, when the session starts, before any contract test runs.

Without this, an adapter that forgot ``held_pages`` or whose ``_allocate`` returns ``None`` fails every contract
test with the same ``NotImplementedError`` or a confusing assertion (``None == False``), each far from the line
to fix. Here it is one ``pytest.UsageError`` naming the target, its class and the method (or attribute), with
what was expected and what came back.

What is checked, on a small pool (``PROBE``) built through the registered factory:

* the factory returns a ``KVCacheTarget`` (so the contract's bookkeeping, ``allocate``/``grow``/``free``, exists);
* every required method is the adapter's own (not the base class's ``NotImplementedError``): ``free_pages``,
  ``held_pages``, ``_allocate``, ``_grow``, ``_free``;
* ``page_size`` and ``total_pages`` are positive ints, ``reserved_pages`` a non-negative int below the pool;
* a probe request of one token is allocated (``_allocate`` returns a bool), grown by one (a bool), its
  ``held_pages`` is a dict with an int ``"full"`` entry, ``free_pages()`` is an int before and after, and the
  request is freed;
* the optional capacity query comes as a pair: ``available_tokens`` returns an int, and an adapter with one of
  ``available_tokens``/``allocate_generation`` has both (the tests that use them call both);
* an attribute that raises when read (a property) is reported as the adapter's, never an ``INTERNALERROR``;
  ``differences`` is a dict of check name -> reason whose keys are those of ``differences.KEYS`` / ``NOTES``;
* an adapter's own ``allocate_batch`` returns a bool for a batch of one probe request;
* the reuse side (issue 40.5: ``supports_reuse = 'no'`` read as true, then 16 ``NotImplementedError`` failures):
  ``supports_reuse`` is a bool and ``reuse_oracle`` one of ``REUSE_ORACLES``; with reuse, the four reuse methods
  are the adapter's own and, on a probe built with ``PoolSpec(reuse=True)``, ``_allocate_prompt`` returns an int
  below the prompt's length (or None), ``lookup`` and ``cached_pages`` ints and ``reset_cache`` a bool.

Only user-registered targets are probed: the built-in adapters are the contract suites' own subjects, and
building some of them (transformers, vLLM) costs seconds at every start. A factory that raises
``TargetUnavailable`` is left to the tests, which skip with its install hint. Hook-level problems (the hook
raising, names that are not strings) are the registry's business, not this module's.
"""

from __future__ import annotations

import dataclasses
import numbers
import reprlib

import pytest

from .contract import REUSE_ORACLES, KVCacheTarget, PoolSpec, TargetUnavailable
from .differences import KEYS, NOTES, unknown_keys

PROBE = PoolSpec(num_pages=16, page_size=16, max_model_len=256)
REQUIRED = ("free_pages", "held_pages", "_allocate", "_grow", "_free")
PAIRED = ("available_tokens", "allocate_generation")
PROBE_RID = "kvcm-adapter-check"
REUSE_METHODS = ("_allocate_prompt", "lookup", "cached_pages", "reset_cache")
_SHORT = reprlib.Repr()   # a probe prompt shows as [0, 1, 2, 3, ...] (keywords need Python 3.12)
_SHORT.maxlist, _SHORT.maxstring = 4, 60


class AdapterError(Exception):
    """One defect of an adapter: ``method`` is what to fix, ``message`` what is wrong with it."""

    def __init__(self, method: str, message: str):
        super().__init__(message)
        self.method, self.message = method, message


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool too


def _call(target, method: str, *args):
    try:
        return getattr(target, method)(*args)
    except Exception as exc:  # noqa: BLE001 - whatever the adapter raises is its own to fix
        shown = ", ".join(_SHORT.repr(a) for a in args)
        raise AdapterError(method, f"{method}({shown}) raised {type(exc).__name__}: {exc}")


def _attr(target, name: str):
    """``target.name`` (None when absent); an attribute whose getter raises is the adapter's defect."""
    try:
        return getattr(target, name, None)
    except Exception as exc:  # noqa: BLE001 - a property of the adapter raising is the adapter's to fix
        raise AdapterError(name, f"reading {name} raised {type(exc).__name__}: {exc}") from None


def _expect(method: str, value, kind: str, ok: bool) -> None:
    if not ok:
        raise AdapterError(method, f"{method} must return {kind}; it returned {value!r} ({type(value).__name__})")


def check_target(target) -> None:
    """Raise ``AdapterError`` for the first defect of a built adapter; leaves it with nothing allocated."""
    if not isinstance(target, KVCacheTarget):
        raise AdapterError("factory", f"the factory must return a pytest_kvcm.targets.KVCacheTarget; it returned "
                                      f"{type(target).__name__}")
    cls = type(target)
    missing = [m for m in REQUIRED if getattr(cls, m, None) is getattr(KVCacheTarget, m)]
    if missing:
        raise AdapterError(missing[0], f"{', '.join(missing)} not implemented (required: {', '.join(REQUIRED)})")
    for attr, low in (("page_size", 1), ("total_pages", 1), ("reserved_pages", 0)):
        value = _attr(target, attr)
        if not _is_int(value) or value < low:
            raise AdapterError(attr, f"{attr} must be an int >= {low}; it is {value!r}"
                                     + (f" ({type(value).__name__})" if value is not None else " (not set)"))
    if target.reserved_pages >= target.total_pages:
        raise AdapterError("reserved_pages", f"reserved_pages={target.reserved_pages} leaves nothing of "
                                             f"total_pages={target.total_pages}")
    differences = _attr(target, "differences")
    if not isinstance(differences, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in differences.items()):
        raise AdapterError("differences", f"differences must be a dict of check name -> reason (str -> str); it is "
                                          f"{differences!r:.80} ({type(differences).__name__})")
    unknown = unknown_keys(differences)
    if unknown:
        raise AdapterError("differences", f"unknown key {unknown[0]!r}: no contract test reads it, so it would relax "
                                          f"nothing; keys: {', '.join(KEYS)} (notes that relax nothing: "
                                          f"{', '.join(NOTES)}; what each relaxes: python -m pytest_kvcm.contract "
                                          "--keys)")
    has = [m for m in PAIRED if callable(_attr(target, m))]
    if len(has) == 1:
        other = next(m for m in PAIRED if m not in has)
        raise AdapterError(other, f"{has[0]} is defined but {other} is not: the capacity-query tests call both")
    free = _call(target, "free_pages")
    _expect("free_pages", free, "an int", _is_int(free))
    ok = _call(target, "_allocate", PROBE_RID, 1, 0)
    _expect("_allocate", ok, "a bool (True: allocated, False: nothing allocated)", _is_bool(ok))
    if not ok:
        raise AdapterError("_allocate", f"refused one token on a fresh pool of {target.total_pages} pages "
                                        f"(free_pages() = {free})")
    target._tokens[PROBE_RID] = 1  # what the base class's allocate records
    try:
        held = _call(target, "held_pages", PROBE_RID)
        _expect("held_pages", held, 'a dict with an int "full" entry',
                isinstance(held, dict) and _is_int(held.get("full")))
        grown = _call(target, "_grow", PROBE_RID, 1, 1, 0)
        _expect("_grow", grown, "a bool (True: grown, False: the request as it was)", _is_bool(grown))
        if grown:
            target._tokens[PROBE_RID] = 2
        after = _call(target, "free_pages")
        _expect("free_pages", after, "an int", _is_int(after))
        if "available_tokens" in has:
            answer = _call(target, "available_tokens", 64, 1, 0)
            _expect("available_tokens", answer, "an int", _is_int(answer))
        if getattr(cls, "allocate_batch", None) is not KVCacheTarget.allocate_batch:
            batch = _call(target, "allocate_batch", [PROBE_RID + "-batch"], [1], 0)
            _expect("allocate_batch", batch, "a bool (True: every request allocated, False: none)", _is_bool(batch))
            if batch:
                if PROBE_RID + "-batch" not in target._tokens:
                    target._tokens[PROBE_RID + "-batch"] = 1
                _call(target, "free", PROBE_RID + "-batch")
    finally:
        try:
            target.free(PROBE_RID)
        except Exception as exc:  # noqa: BLE001 - any failure to free is the adapter's, and is reported as such
            raise AdapterError("_free", f"_free({PROBE_RID!r}) raised {type(exc).__name__}: {exc}") from None


def check_reuse(target, build) -> None:
    """Raise ``AdapterError`` for the first defect of the reuse side; ``build(spec)`` makes a fresh adapter."""
    flag = _attr(target, "supports_reuse")
    if not isinstance(flag, bool):
        raise AdapterError("supports_reuse", f"supports_reuse must be True or False; it is {flag!r} "
                                             f"({type(flag).__name__})")
    oracle = _attr(target, "reuse_oracle")
    if oracle not in REUSE_ORACLES:
        raise AdapterError("reuse_oracle", f"reuse_oracle must be one of {', '.join(map(repr, REUSE_ORACLES))} (the "
                                           f"kvcm version the reuse state machine compares with); it is {oracle!r}")
    if not flag:
        return
    cls = type(target)
    missing = [m for m in REUSE_METHODS if getattr(cls, m, None) is getattr(KVCacheTarget, m)]
    if missing:
        raise AdapterError(missing[0], f"{', '.join(missing)} not implemented (supports_reuse = True needs "
                                       f"{', '.join(REUSE_METHODS)})")
    spec = dataclasses.replace(PROBE, reuse=True)
    try:
        probe = build(spec)
    except TargetUnavailable:
        return
    except Exception as exc:  # noqa: BLE001 - whatever the factory raises is the adapter's to fix
        raise AdapterError("factory", f"building it for {spec} raised {type(exc).__name__}: {exc}") from None
    ids = list(range(min(2 * probe.page_size + 1, probe.max_model_len)))   # two whole blocks and a token
    got = _call(probe, "_allocate_prompt", PROBE_RID, ids)
    _expect("_allocate_prompt", got, f"an int from 0 to {len(ids) - 1} (the prompt tokens reused) or None (refused, "
            "nothing changed)", got is None or (_is_int(got) and 0 <= got < len(ids)))
    if got is None:
        raise AdapterError("_allocate_prompt", f"refused a prompt of {len(ids)} tokens on a fresh pool of "
                                               f"{probe.total_pages} pages")
    probe._tokens[PROBE_RID] = len(ids)
    try:
        hit = _call(probe, "lookup", ids)
        _expect("lookup", hit, "an int (the prompt tokens a new request would reuse)", _is_int(hit))
        cached = _call(probe, "cached_pages")
        _expect("cached_pages", cached, "an int (cached pages no request holds)", _is_int(cached))
    finally:
        try:
            probe.free(PROBE_RID)
        except Exception as exc:  # noqa: BLE001 - the adapter's to fix
            raise AdapterError("_free", f"_free({PROBE_RID!r}) raised {type(exc).__name__}: {exc}") from None
    reset = _call(probe, "reset_cache")
    _expect("reset_cache", reset, "a bool (True: dropped, False: refused while a request holds pages)",
            _is_bool(reset))


def check_registered(registry: dict, names: list[str], builtin: dict) -> None:
    """``pytest.UsageError`` for the first selected, user-registered target whose adapter is broken."""
    for name in names:
        factory = registry[name]
        if builtin.get(name) is factory:
            continue
        where = f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"
        try:
            target = factory(PROBE)
        except TargetUnavailable:
            continue
        except Exception as exc:  # noqa: BLE001 - whatever the factory raises is the adapter's to fix
            raise pytest.UsageError(f"--kvcm-target={name}: adapter {where}: building it for {PROBE} raised "
                                    f"{type(exc).__name__}: {exc}") from None
        try:
            check_target(target)
            check_reuse(target, factory)
        except AdapterError as err:
            adapter = type(target).__name__ if isinstance(target, KVCacheTarget) else where
            raise pytest.UsageError(f"--kvcm-target={name}: adapter {adapter}, {err.method}: {err.message}") from None
