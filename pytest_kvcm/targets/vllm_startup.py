"""vLLM's own start-up check behind the contract: ``check_enough_kv_cache_memory`` on a real ``VllmConfig``.

The engine calls it once, with the memory the KV cache may take, before it sizes the pool; it raises
``ValueError`` when one request of ``max_model_len`` does not fit. Here the memory is that of a pool of
``spec.num_pages`` blocks (``num_pages * page_size_bytes``, one layer per group, as vLLM's own pool of that many
blocks takes), and the per-request need is vLLM's ``max_memory_usage_bytes`` of each ``KVCacheSpec``: so the
verdict is vLLM's arithmetic, release by release (0.28.0 still compares with the total block count, vLLM PR
#47272; 0.29.0 on subtracts the null block's bytes first).

No model is loaded: ``VllmConfig`` is built from a ``SchedulerConfig`` (``max_num_batched_tokens``,
``async_scheduling``), and its ``model_config`` slot is a namespace carrying ``max_model_len``, the one field the
check and ``max_memory_usage_bytes`` read from it.
"""

from __future__ import annotations

import inspect
import os
import types

from .contract import PoolSpec


def _config(spec: PoolSpec, max_num_batched_tokens: int, async_scheduling: bool):
    # the V1 model runner, the one the V1 KVCacheManager under test serves (and the one CPU builds fall back to);
    # deciding it otherwise reads model fields this config has not got
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    from vllm.config import SchedulerConfig, VllmConfig

    wanted = dict(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=spec.max_batch_size,
                  max_model_len=spec.max_model_len, async_scheduling=async_scheduling, is_encoder_decoder=False)
    params = inspect.signature(SchedulerConfig).parameters
    config = VllmConfig(scheduler_config=SchedulerConfig(**{k: v for k, v in wanted.items() if k in params}))
    # the scheduler config may have normalised the flag; the check must see the one asked for
    object.__setattr__(config.scheduler_config, "async_scheduling", async_scheduling)
    object.__setattr__(config, "model_config", types.SimpleNamespace(max_model_len=spec.max_model_len,
                                                                   is_diffusion=False))
    if hasattr(config.cache_config, "kv_cache_layout") and config.cache_config.kv_cache_layout is None:
        from vllm.v1.kv_cache_layout import KVCacheLayout

        config.cache_config.kv_cache_layout = next(iter(KVCacheLayout)).name  # resolved by the engine core
    return config


def startup_accepts(target, spec: PoolSpec, max_num_batched_tokens: int, async_scheduling: bool = False) -> bool:
    """vLLM's verdict on ``spec``: True when ``check_enough_kv_cache_memory`` lets the engine start."""
    import vllm.v1.core.kv_cache_utils as utils

    specs = {name: group.kv_cache_spec for group in target.manager.kv_cache_config.kv_cache_groups
             for name in group.layer_names}
    page_bytes = max(s.page_size_bytes for s in specs.values())
    config = _config(spec, max_num_batched_tokens, async_scheduling)
    try:
        utils.check_enough_kv_cache_memory(config, specs, spec.num_pages * page_bytes)
    except ValueError as exc:
        target.last_startup_error = str(exc)
        return False
    return True
