"""``create_kv_cache_manager``: the manager of ``kvcm_version`` (``kvcm.versions``), or DeepSeek-V4's, as engines' configs pick."""

from __future__ import annotations

from .deepseek_v4 import DeepseekV4Spec
from .deprecation import renamed_keywords
from .errors import ConfigError
from .limits import Limits
from . import versions


def resolve_kvcm_version(kvcm_version: str, model) -> str:
    """``auto`` is the model's declared preference, ``versions.DEFAULT`` where none is declared; DeepSeek-V4 takes
    the version that serves it (V2-based)."""
    if kvcm_version not in versions.FACTORY_CHOICES:
        raise ConfigError("kvcm_version", kvcm_version, f"one of {versions.FACTORY_CHOICES}")
    if isinstance(model, DeepseekV4Spec):
        serving = versions.serving_deepseek_v4()
        if kvcm_version != versions.AUTO and kvcm_version not in serving:
            raise ConfigError("kvcm_version", kvcm_version,
                              f"DeepSeek-V4's cache is V2-based; use one of {(*serving, versions.AUTO)}")
        return serving[0]
    if kvcm_version == versions.AUTO:
        return getattr(model, "preferred_manager", None) or versions.DEFAULT
    return kvcm_version


@renamed_keywords(version="kvcm_version")
def create_kv_cache_manager(kvcm_version: str, model, kv_cache_config=None, limits: Limits | None = None, *,
                            free_memory_bytes: int | None = None, mapping=None, pp_rank: int = 0, policy=None,
                            **limit_fields):
    """A ``kvcm_version`` manager for ``model``, sized by ``kv_cache_config`` for ``limits`` (a ``kvcm.Limits``,
    or its fields as keywords: ``max_batch_size=64, max_seq_len=4096, ...``, as before ``Limits`` existed).
    ``version=`` is the deprecated spelling of ``kvcm_version=``. ``mapping`` (a ``kvcm.Mapping``) and ``pp_rank``:
    the cache of one rank of a parallel deployment (``kvcm.parallel``). ``policy``: the manager's decisions
    (a ``kvcm.policy.Policy``; None: the active one)."""
    resolved = resolve_kvcm_version(kvcm_version, model)
    limits = Limits.of(limits, **limit_fields)
    version = versions.get(resolved)
    cls = version.deepseek_v4.cls if isinstance(model, DeepseekV4Spec) else version.cls
    return cls(model, kv_cache_config, limits, free_memory_bytes=free_memory_bytes, mapping=mapping, pp_rank=pp_rank,
               policy=policy)
