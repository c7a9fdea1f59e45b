"""Target names -> factories (``PoolSpec -> KVCacheTarget``); imports of engines stay lazy.

Third-party targets come from ``pytest_kvcm_register_targets`` hooks. Each hook is called on its own, so whatever
goes wrong names the plugin (or conftest.py) at fault in one ``pytest.UsageError`` at start-up, before collection:
a hook that raises or returns something (it adds to ``registry`` and returns None), a name that is not a
non-empty string usable in ``--kvcm-target`` (no commas or spaces, not ``all``), a factory that is not callable,
a target removed or a registry replaced. Before, a raising hook was an ``INTERNALERROR`` and a non-callable or
non-string entry passed silently until (if ever) a test built it.
"""

from __future__ import annotations

import pytest

from .declared import TARGETS


def _lazy(adapter: str):
    """A factory that imports the adapter (and its engine) only when a test first builds the target."""
    def make(spec):
        import importlib

        module, cls = adapter.split(":")
        return getattr(importlib.import_module(module), cls)(spec)

    return make


BUILTIN_TARGETS = {t.name: _lazy(t.adapter) for t in TARGETS}   # declared in declared.py


def _where(impl) -> str:
    code = getattr(impl.function, "__code__", None)
    place = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"pytest_kvcm_register_targets of plugin {impl.plugin_name!r}{place}"


def _show(value, width: int = 80) -> str:
    """``repr`` cut to ``width``; a user's object whose ``__repr__`` raises is shown by its type."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the error being reported
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= width else text[:width - 3] + "..."


def _bad_name(name) -> str | None:
    if not isinstance(name, str):
        return f"a target name must be a string, not {type(name).__name__} ({_show(name)})"
    if not name or name != name.strip() or any(c in name for c in ", \t\n") or name == "all":
        return (f"target name {name!r} cannot be given to --kvcm-target (names are comma-separated, without spaces, "
                "and 'all' means every target)")
    return None


def _check_hook(impl, result, registry: dict, before: dict) -> None:
    """What one hook call left behind: a usage error naming the hook for the first thing wrong with it."""
    where = _where(impl)
    if result is not None and result is not registry:
        raise pytest.UsageError(f"{where} returned {type(result).__name__} {_show(result)}; it adds targets to "
                                "registry (registry['name'] = factory) and returns None")
    removed = [n for n in before if n not in registry]
    if removed:
        raise pytest.UsageError(f"{where} removed target(s) {', '.join(map(str, removed))}; add targets only "
                                "(--kvcm-target or ini kvcm_target chooses which run)")
    for name, factory in registry.items():
        if name in before and before[name] is factory:
            continue
        problem = _bad_name(name)
        if problem is None and not callable(factory):
            problem = (f"target {name!r}: the factory must be callable (PoolSpec -> KVCacheTarget), not "
                       f"{type(factory).__name__} ({_show(factory, 60)})")
        if problem:
            raise pytest.UsageError(f"{where}: {problem}")


def build_target_registry(pluginmanager=None) -> dict:
    registry = dict(BUILTIN_TARGETS)
    if pluginmanager is None:
        return registry
    hook = pluginmanager.hook.pytest_kvcm_register_targets
    for impl in reversed(hook.get_hookimpls()):  # pluggy's call order
        if impl.hookwrapper or impl.wrapper:
            continue  # a wrapper registers nothing of its own
        before = dict(registry)
        kwargs = {"registry": registry} if "registry" in impl.argnames else {}
        try:
            result = impl.function(**kwargs)
        except pytest.UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's hook failing is a usage error naming it
            raise pytest.UsageError(f"{_where(impl)} raised {type(exc).__name__}: {exc}") from None
        _check_hook(impl, result, registry, before)
    return registry
