"""``create_kv_cache_manager``: pick V1, V2 or DeepSeek-V4 by ``kvcm_version``, as engines' configs do."""

from __future__ import annotations

from .deepseek_v4 import DeepseekV4CacheManager, DeepseekV4Spec
from .deprecation import renamed_keywords
from .errors import ConfigError
from .limits import Limits
from .manager_v1 import KVCacheManagerV1
from .manager_v2 import KVCacheManagerV2

VERSIONS = ("v1", "v2", "auto")
DEFAULT_VERSION = "v1"  # what ``auto`` picks for a model that declares no preference


def resolve_kvcm_version(kvcm_version: str, model) -> str:
    """``auto`` is the model's declared preference, V1 where none is declared; DeepSeek-V4 is always V2-based."""
    if kvcm_version not in VERSIONS:
        raise ConfigError("kvcm_version", kvcm_version, f"one of {VERSIONS}")
    if isinstance(model, DeepseekV4Spec):
        if kvcm_version == "v1":
            raise ConfigError("kvcm_version", kvcm_version, "DeepSeek-V4's cache is V2-based; use 'v2' or 'auto'")
        return "v2"
    if kvcm_version == "auto":
        return getattr(model, "preferred_manager", None) or DEFAULT_VERSION
    return kvcm_version


@renamed_keywords(version="kvcm_version")
def create_kv_cache_manager(kvcm_version: str, model, kv_cache_config=None, limits: Limits | None = None, *,
                            free_memory_bytes: int | None = None, mapping=None, pp_rank: int = 0, **limit_fields):
    """A ``kvcm_version`` manager for ``model``, sized by ``kv_cache_config`` for ``limits`` (a ``kvcm.Limits``,
    or its fields as keywords: ``max_batch_size=64, max_seq_len=4096, ...``, as before ``Limits`` existed).
    ``version=`` is the deprecated spelling of ``kvcm_version=``. ``mapping`` (a ``kvcm.Mapping``) and ``pp_rank``:
    the cache of one rank of a parallel deployment (``kvcm.parallel``)."""
    resolved = resolve_kvcm_version(kvcm_version, model)
    limits = Limits.of(limits, **limit_fields)
    if isinstance(model, DeepseekV4Spec):
        return DeepseekV4CacheManager(model, kv_cache_config, limits, free_memory_bytes=free_memory_bytes,
                                      mapping=mapping, pp_rank=pp_rank)
    cls = KVCacheManagerV1 if resolved == "v1" else KVCacheManagerV2
    return cls(model, kv_cache_config, limits, free_memory_bytes=free_memory_bytes, mapping=mapping, pp_rank=pp_rank)
