"""SGLang's start-up decision behind the contract (the SGLang release declared.py pins).

SGLang sizes its pools from memory, then decides what it can serve:

* the pool configurator turns ``max_total_num_tokens`` into pool sizes (``calculate_pool_sizes_from_max_tokens``):
  page-aligned for a full-attention model (``DefaultPoolConfigurator``), and for a sliding-window model
  (``HybridSWAPoolConfigurator``) a full pool of that size beside an SWA pool of
  ``int(full_tokens * swa_full_tokens_ratio)``, refused by ``validate_swa_pool_size`` (``ValueError``) when the
  SWA pool cannot hold one request's window: ``sliding_window_size + page_size >= swa_tokens``;
* the worker then caps every request at ``max_req_len = min(context_len - 1, kv_capacity - 1)``
  (``TpModelWorker.get_worker_info``, ``kv_capacity`` the full pool's tokens) and, when
  ``kv_capacity < context_len``, starts anyway with a warning that a full-length request cannot fit. That
  condition is the verdict here: below it the engine does not serve ``max_model_len`` (it refuses or truncates).

The configurators are SGLang's own classes, built without a model (``object.__new__`` and the attributes their
``__init__`` derives from the model config: layer counts, the ratio, the window, the page size); the
``context_len`` comparison is the one line of ``get_worker_info`` that decides, since the worker itself needs a
loaded model. ``sliding_window_size`` is the window without the token itself (``W - 1``), as the model reports it.
"""

from __future__ import annotations

from .contract import PoolSpec

CAPACITY_WARNING = ("KV pool holds {kv} tokens, fewer than --context-length {ctx}. One full-length request cannot "
                    "fit, so long requests will be refused or truncated at serving time.")


def _configurator(spec: PoolSpec):
    from sglang.srt.model_executor import pool_configurator as pc

    if spec.sliding_window is None:
        return object.__new__(pc.DefaultPoolConfigurator)
    from .sglang_target import SWA_FULL_TOKENS_RATIO

    full_tokens, window_pages = spec.num_pages * spec.page_size, spec.window_pages
    ratio = SWA_FULL_TOKENS_RATIO if window_pages is None else (window_pages * spec.page_size + 0.5) / full_tokens
    if not 0 < ratio <= 1.0:
        raise ValueError(f"window_pages={window_pages} must be at most num_pages={spec.num_pages} "
                         f"(--swa-full-tokens-ratio should be in range (0, 1.0])")
    cfg = object.__new__(pc.HybridSWAPoolConfigurator)
    cfg._full_layers_num = 1
    cfg._swa_full_tokens_ratio = ratio
    cfg._sliding_window_size = spec.sliding_window - 1
    cfg._page_size = spec.page_size
    cfg._enable_unified_memory = False
    return cfg


def pool_sizes(spec: PoolSpec):
    """SGLang's ``MemoryPoolConfig`` for ``spec.num_pages`` full pages and ``spec.window_pages`` SWA pages (None:
    SGLang's default ratio), raising as SGLang does."""
    cfg = _configurator(spec)
    return cfg.calculate_pool_sizes_from_max_tokens(spec.num_pages * spec.page_size, spec.page_size)


def startup_accepts(target, spec: PoolSpec, max_num_batched_tokens: int) -> bool:
    """True when SGLang starts on ``spec`` committed to serving a ``max_model_len`` request; the chunk size does
    not enter SGLang's rule (its chunks are page-aligned; an extend longer than the window stores its tail)."""
    try:
        config = pool_sizes(spec)
    except (ValueError, RuntimeError) as exc:
        target.last_startup_error = str(exc)
        return False
    kv_capacity = config.max_total_num_tokens
    if kv_capacity < spec.max_model_len:
        target.last_startup_error = CAPACITY_WARNING.format(kv=kv_capacity, ctx=spec.max_model_len)
        return False
    return True
