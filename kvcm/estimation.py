"""Memory estimation as engines do it: a temporary estimation cache, then the final cache.

The estimation cache is built with ``avg_seq_len = max_seq_len``, no pool ratio and a budget of ``fraction * free
memory`` (or the user's ``max_gpu_total_bytes`` when smaller);
warmup runs on it, it is released, and the final cache is built from the user's config. An ordinary model's
estimation cache must stay inside its budget: constraint floors that do not fit raise ``BudgetExceededError``
instead of growing the pool (docs/semantics.md 6).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable

import torch

from . import seams
from .deprecation import renamed_keywords
from .errors import BudgetExceededError
from .factory import create_kv_cache_manager
from .limits import Limits
from .warmup import WarmupReport, plan_warmup


@dataclass
class Estimation:
    estimation: dict  # the estimation cache as described by ``describe()`` (the manager itself is released)
    manager: object  # the final manager
    warmups: list[WarmupReport]


def estimation_config(kv_cache_config):
    """The temporary cache's config, as TensorRT-LLM's ``KvCacheCreator.try_prepare_estimation`` rewrites it
    (``seams.estimation_overrides``): no ``pool_ratio`` (a user's ratio could starve the cache warmup needs),
    the budget ``min(fraction x free memory, max_gpu_total_bytes)``, the user's ``max_tokens`` as a cap; the
    callers set ``avg_seq_len = max_seq_len``. ``configure_kv_cache_capacity`` gives the final cache the user's
    fields back, which here is simply the user's own config."""
    return kv_cache_config.replace(**seams.estimation_overrides(kv_cache_config))


def engine_estimation_config(kv_cache_config, max_seq_len: int, device):
    """What an engine builds its estimation cache from: the estimation config on a device whose free memory
    the budget comes from; on the CPU (whose "free memory" is the host's) the user's own config."""
    if torch.device(device).type == "cpu":
        return kv_cache_config
    return estimation_config(kv_cache_config).replace(avg_seq_len=max_seq_len)


def release_device_memory() -> None:
    """Hand freed cache pages back to the device, so the final cache is sized from what is really free."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def estimate(make_manager: Callable, est_config, *, warm: Callable | None = None) -> tuple[dict, WarmupReport | None]:
    """The one estimation path (``kvcm plan`` and the engine, plain or speculative, target or draft): build the
    temporary cache with ``make_manager(est_config)``, warm it up (``warm(manager) -> WarmupReport``), describe
    it and release it. Everything that references it lives in this call."""
    temp = make_manager(est_config)
    if temp.pool_bytes > temp.budget_bytes:  # split_quota guarantees this; a patched manager must not slip by
        raise BudgetExceededError("estimation pool", temp.pool_bytes, temp.budget_bytes)
    report = warm(temp) if warm is not None else None
    described = temp.describe()
    del temp
    release_device_memory()
    return described, report


@renamed_keywords(version="kvcm_version")
def build_with_estimation(kvcm_version: str, model, kv_cache_config, limits: Limits | None = None, *,
                          warmup: bool = True, batch_sizes=None, draft_lens=None, two_model: bool = False,
                          free_memory_bytes: int | None = None, mapping=None, pp_rank: int = 0,
                          **limit_fields) -> Estimation:
    """Estimation cache, then final cache, each with the warmup plan (no forwards: the manager alone); with
    ``mapping``, both are one rank's of pipeline stage ``pp_rank``."""
    limits = Limits.of(limits, **limit_fields)

    def make(cfg):
        return create_kv_cache_manager(kvcm_version, model, cfg, limits, free_memory_bytes=free_memory_bytes,
                                       mapping=mapping, pp_rank=pp_rank)

    def warm(cache):
        return lambda mgr: plan_warmup(mgr, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model,
                                       cache=cache)

    est_cfg = estimation_config(kv_cache_config).replace(avg_seq_len=limits.max_seq_len)
    described, report = estimate(make, est_cfg, warm=warm("estimation") if warmup else None)
    final = make(seams.final_cache_config(kv_cache_config, described, report))
    warmups = [report, warm("final")(final)] if warmup else []
    return Estimation(described, final, warmups)
