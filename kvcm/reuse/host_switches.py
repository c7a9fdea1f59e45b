"""The host tier's own switches (``KvCacheConfig.lower_tier_only``, ``async_onboard``; docs/semantics.md 11.8): what
each needs, checked when a manager is built, one ``ConfigError`` naming the field, its value and what it lacks."""

from __future__ import annotations

from ..errors import ConfigError

SWITCHES = ("lower_tier_only", "async_onboard")


def check_config(cfg) -> None:
    """Before the reuse cache is built: block reuse and a host tier for either switch, and for ``lower_tier_only``
    on V1 ``onboard_blocks`` (without it nothing is offloaded, so no hit would ever happen)."""
    for name in SWITCHES:
        if getattr(cfg, name) and not cfg.enable_block_reuse:
            raise ConfigError(name, True, "needs enable_block_reuse=True: only cached blocks reach the host tier")
        if getattr(cfg, name) and not cfg.host_cache_size:
            raise ConfigError(name, True, f"needs a host tier: host_cache_size > 0 bytes (it is "
                              f"{cfg.host_cache_size})")
    if cfg.lower_tier_only and not cfg.onboard_blocks:
        raise ConfigError("onboard_blocks", False, "must be True with lower_tier_only: no block would reach the host "
                          "tier, so no hit would ever happen")


def check_built(cfg, cache) -> None:
    """Once it is built: a host tier of one block a group at least (V1 floors its bytes to whole blocks)."""
    name = next((n for n in SWITCHES if getattr(cfg, n)), None)
    if name is not None and not getattr(cache, "host", None):
        raise ConfigError(name, True, f"needs a host tier of one block a group at least: host_cache_size="
                          f"{cfg.host_cache_size} bytes holds none")
