"""Memory estimation as engines do it: a temporary estimation cache, then the final cache.

The estimation cache is built with ``avg_seq_len = max_seq_len`` and a budget of ``fraction * free memory``;
warmup runs on it, it is released, and the final cache is built from the user's config. An ordinary model's
estimation cache must stay inside its budget: constraint floors that do not fit raise ``BudgetExceededError``
instead of growing the pool (SEMANTICS 6).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BudgetExceededError
from .factory import create_kv_cache_manager
from .warmup import WarmupReport, plan_warmup


@dataclass
class Estimation:
    estimation: dict  # the estimation cache as described by ``describe()`` (the manager itself is released)
    manager: object  # the final manager
    warmups: list[WarmupReport]


def estimation_config(kv_cache_config):
    """The temporary cache's config: the whole fraction of free memory, typical length = max_seq_len."""
    return kv_cache_config.replace(max_tokens=None, max_gpu_total_bytes=None,
                                   free_gpu_memory_fraction=kv_cache_config.fraction, avg_seq_len=None)


def build_with_estimation(version: str, model, kv_cache_config, *, warmup: bool = True, batch_sizes=None,
                          draft_lens=None, two_model: bool = False, **manager_kwargs) -> Estimation:
    est_cfg = estimation_config(kv_cache_config).replace(avg_seq_len=manager_kwargs["max_seq_len"])
    temp = create_kv_cache_manager(version, model, est_cfg, **manager_kwargs)
    if temp.pool_bytes > temp.budget_bytes:  # split_quota guarantees this; a patched manager must not slip by
        raise BudgetExceededError("estimation pool", temp.pool_bytes, temp.budget_bytes)
    warmups = []
    if warmup:
        warmups.append(plan_warmup(temp, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model,
                                   cache="estimation"))
    described = temp.describe()
    del temp
    final = create_kv_cache_manager(version, model, kv_cache_config, **manager_kwargs)
    if warmup:
        warmups.append(plan_warmup(final, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model))
    return Estimation(described, final, warmups)
