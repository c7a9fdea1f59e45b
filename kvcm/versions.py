"""The manager versions kvcm ships, declared once: name, class, and what each does differently (its traits).

The factory, ``kvcm plan``, the plugin's ``--kvcm-version`` and the dashboard iterate ``MANAGERS``; code that
must behave differently per version asks a trait (``versions.get(name).releases_window_pages``) instead of
comparing the name, so a new version is one entry here (``suites/managers/test_version_registry.py`` scans the
code for string compares of version names outside this module).

The one default is ``DEFAULT``: what ``auto`` resolves to for a model that declares no preference, and what
``create_kv_cache_manager`` and the plugin's ``auto`` run. ``LLM`` still defaults to ``ENGINE_DEFAULT`` (V2, as
it has since the engine had sliding windows to release); both are named here so no caller writes a version.

This module imports nothing heavy (no torch, no manager): ``kvcm plan`` checks ``--kvcm-version`` against it
before the managers load. ``ManagerVersion.cls`` imports its class on first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ManagerVersion:
    name: str
    class_path: str            # "module:Class", imported by ``cls`` on first use
    summary: str
    # V2 frees the pages a sliding window has left behind (docs/semantics.md 4); V1 keeps a request's pages whole,
    # so V1 needs ceil(len / page) pages a group where V2 needs only the window's live pages
    releases_window_pages: bool
    # DeepSeek-V4's compressed and sliding-window groups need per-group pools and constraints (V2's layer groups)
    serves_deepseek_v4: bool
    # V1 gives every pipeline rank the fewest ranks' max_tokens (one max_tokens for every rank, TensorRT-LLM's V1)
    common_max_tokens_across_ranks: bool
    # ``kvcm plan`` reports TensorRT-LLM's estimation max_tokens next to kvcm's (the V2 estimation path,
    # docs/semantics.md 10); its final config comes from the estimation run, where the capped-max_tokens bug lived
    trtllm_estimation_path: bool
    # when TensorRT-LLM splits ``max_gpu_total_bytes`` between target and draft (``draft_budget``): V2 for a
    # one-model draft with its own cache, V1 when the layout has variable windows
    draft_budget_split: Literal["one-model draft", "variable windows"]
    # V1 always reserves ``max_draft_len`` draft slots with a context chunk; V2 reserves the step's own drafts
    reserves_max_draft_len: bool
    # kvcm models a host tier for this version (V1's secondary pool, ``reuse/host_tier.py``; V2's host level,
    # ``reuse/host_level.py``)
    host_tier_modelled: bool
    # which host tier: TensorRT-LLM V1's secondary pool (priority minimum, onboard switch, swapped block ids) or
    # V2's host level (every evicted page falls, per-level StorageStatistics; docs/semantics.md 11.6, 11.7)
    host_tier_kind: Literal["secondary pool", "host level"]
    # whose KV cache events it sends (docs/semantics.md 13): V1's WindowBlockManager (a stored event per store call,
    # v1_block_key hashes, both cache levels in created events, priority updates) or V2's radix tree (stored blocks
    # coalesced, removals held until the next other event, the hash algorithm asked, no priority updates)
    event_rules: Literal["window block manager", "radix tree"]

    @property
    def cls(self) -> type:
        module, name = self.class_path.split(":")
        return getattr(importlib.import_module(module), name)


MANAGERS: dict[str, ManagerVersion] = {m.name: m for m in (
    ManagerVersion("v1", "kvcm.manager_v1:KVCacheManagerV1",
                   "token-count growth, no window release, no constraints (TensorRT-LLM's KVCacheManager)",
                   releases_window_pages=False, serves_deepseek_v4=False, common_max_tokens_across_ranks=True,
                   trtllm_estimation_path=False, draft_budget_split="variable windows",
                   reserves_max_draft_len=True, host_tier_modelled=True, host_tier_kind="secondary pool",
                   event_rules="window block manager"),
    ManagerVersion("v2", "kvcm.manager_v2:KVCacheManagerV2",
                   "capacity/history, window release, constraints and a typical step (TensorRT-LLM's "
                   "KVCacheManagerV2)",
                   releases_window_pages=True, serves_deepseek_v4=True, common_max_tokens_across_ranks=False,
                   trtllm_estimation_path=True, draft_budget_split="one-model draft",
                   reserves_max_draft_len=False, host_tier_modelled=True, host_tier_kind="host level",
                   event_rules="radix tree"),
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


def serving_deepseek_v4() -> tuple[str, ...]:
    """The versions that can hold DeepSeek-V4's cache."""
    return tuple(n for n, m in MANAGERS.items() if m.serves_deepseek_v4)


def selected(choice: str) -> list[str]:
    """The concrete versions a selector names: ``both`` is every version, any other choice itself."""
    return list(NAMES) if choice == ALL else [choice]
