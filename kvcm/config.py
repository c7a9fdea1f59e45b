"""Value types of the public API: the cache config and the batch descriptions constraints are written in."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from .errors import ConfigError

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


@dataclass(frozen=True)
class KvCacheConfig:
    """How big the cache is and how it is split (TensorRT-LLM's KvCacheConfig names).

    Budget: ``max_gpu_total_bytes``, ``max_tokens`` or ``free_gpu_memory_fraction`` of free memory; when several
    are given the smallest wins; with none, the fraction defaults to 0.9. ``dtype`` is the KV dtype of every
    attention layer; ``"auto"`` keeps each layer's dtype from the model spec.
    """

    tokens_per_block: int = 32
    max_tokens: int | None = None
    max_gpu_total_bytes: int | None = None
    free_gpu_memory_fraction: float | None = None
    pool_ratio: tuple[float, ...] | None = None
    avg_seq_len: int | None = None
    dtype: str = "bfloat16"

    DEFAULT_FRACTION = 0.9

    def __post_init__(self):
        if not isinstance(self.tokens_per_block, int) or self.tokens_per_block < 1:
            raise ConfigError("tokens_per_block", self.tokens_per_block, "must be a positive integer")
        if self.tokens_per_block & (self.tokens_per_block - 1):
            raise ConfigError("tokens_per_block", self.tokens_per_block, "must be a power of two")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError("max_tokens", self.max_tokens, "must be >= 1")
        if self.max_gpu_total_bytes is not None and self.max_gpu_total_bytes < 1:
            raise ConfigError("max_gpu_total_bytes", self.max_gpu_total_bytes, "must be >= 1")
        f = self.free_gpu_memory_fraction
        if f is not None and not 0.0 < f < 1.0:
            raise ConfigError("free_gpu_memory_fraction", f, "must be in (0, 1)")
        if self.pool_ratio is not None:
            ratio = tuple(float(r) for r in self.pool_ratio)
            if not ratio or any(not r > 0 for r in ratio):
                raise ConfigError("pool_ratio", self.pool_ratio, "needs one positive weight per layer group")
            object.__setattr__(self, "pool_ratio", ratio)
        if self.avg_seq_len is not None and self.avg_seq_len < 1:
            raise ConfigError("avg_seq_len", self.avg_seq_len, "must be >= 1")
        if self.dtype != "auto":
            resolve_dtype(self.dtype)

    @property
    def fraction(self) -> float:
        return self.DEFAULT_FRACTION if self.free_gpu_memory_fraction is None else self.free_gpu_memory_fraction

    def replace(self, **changes) -> "KvCacheConfig":
        return dataclasses.replace(self, **changes)
