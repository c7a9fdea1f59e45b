"""One memory budget for a target's and a draft model's KV caches (speculative decoding with two managers).

A byte budget (``max_gpu_total_bytes`` and/or ``free_gpu_memory_fraction`` of free memory) is what the user
gives the engine, not each cache: it is split between target and draft in proportion to their KV bytes per
token, so both hold the same number of tokens (every sequence needs KV in both, up to the same length). The
field's bug was each manager claiming the whole budget, twice the memory asked for (TensorRT-LLM PR #12188,
"both managers independently claim the full max_gpu_total_bytes budget"; fixed by a proportional split of the
final caches, the estimation cache unchanged). A token budget (``max_tokens`` alone) already means the same
for both caches and is left as it is. The draft's share is rounded down and the target keeps the rest, as
``KvCacheCreator._compute_draft_budget_shares`` does.
"""
from __future__ import annotations

from . import versions
from .config import KvCacheConfig
from .errors import ConfigError
from .policy import Decisions, resolve, rule


def _bytes_per_token(spec, cfg: KvCacheConfig) -> int:
    return (spec if cfg.dtype == "auto" else spec.with_dtype(cfg.dtype)).bytes_per_token()


def total_budget_bytes(cfg: KvCacheConfig, free_memory_bytes: int | None) -> int | None:
    """The byte budget the config sets (the smallest of its byte limits), or None for a token budget only."""
    out = []
    if cfg.max_gpu_total_bytes is not None:
        out.append(cfg.max_gpu_total_bytes)
    if cfg.free_gpu_memory_fraction is not None or (cfg.max_tokens is None and cfg.max_gpu_total_bytes is None):
        if free_memory_bytes is None:
            raise ConfigError("free_memory_bytes", None, "is required to split a free_gpu_memory_fraction budget "
                                                         "between target and draft caches")
        out.append(int(cfg.fraction * free_memory_bytes))
    return min(out) if out else None


def split_draft_budget(cfg: KvCacheConfig, target_spec, draft_spec, *, free_memory_bytes: int | None = None,
                       policy=None) -> tuple[KvCacheConfig, KvCacheConfig]:
    """``(target config, draft config)`` whose byte budgets add up to ``cfg``'s (``policy``: the engine's
    ``draft_budget_shares``; None, the active one)."""
    total = total_budget_bytes(cfg, free_memory_bytes)
    if total is None:
        return cfg, cfg
    target, draft = resolve(policy).draft_budget_shares(total, _bytes_per_token(target_spec, cfg),
                                              _bytes_per_token(draft_spec, cfg))
    return cfg.replace(max_gpu_total_bytes=target), cfg.replace(max_gpu_total_bytes=draft)


def trtllm_splits_gpu_budget(kvcm_version: str, *, separate_draft_engine: bool, vswa: bool = False,
                             estimating: bool = False) -> bool:
    """Whether TensorRT-LLM splits ``max_gpu_total_bytes`` between target and draft managers
    (``KvCacheCreator.build_managers`` / ``_needs_gpu_kv_cache_budget_split``): never while estimating; on V2 only
    for a one-model draft with its own cache (a two-model draft engine keeps the whole GPU budget, asserted
    equal); on V1 only when the layout has variable windows (otherwise one shared ``max_tokens`` sizes both,
    which holds the same tokens as this module's split). kvcm splits every final pair (docs/semantics.md 10)."""
    if estimating:
        return False
    return versions.get(kvcm_version).cls.trtllm_splits_draft_budget(separate_draft_engine=separate_draft_engine,
                                                                     vswa=vswa)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class DraftBudgetDecisions(Decisions):
    SUBSYSTEM = "draft budget"

    @rule("the byte budget's split between a target's and a draft model's caches: in proportion to their KV bytes "
          "per token, so both hold as many tokens (TensorRT-LLM PR #12188: each claimed the whole budget); the "
          "draft's share rounded down, the target keeping the rest (_util.py _compute_draft_budget_shares: "
          "slope_budget * draft_slope // slope_total); rounding the target's down instead gave the draft a byte, at "
          "a block boundary a block, more")
    def draft_budget_shares(total: int, target_bytes_per_token: int, draft_bytes_per_token: int) -> tuple[int, int]:
        draft = total * draft_bytes_per_token // (target_bytes_per_token + draft_bytes_per_token)
        return total - draft, draft
