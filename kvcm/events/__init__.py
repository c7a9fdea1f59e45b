"""KV cache events: what enters and leaves a manager's reuse tree, as TensorRT-LLM reports it to KV-aware routers
(docs/semantics.md 13). ``types`` holds the events, ``hashing`` the block hashes they carry, ``queue`` each
version's batching and full-queue rules, ``emitter`` the reuse cache's hooks, ``api`` the manager's calls and
``shadow`` a router's index rebuilt from the events alone, beside the blocks a manager would match."""

from .hashing import ALGORITHMS
from .types import (GPU_LEVEL, HOST_LEVEL, KVCacheCreatedData, KVCacheEvent, KVCacheEventDiff, KVCacheRemovedData,
                    KVCacheStoredBlockData, KVCacheStoredData, KVCacheUpdatedData)

__all__ = ["ALGORITHMS", "GPU_LEVEL", "HOST_LEVEL", "KVCacheCreatedData", "KVCacheEvent", "KVCacheEventDiff",
           "KVCacheRemovedData", "KVCacheStoredBlockData", "KVCacheStoredData", "KVCacheUpdatedData"]
