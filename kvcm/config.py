"""Value types of the public API: the cache config and the batch descriptions constraints are written in."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Literal

import torch
from pydantic import AfterValidator, Field, StrictBool

from .errors import ConfigError
from .events.hashing import ALGORITHMS as EVENT_HASH_ALGORITHMS
from .validation import Int, Number, config_dataclass, power_of_two

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
}


def resolve_dtype(value, field_name: str = "dtype") -> torch.dtype:
    """Accept a torch dtype or its usual spellings ('bfloat16', 'torch.float32', 'fp8')."""
    if isinstance(value, torch.dtype):
        return value
    key = str(value).removeprefix("torch.").lower()
    if key not in _DTYPES:
        raise ConfigError(field_name, value, f"one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVCacheDesc:
    """One request of a batch description: tokens reserved and tokens whose KV is final."""

    capacity: int
    history_length: int = 0

    def __post_init__(self):
        if self.capacity < 0:
            raise ConfigError("KVCacheDesc.capacity", self.capacity, "must be >= 0")
        if not 0 <= self.history_length <= self.capacity:
            raise ConfigError(
                "KVCacheDesc.history_length", self.history_length, f"must be in [0, capacity={self.capacity}]"
            )


@dataclass(frozen=True)
class BatchDesc:
    """A batch the manager must always be able to hold (a constraint) or the batch it is tuned for (typical step).

    ``system_prompt_length`` tokens at the start of every request are one shared prefix: their whole blocks are
    counted once in full-attention groups.
    """

    kv_caches: tuple[KVCacheDesc, ...] = field(default_factory=tuple)
    system_prompt_length: int = 0

    def __post_init__(self):
        object.__setattr__(self, "kv_caches", tuple(self.kv_caches))
        if self.system_prompt_length < 0:
            raise ConfigError("BatchDesc.system_prompt_length", self.system_prompt_length, "must be >= 0")

    def __len__(self):
        return len(self.kv_caches)


HOST_EVICTION_POLICIES = ("lru", "arc")
MAX_EVENT_BUFFER = (1 << 31) - 1
"""The most events a manager keeps for ``get_latest_events`` (TensorRT-LLM's queue is sized by a SizeType32)."""
"""The values of ``KvCacheConfig.host_eviction_policy``: each names its module of ``kvcm.eviction``."""


def _power_of_two(tpb: int) -> int:
    return power_of_two("tokens_per_block", tpb)


def _kv_dtype(value):
    if value != "auto":
        resolve_dtype(value)
    return value


@config_dataclass
class KvCacheConfig:
    """How big the cache is and how it is split (TensorRT-LLM's KvCacheConfig names).

    Budget: ``max_gpu_total_bytes``, ``max_tokens`` or ``free_gpu_memory_fraction`` of free memory; when several
    are given the smallest wins; with none, the fraction defaults to 0.9. ``dtype`` is the KV dtype of every
    attention layer; ``"auto"`` keeps each layer's dtype from the model spec. Each field's limit is declared
    with it (``kvcm.validation``); a bad value raises ``ConfigError``.

    Block reuse (docs/semantics.md 11) is on by default, as TensorRT-LLM's ``KvCacheConfig``: it only ever acts
    on requests made with ``add_sequence`` and their token ids, so a caller that never passes token ids sees
    no difference. ``enable_partial_reuse`` lets a partly matched last block be reused (copied, or in V1 taken
    over when nobody holds it); ``copy_on_partial_reuse`` lets V1 copy one that a request holds.
    """

    tokens_per_block: Annotated[Int, Field(ge=1), AfterValidator(_power_of_two)] = Field(
        32, description="must be a positive integer and a power of two")
    max_tokens: Annotated[Int, Field(ge=1)] | None = None
    max_gpu_total_bytes: Annotated[Int, Field(ge=1)] | None = None
    free_gpu_memory_fraction: Annotated[Number, Field(gt=0, lt=1)] | None = Field(None, description="must be in (0, 1)")
    pool_ratio: Annotated[tuple[Annotated[Number, Field(gt=0)], ...], Field(min_length=1)] | None = Field(
        None, description="needs one positive weight per layer group")
    avg_seq_len: Annotated[Int, Field(ge=1)] | None = None
    dtype: Annotated[object, AfterValidator(_kv_dtype)] = "bfloat16"
    enable_block_reuse: StrictBool = Field(True, description="must be True or False")
    enable_partial_reuse: StrictBool = Field(True, description="must be True or False")
    copy_on_partial_reuse: StrictBool = Field(True, description="must be True or False")
    # the host (secondary) tier, TensorRT-LLM's names and defaults (llm_args.py KvCacheConfig): host_cache_size in
    # bytes (None: no tier); onboard_blocks: blocks offloaded on eviction come back on reuse (False: nothing is
    # offloaded, as upstream's getFreeBlock asks for it); secondary_offload_min_priority: the lowest retention
    # priority that is offloaded rather than dropped (None: upstream's 30). V1 only (docs/semantics.md 11.6).
    host_cache_size: Annotated[Int, Field(ge=0, le=1 << 50)] | None = Field(
        None, description="must be an integer number of bytes in [0, 2**50] or None")
    onboard_blocks: StrictBool = Field(True, description="must be True or False")
    secondary_offload_min_priority: Annotated[Int, Field(ge=0, le=100)] | None = Field(
        None, description="must be an integer in [0, 100] or None")
    # the order V2's host level evicts its own pages in (kvcm.eviction, a module of each name); V1's secondary pool
    # keeps TensorRT-LLM's LRU queue, "lru"
    host_eviction_policy: Literal[HOST_EVICTION_POLICIES] = Field(
        "lru", description=f"must be one of {', '.join(map(repr, HOST_EVICTION_POLICIES))}")
    # KV cache events (docs/semantics.md 13), TensorRT-LLM's names and defaults: event_buffer_max_size events are
    # kept for get_latest_events (0: events off); the hash algorithm of the blocks they name ("auto": v1_block_key)
    event_buffer_max_size: Annotated[Int, Field(ge=0, le=MAX_EVENT_BUFFER)] = Field(
        0, description="must be an integer in [0, 2**31 - 1] (0: events off)")
    kv_cache_event_hash_algo: Literal[EVENT_HASH_ALGORITHMS] = Field(
        "auto", description=f"must be one of {', '.join(EVENT_HASH_ALGORITHMS)}")
    # kvcm's own switches of the host tier (no TensorRT-LLM field; docs/semantics.md 11.8): lower_tier_only moves
    # every block that becomes reusable to the host tier at once, so every hit is loaded back from there (the test
    # mode SGLang PR #26977 proposed for HiCache); async_onboard leaves a request whose hit comes from the host
    # loading until complete_transfers() (vLLM's WAITING_FOR_REMOTE_KVS). Each needs block reuse and a host tier.
    lower_tier_only: StrictBool = Field(False, description="must be True or False")
    async_onboard: StrictBool = Field(False, description="must be True or False")

    DEFAULT_FRACTION = 0.9
    DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY = 30
    """TensorRT-LLM's ``kDefaultSecondaryOffloadMinPriority`` (evictionPolicy.cpp); the code offloads at ``>=``."""

    @property
    def offload_min_priority(self) -> int:
        p = self.secondary_offload_min_priority
        return self.DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY if p is None else p

    @property
    def fraction(self) -> float:
        return self.DEFAULT_FRACTION if self.free_gpu_memory_fraction is None else self.free_gpu_memory_fraction

    def replace(self, **changes) -> "KvCacheConfig":
        return dataclasses.replace(self, **changes)
