"""Bugs at the edge of a small pool with block reuse on (issue 39): what a manager promises it can allocate, and
what a refused call leaves behind. Each replaces one decision of ``kvcm.policy``; the catchers replay the sequences the
exhaustive explorer and a user found (``suites/managers/test_window_reuse_edge.py``) and the explorer itself."""

from __future__ import annotations

from ._registry import defect

_EDGE = "suites/managers/test_window_reuse_edge.py::"
_EXPLORER = "suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"



@defect("reuse-evicts-leaves-only", upstream="TensorRT-LLM kvCacheManager.cpp WindowBlockManager::getFreeBlock "
        "(freeBlockAndAllDescendants, detachDescendantsFromLookupTree; PR #13571 / #13572 tested that path); "
        "kvcm issue 39",
        story="a cached block nobody held but with a held block below it counted as available and could not be "
              "evicted: V1 with a window and reuse raised RuntimeError from the block pool after one group had "
              "taken a page, a decode then ran past its pages, free raised IndexError and a block leaked",
        catchers=(_EDGE + "test_admission_at_the_edge_evicts_or_refuses_cleanly",
                  _EDGE + "test_decodes_at_the_edge_stay_within_their_pages",
                  _EDGE + "test_reuse_on_and_off_answer_the_same_calls_the_same",
                  _EXPLORER + "[v1-full+window-tpb2-b4-reuse_on-ids-r2]"))
def reuse_evicts_leaves_only():
    return {"evict_with_descendants": False}


@defect("refused-first-chunk-locks-the-match", upstream="TensorRT-LLM V2 _KVCache resume (a suspended cache's pages "
        "are HELD until it resumes); docs/semantics.md 11.2; kvcm issue 39",
        story="a request made by add_sequence whose first context chunk was refused turned its matched pages from "
              "HELD to LOCKED, so a refused call changed the page states an engine's scheduler reads",
        catchers=(_EDGE + "test_v2_refused_first_chunk_leaves_the_match_held",
                  _EDGE + "test_refused_first_chunk_changes_nothing_observable"))
def refused_first_chunk_locks_the_match():
    return {"refused_chunk_restores_started": False}


@defect("refused-dummy-batch-evicts", upstream="kvcm issue 39 (found by the exhaustive explorer); TensorRT-LLM PR "
        "#17162 fixed the dummies such a batch leaked, not the cached blocks it evicted",
        story="a warmup batch that could not fit placed its first dummies by evicting cached blocks, then was "
              "refused: the dummies were released, the evicted prefix was gone",
        catchers=(_EDGE + "test_refused_dummy_batch_evicts_no_cached_block",
                  _EXPLORER + "[v2-full-tpb2-b4-reuse_copy-ids-r2]",
                  _EXPLORER + "[v1-full-tpb2-b4-reuse_on-ids-r2]"))
def refused_dummy_batch_evicts():
    return {"dummy_batch_checked_first": False}
