"""kvcm: exact, readable reference KV cache managers (V1, V2, DeepSeek-V4) on accounting-only or real pools."""

from .config import BatchDesc, KVCacheDesc, KvCacheConfig
from .deepseek_v4 import DeepseekV4CacheManager, DeepseekV4Spec
from .errors import BudgetExceededError, ConfigError, KvcmError, OutOfPagesError, UnknownRequestError
from .estimation import Estimation, build_with_estimation
from .factory import create_kv_cache_manager
from .manager import DummyRequest
from .manager_v1 import KVCacheManagerV1
from .manager_v2 import KVCacheManagerV2
from .model_spec import LayerSpec, ModelSpec
from .warmup import WarmupReport, WarmupShape, cuda_graph_batch_sizes, plan_warmup

__all__ = [
    "BatchDesc", "KVCacheDesc", "KvCacheConfig", "DeepseekV4CacheManager", "DeepseekV4Spec", "BudgetExceededError",
    "ConfigError", "KvcmError", "OutOfPagesError", "UnknownRequestError", "Estimation", "build_with_estimation",
    "create_kv_cache_manager", "DummyRequest", "KVCacheManagerV1", "KVCacheManagerV2", "LayerSpec", "ModelSpec",
    "WarmupReport", "WarmupShape", "cuda_graph_batch_sizes", "plan_warmup",
]
