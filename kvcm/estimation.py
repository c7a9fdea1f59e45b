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

from . import versions
from .deprecation import renamed_keywords
from .errors import BudgetExceededError
from .factory import create_kv_cache_manager
from .limits import Limits
from .policy import Decisions, resolve, rule, setting
from .warmup import WarmupReport, plan_warmup


@dataclass
class Estimation:
    estimation: dict  # the estimation cache as described by ``describe()`` (the manager itself is released)
    manager: object  # the final manager
    warmups: list[WarmupReport]


def estimation_config(kv_cache_config, policy=None):
    """The temporary cache's config, as TensorRT-LLM's ``KvCacheCreator.try_prepare_estimation`` rewrites it
    (the policy's ``estimation_overrides``; None: the active policy): no ``pool_ratio`` (a user's ratio could
    starve the cache warmup needs),
    the budget ``min(fraction x free memory, max_gpu_total_bytes)``, the user's ``max_tokens`` as a cap; the
    callers set ``avg_seq_len = max_seq_len``. ``configure_kv_cache_capacity`` gives the final cache the user's
    fields back, which here is simply the user's own config."""
    return kv_cache_config.replace(**resolve(policy).estimation_overrides(kv_cache_config))


def engine_estimation_config(kv_cache_config, max_seq_len: int, device, policy=None):
    """What an engine builds its estimation cache from: the estimation config on a device whose free memory
    the budget comes from; on the CPU (whose "free memory" is the host's) the user's own config."""
    if torch.device(device).type == "cpu":
        return kv_cache_config
    return estimation_config(kv_cache_config, policy).replace(avg_seq_len=max_seq_len)


def final_cache_config(kv_cache_config, estimation: dict | None, report, policy=None):
    """The final cache's config once the estimation cache is described and released: the user's own, unless the
    policy's ``final_max_tokens_from_estimation`` caps ``max_tokens`` by the estimation run's largest dummy
    workload on a version of TensorRT-LLM's estimation path (TensorRT-LLM PR #15881 removed that cap for V2)."""
    if (not resolve(policy).final_max_tokens_from_estimation or estimation is None or report is None
            or not versions.get(estimation["kvcm_version"]).cls.trtllm_estimation_path or not report.long_token_nums):
        return kv_cache_config
    tokens = max(t + (s.batch_size - 1) * (1 + s.draft_len) for s, t in report.long_token_nums.items())
    return kv_cache_config.replace(max_tokens=min(tokens, kv_cache_config.max_tokens or tokens))


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
                          free_memory_bytes: int | None = None, mapping=None, pp_rank: int = 0, policy=None,
                          **limit_fields) -> Estimation:
    """Estimation cache, then final cache, each with the warmup plan (no forwards: the manager alone); with
    ``mapping``, both are one rank's of pipeline stage ``pp_rank``; ``policy``: both caches' decisions (None: the
    active ones)."""
    limits = Limits.of(limits, **limit_fields)
    policy = resolve(policy)

    def make(cfg):
        return create_kv_cache_manager(kvcm_version, model, cfg, limits, free_memory_bytes=free_memory_bytes,
                                       mapping=mapping, pp_rank=pp_rank, policy=policy)

    def warm(cache):
        return lambda mgr: plan_warmup(mgr, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model,
                                       cache=cache)

    est_cfg = estimation_config(kv_cache_config, policy).replace(avg_seq_len=limits.max_seq_len)
    described, report = estimate(make, est_cfg, warm=warm("estimation") if warmup else None)
    final = make(final_cache_config(kv_cache_config, described, report, policy))
    warmups = [report, warm("final")(final)] if warmup else []
    return Estimation(described, final, warmups)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class EstimationDecisions(Decisions):
    SUBSYSTEM = "estimation"

    @rule("the config fields the estimation cache changes (TensorRT-LLM _util.py try_prepare_estimation): "
          "pool_ratio dropped, the byte budget min(fraction x free, max_gpu_total_bytes), max_tokens kept as a cap; "
          "avg_seq_len is set to max_seq_len by the caller. Keeping the user's ratio or ignoring the user's byte "
          "cap sized the temporary cache from other constraints and another budget than upstream's")
    def estimation_overrides(kv_cache_config) -> dict:
        return {"pool_ratio": None, "avg_seq_len": None, "free_gpu_memory_fraction": kv_cache_config.fraction,
                "max_gpu_total_bytes": kv_cache_config.max_gpu_total_bytes, "max_tokens": kv_cache_config.max_tokens}

    final_max_tokens_from_estimation = setting(
        False, "whether the final cache (built once the estimation cache is described and released) takes the "
        "estimation run's largest dummy workload as its max_tokens, on a version of TensorRT-LLM's estimation path: "
        "no, its config is the user's own (TensorRT-LLM PR #15881: PR #15091 did so for V2 too, the real pool was "
        "capped and a DeepSeek-V4 context server hung at startup)")
