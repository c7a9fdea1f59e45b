"""One byte budget for a target's and a draft's KV caches, restated from TensorRT-LLM's
``tensorrt_llm/_torch/pyexecutor/_util.py`` (``KvCacheCreator._compute_draft_budget_shares``,
``_needs_gpu_kv_cache_budget_split``, ``build_managers``) and its test
``tests/unittest/_torch/executor/test_kv_cache_budget_split.py`` (docs/semantics.md 7 and 10).
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.draft_budget import split_draft_budget, trtllm_splits_gpu_budget
from kvcm.model_spec import ModelSpec

from _build import GiB


def _specs(target_bytes: int, draft_bytes: int):
    """Two models whose tokens take ``target_bytes`` and ``draft_bytes`` (one bf16 layer, K and V)."""
    return (ModelSpec.uniform(1, 1, target_bytes // 4, name="target"),
            ModelSpec.uniform(1, 1, draft_bytes // 4, name="draft"))


@pytest.mark.upstream("test_gpu_budget_split_proportionally")
def test_gpu_budget_split_proportionally():
    """``test_gpu_budget_split_proportionally``: 10 GiB, 100 bytes a token in all, 80 of them the target's:
    8 GiB for the target, 2 GiB for the draft, and the two add up to the budget."""
    target, draft = _specs(80, 20)
    t_cfg, d_cfg = split_draft_budget(kvcm.KvCacheConfig(max_gpu_total_bytes=10 * GiB), target, draft)
    assert (t_cfg.max_gpu_total_bytes, d_cfg.max_gpu_total_bytes) == (8 * GiB, 2 * GiB)


@pytest.mark.parametrize("total", [10, 1001, 15 * GiB + 7])
@pytest.mark.upstream("test_budgets_sum_to_original_with_gpu_and_host")
def test_the_drafts_share_is_rounded_down(total):
    """``_compute_draft_budget_shares``: ``draft = budget * draft_slope // slope_total``, ``target = budget - draft``
    (``test_budgets_sum_to_original_with_gpu_and_host``: the shares add up). Target 8 bytes a token, draft 4: of
    10 bytes the draft gets 3 and the target 7, where flooring the target's share gave 6 and 4."""
    target, draft = _specs(8, 4)
    t_cfg, d_cfg = split_draft_budget(kvcm.KvCacheConfig(max_gpu_total_bytes=total), target, draft)
    assert d_cfg.max_gpu_total_bytes == total * 4 // 12
    assert t_cfg.max_gpu_total_bytes + d_cfg.max_gpu_total_bytes == total


@pytest.mark.parametrize("kvcm_version, separate_engine, vswa, estimating, splits", [
    ("v2", False, False, False, True),    # one-model draft with its own cache (EAGLE3/MTP, PR #12188)
    ("v2", True, False, False, False),    # two-model: "GPU budgets are not" divided, asserted equal
    ("v1", True, True, False, True),      # V1 with variable windows sizes from max_gpu_total_bytes (PR #12855)
    ("v1", True, False, False, False),    # V1 otherwise: one shared max_tokens sizes both
    ("v2", False, False, True, False),    # estimation never splits the GPU budget
])
def test_when_tensorrt_llm_splits_the_gpu_budget(kvcm_version, separate_engine, vswa, estimating, splits):
    """``build_managers``: ``needs_gpu_split = not estimating_kv_cache and _needs_gpu_kv_cache_budget_split(...)``,
    which on V2 is ``_should_create_separate_draft_kv_cache()`` (one-engine speculation only) and on V1 whether
    the layout has variable windows. kvcm splits every final pair (docs/semantics.md 10)."""
    assert trtllm_splits_gpu_budget(kvcm_version, separate_draft_engine=separate_engine, vswa=vswa,
                                    estimating=estimating) is splits
