"""The manager versions kvcm ships, each one entry here: its name and the factories of everything it builds.

An entry names its manager class, the pool of each layer group, the reuse cache over those pools and the eviction
order of its cached pages, the reuse rules (what a match may take, when blocks are stored), the reuse cache with
a host tier behind it (None: ``host_cache_size`` is refused, and why), and its DeepSeek-V4 manager (an entry of
its own, or None: the version cannot hold that cache). What a version does differently is an attribute or a method
of what it builds (``versions.get(name).cls.releases_window_pages``, ``manager.trtllm_splits_draft_budget(...)``),
never a name or a trait compared as a string, so a new version is one entry here
(``suites/managers/test_version_registry.py`` scans the code for compares of version names outside this module,
and for the old class-attribute wiring). A manager finds its entry by its class (``of``), so a subclass a test
writes builds what its base builds.

The factory, ``kvcm plan``, the plugin's ``--kvcm-version`` and the dashboard iterate ``MANAGERS``. The one
default is ``DEFAULT``: what ``auto`` resolves to for a model that declares no preference, and what
``create_kv_cache_manager`` and the plugin's ``auto`` run. ``LLM`` still defaults to ``ENGINE_DEFAULT`` (V2, as it
has since the engine had sliding windows to release); both are named here so no caller writes a version.

This module imports nothing heavy (no torch, no manager): ``kvcm plan`` checks ``--kvcm-version`` against it
before the managers load. Each factory is ``"module:attribute"``, imported on first use.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass


@functools.cache
def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ManagerVersion:
    name: str
    summary: str
    manager: str                 # the manager class
    pool: str                    # the page pool of each layer group
    reuse_cache: str             # the reuse cache over the pools (block reuse on, no host tier)
    eviction: str                # the order of the GPU level's cached pages (kvcm.eviction), given to the cache
    rules: str                   # the reuse rules (kvcm.reuse.version_rules), one instance a manager
    host_tier: str | None        # the reuse cache with a host tier behind it; None: host_cache_size is refused
    events: str                  # the KV cache event queue (kvcm.events.queue): the version's event rules
    no_host_tier: str = "this manager has no host tier in kvcm (docs/semantics.md 11.7)"   # why, when refused
    deepseek_v4: "ManagerVersion | None" = None   # this version's DeepSeek-V4 manager; None: it cannot hold it

    @property
    def cls(self) -> type:
        return _load(self.manager)

    @property
    def pool_class(self) -> type:
        return _load(self.pool)

    @property
    def reuse_cache_class(self) -> type:
        return _load(self.reuse_cache)

    @property
    def eviction_order(self):
        return _load(self.eviction)

    @property
    def reuse_rules(self) -> type:
        return _load(self.rules)

    @property
    def event_queue_class(self) -> type:
        return _load(self.events)

    @property
    def host_tier_class(self) -> type | None:
        return None if self.host_tier is None else _load(self.host_tier)


_V2 = ManagerVersion(
    "v2", "capacity/history, window release, constraints and a typical step (TensorRT-LLM's KVCacheManagerV2)",
    manager="kvcm.manager_v2:KVCacheManagerV2", pool="kvcm.block_pool:BlockPool",
    reuse_cache="kvcm.reuse.cache:ReuseCache", eviction="kvcm.eviction.tree:EvictionQueue",
    rules="kvcm.reuse.version_rules:V2ReuseRules", host_tier="kvcm.reuse.host_level:LeveledReuseCache",
    events="kvcm.events.queue:V2Queue")

MANAGERS: dict[str, ManagerVersion] = {m.name: m for m in (
    ManagerVersion(
        "v1", "token-count growth, no window release, no constraints (TensorRT-LLM's KVCacheManager)",
        manager="kvcm.manager_v1:KVCacheManagerV1", pool="kvcm.free_queue:QueuedBlockPool",
        reuse_cache="kvcm.reuse.queued_cache:QueuedReuseCache", eviction="kvcm.reuse.queued_cache:QueuedPages",
        rules="kvcm.reuse.version_rules:V1ReuseRules", host_tier="kvcm.reuse.host_tier:TieredReuseCache",
        events="kvcm.events.queue:V1Queue"),
    dataclasses.replace(_V2, deepseek_v4=dataclasses.replace(
        _V2, manager="kvcm.deepseek_v4:DeepseekV4CacheManager", host_tier=None,
        no_host_tier="DeepSeek-V4's host offload upstream is sparse history offload (completed history pages "
                     "demoted to host memory and fetched back by the sparse kernels, refused with block reuse: "
                     "test_deepseek_v4_offload_lifecycle.py::test_offload_rejects_other_history_policies), not a "
                     "host level of reusable pages; kvcm does not model it (docs/semantics.md 11.7)")),
)}

NAMES: tuple[str, ...] = tuple(MANAGERS)          # every concrete version, in the order runs and tables show them
DEFAULT = "v1"           # what ``auto`` picks for a model with no preference (TensorRT-LLM's default manager)
ENGINE_DEFAULT = "v2"    # ``LLM``'s default
AUTO = "auto"            # the model's declared preference (``ModelSpec.preferred_manager``), else DEFAULT
ALL = "both"             # a selector: every version in NAMES (``--kvcm-version both``)
FACTORY_CHOICES: tuple[str, ...] = (*NAMES, AUTO)


def get(name: str) -> ManagerVersion:
    """The version called ``name`` (a concrete one: resolve ``auto`` first)."""
    try:
        return MANAGERS[name]
    except KeyError:
        from .errors import ConfigError

        raise ConfigError("kvcm_version", name, f"one of {NAMES}") from None


def _entries():
    for entry in MANAGERS.values():
        yield entry
        if entry.deepseek_v4 is not None:
            yield entry.deepseek_v4


@functools.cache
def of(cls: type) -> ManagerVersion:
    """The entry whose manager ``cls`` is, or the nearest base of it that an entry names (a test's subclass of a
    manager builds what the manager builds)."""
    by_class = {entry.manager: entry for entry in _entries()}
    for klass in cls.__mro__:
        entry = by_class.get(f"{klass.__module__}:{klass.__qualname__}")
        if entry is not None:
            return entry
    raise TypeError(f"{cls.__name__} is no manager of kvcm.versions (known: {', '.join(by_class)})")


def serving_deepseek_v4() -> tuple[str, ...]:
    """The versions that can hold DeepSeek-V4's cache."""
    return tuple(n for n, m in MANAGERS.items() if m.deepseek_v4 is not None)


def selected(choice: str) -> list[str]:
    """The concrete versions a selector names: ``both`` is every version, any other choice itself."""
    return list(NAMES) if choice == ALL else [choice]
