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
    "BlockCounts": "reuse", "KvCacheRetentionConfig": "reuse", "TokenRangeRetentionConfig": "reuse",
    "KvCacheStats": "reuse", "RequestReuseStats": "reuse",
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


if TYPE_CHECKING:  # what static tools and IDEs see; nothing here runs ("X as X": an explicit re-export)
    from .config import BatchDesc as BatchDesc, KVCacheDesc as KVCacheDesc, KvCacheConfig as KvCacheConfig
    from .deepseek_v4 import DeepseekV4CacheManager as DeepseekV4CacheManager, DeepseekV4Spec as DeepseekV4Spec
    from .errors import (BudgetExceededError as BudgetExceededError, ConfigError as ConfigError,
                         KvcmError as KvcmError, OutOfPagesError as OutOfPagesError,
                         UnknownRequestError as UnknownRequestError, UserCallbackError as UserCallbackError)
    from .estimation import Estimation as Estimation, build_with_estimation as build_with_estimation
    from .factory import create_kv_cache_manager as create_kv_cache_manager
    from .limits import MAX_BATCH_SIZE as MAX_BATCH_SIZE, Limits as Limits
    from .validation import MAX_LAYERS as MAX_LAYERS, MAX_SEQ_LEN as MAX_SEQ_LEN
    from .dummies import DummyRequest as DummyRequest
    from .manager_v1 import KVCacheManagerV1 as KVCacheManagerV1
    from .manager_v2 import KVCacheManagerV2 as KVCacheManagerV2
    from .model_spec import LayerSpec as LayerSpec, ModelSpec as ModelSpec
    from .parallel import Mapping as Mapping
    from .policy import Policy as Policy
    from .embedded import embedded_models as embedded_models, load_spec as load_spec
    from .reuse import (BlockCounts as BlockCounts, KvCacheRetentionConfig as KvCacheRetentionConfig,
                        TokenRangeRetentionConfig as TokenRangeRetentionConfig, KvCacheStats as KvCacheStats,
                        RequestReuseStats as RequestReuseStats)
    from .warmup import (WarmupReport as WarmupReport, WarmupShape as WarmupShape,
                         cuda_graph_batch_sizes as cuda_graph_batch_sizes, plan_warmup as plan_warmup)
