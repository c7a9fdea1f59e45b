"""The KV cache events a manager reports, in TensorRT-LLM's shapes (``executor.h`` ``KVCacheEvent`` and its
data; V2's ``kv_cache_manager_v2/_event_manager.py`` keeps the same ones, "matching the C++ KV cache event
serializer contract").

A router (NVIDIA Dynamo's indexer, llm-d) rebuilds a worker's prefix index from these alone: ``created`` once a
pool (block counts per cache level), ``stored`` when blocks enter the reuse tree (a chain under ``parent_hash``),
``removed`` when they leave it, ``updated`` when a block moves between cache levels (0: GPU, 1: host) or its
retention priority changes. Each event carries the window size of the group it is about and, in kvcm, the
layer group (TensorRT-LLM V2's ``layer_group_id``; V1 names a group by its window size alone).
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_LEVEL = 0
HOST_LEVEL = 1

BlockHash = int | str
"""A block's hash as events carry it: an int for ``v1_block_key`` and ``v2_sha256_64``, hex text for
``v2_sha256`` (``kvcm.events.hashing``)."""


@dataclass(frozen=True, slots=True)
class KVCacheCreatedData:
    num_blocks_per_cache_level: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KVCacheStoredBlockData:
    block_hash: BlockHash
    tokens: tuple[int, ...]
    lora_id: int | None
    cache_level: int
    priority: int


@dataclass(frozen=True, slots=True)
class KVCacheStoredData:
    parent_hash: BlockHash | None          # None: the blocks hang from the root (the first block of a prompt)
    blocks: tuple[KVCacheStoredBlockData, ...]


@dataclass(frozen=True, slots=True)
class KVCacheRemovedData:
    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class KVCacheEventDiff:
    old_value: int
    new_value: int


@dataclass(frozen=True, slots=True)
class KVCacheUpdatedData:
    block_hash: BlockHash
    cache_level: KVCacheEventDiff | None = None
    priority: KVCacheEventDiff | None = None


EventData = KVCacheCreatedData | KVCacheStoredData | KVCacheRemovedData | KVCacheUpdatedData


@dataclass(frozen=True, slots=True)
class KVCacheEvent:
    event_id: int
    data: EventData
    window_size: int
    hash_algo: str
    layer_group_id: int | None = None
    attention_dp_rank: int | None = None

    @property
    def kind(self) -> str:
        """``created``, ``stored``, ``removed`` or ``updated`` (TensorRT-LLM's serializer's ``type``)."""
        return _KINDS[type(self.data)]


_KINDS = {KVCacheCreatedData: "created", KVCacheStoredData: "stored", KVCacheRemovedData: "removed",
          KVCacheUpdatedData: "updated"}
