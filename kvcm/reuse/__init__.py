"""Block reuse (prefix caching) for kvcm's managers: the radix tree of exact keys, the per-version matching and
storing rules, the retention priorities and the stats (docs/semantics.md 11); the eviction orders are
``kvcm.eviction``'s."""

from .retention import (DEFAULT_RETENTION_PRIORITY, MAX_RETENTION_PRIORITY, MIN_RETENTION_PRIORITY,
                        KvCacheRetentionConfig, TokenRangeRetentionConfig)
from .stats import BlockCounts, KvCacheStats, RequestReuseStats

__all__ = ["BlockCounts", "DEFAULT_RETENTION_PRIORITY", "KvCacheRetentionConfig", "KvCacheStats",
           "MAX_RETENTION_PRIORITY", "MIN_RETENTION_PRIORITY", "RequestReuseStats",
           "TokenRangeRetentionConfig"]
