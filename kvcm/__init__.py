"""kvcm: exact, readable reference KV cache managers (V1, V2, DeepSeek-V4) on accounting-only or real pools.

The public names load on first use (PEP 562): ``import kvcm`` alone does not import torch, so the ``kvcm``
command answers ``--help`` and bad arguments in a fraction of a second. ``kvcm.ModelSpec`` and friends import
their module (and torch) when first touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the submodule that defines it
_EXPORTS = {
    "BatchDesc": "config", "KVCacheDesc": "config", "KvCacheConfig": "config",
    "DeepseekV4CacheManager": "deepseek_v4", "DeepseekV4Spec": "deepseek_v4",
    "BudgetExceededError": "errors", "ConfigError": "errors", "KvcmError": "errors", "OutOfPagesError": "errors",
    "UnknownRequestError": "errors", "UserCallbackError": "errors",
    "Estimation": "estimation", "build_with_estimation": "estimation",
    "create_kv_cache_manager": "factory",
    "DummyRequest": "dummies", "Limits": "limits", "MAX_BATCH_SIZE": "limits", "MAX_SEQ_LEN": "validation",
    "MAX_LAYERS": "validation",
    "KVCacheManagerV1": "manager_v1",
    "KVCacheManagerV2": "manager_v2",
    "LayerSpec": "model_spec", "ModelSpec": "model_spec", "Mapping": "parallel", "Policy": "policy",
    "WarmupReport": "warmup", "WarmupShape": "warmup", "cuda_graph_batch_sizes": "warmup", "plan_warmup": "warmup",
    "embedded_models": "embedded", "load_spec": "embedded",
    "BlockCounts": "reuse", "KvCacheRetentionConfig": "reuse", "TokenRangeRetentionConfig": "reuse", "KvCacheStats": "reuse", "RequestReuseStats": "reuse",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static tools and IDEs see; nothing here runs
    from .config import BatchDesc, KVCacheDesc, KvCacheConfig
    from .deepseek_v4 import DeepseekV4CacheManager, DeepseekV4Spec
    from .errors import (BudgetExceededError, ConfigError, KvcmError, OutOfPagesError, UnknownRequestError,
                         UserCallbackError)
    from .estimation import Estimation, build_with_estimation
    from .factory import create_kv_cache_manager
    from .limits import MAX_BATCH_SIZE, Limits
    from .validation import MAX_LAYERS, MAX_SEQ_LEN
    from .dummies import DummyRequest
    from .manager_v1 import KVCacheManagerV1
    from .manager_v2 import KVCacheManagerV2
    from .model_spec import LayerSpec, ModelSpec
    from .parallel import Mapping
    from .policy import Policy
    from .embedded import embedded_models, load_spec
    from .reuse import BlockCounts, KvCacheRetentionConfig, KvCacheStats, RequestReuseStats
    from .warmup import WarmupReport, WarmupShape, cuda_graph_batch_sizes, plan_warmup
