"""KV cache manager bugs the field shipped in 2026 (multi-group hits, reuse keys, re-entrant eviction, stale links),
put back into kvcm's reuse cache through its decisions (``kvcm.policy``'s ``block reuse`` subsystem).

Each is caught at two levels at least: a manager test that replays the bug's shape (``suites/managers/
test_hit_reconciliation.py``, ``test_reuse_links.py``), a ported upstream case (``suites/conformance``) or the
exhaustive explorer, which checks after every call that each cached page is filed where a lookup reaches it,
that a scope no live request has lends no credit, and that every request's table matches its capacity.
Replacements are module-level functions, so a state the explorer's worker processes pickle can carry them.
"""

from __future__ import annotations

from ._registry import defect

_HITS = "suites/managers/test_hit_reconciliation.py::"
_LINKS = "suites/managers/test_reuse_links.py::"
_EXPLORER = "suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"


def first_full_group_only(group_is_full: tuple) -> tuple:
    """Only the first full-attention group's hit is cut to the reconciled length."""
    first = group_is_full.index(True) if True in group_is_full else 0
    return tuple(i == first for i in range(len(group_is_full)))


def untagged_scope(lora_task_id, cache_salt) -> tuple:
    """The scope's keys in one list, none saying where it came from."""
    return tuple(k for k in (lora_task_id, cache_salt) if k is not None)


@defect("hit-length-one-pass", upstream="vLLM PR #45614 / issue #43559 (the hybrid coordinator let groups "
        "disagree on the common hit); vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator."
        "find_longest_cache_hit (the fixed-point loop: any group that shortens the hit restarts the checks)",
        story="a hybrid hit was reconciled in one pass: the full group shortened it, the sliding group's window "
              "moved back over a block it had lost, and the request took an unwritten page for tokens counted "
              "as cached",
        catchers=(_HITS + "test_a_shorter_hit_moves_the_window_back_over_a_lost_block",
                  "suites/conformance/test_hybrid_hits.py::test_hybrid_hit_is_a_fixed_point_over_the_groups"))
def hit_length_one_pass():
    return {"hit_length_fixed_point": False}


@defect("group-hit-not-truncated", upstream="vLLM PR #52828 (only the first full-attention group was truncated to "
        "the reconciled hit: cache_hit_length=0 for Kimi K3 + DSpark) / PR #46281 (the hit length and a group's "
        "hit blocks disagreed under EAGLE, issue #43559)",
        story="a group that had cached more than the reconciled hit kept its longer hit: the request's table in "
              "that group ran past its capacity and held cached pages it was about to overwrite",
        catchers=(_HITS + "test_every_group_is_cut_to_the_reconciled_hit",
                  "suites/conformance/test_hybrid_hits.py::test_hybrid_hit_is_a_fixed_point_over_the_groups"))
def group_hit_not_truncated():
    return {"cut_to_reconciled_hit": first_full_group_only}


@defect("reuse-scope-keys-untagged", upstream="vLLM #44701 / PR #44706 (LoRA names and cache salts went untagged "
        "into one extra-keys list: LoRA 'X' and salt 'X' shared blocks); vLLM RFC #53194 (hits that should have "
        "been misses)",
        story="a request salted 7 was filed under the same key as LoRA task 7: it reused blocks computed with the "
              "adapter's weights",
        catchers=(_LINKS + "test_a_salt_and_a_lora_id_of_one_value_share_nothing",
                  "suites/conformance/test_reuse_scopes_and_holds.py::test_reuse_scopes_seed_distinct_keys",
                  _EXPLORER + "[v1-full-tpb2-b4-reuse_on-ids-r2-scopes]",
                  _EXPLORER + "[v2-full-tpb2-b4-reuse_on-ids-r2-scopes]"))
def reuse_scope_keys_untagged():
    return {"reuse_scope": untagged_scope}


@defect("hit-allocates-before-claiming", upstream="TensorRT-LLM kvCacheManager.cpp loadOrAllocateBlocks (claimBlock "
        "on each matched block before getFreeBlock for the rest); #17926 (the eviction walk detached the committing "
        "request's own blocks)",
        story="a hit took its fresh pages before claiming its matched blocks: the allocation evicted a block the hit "
              "was about to hold, and the request was handed a page that was no longer its prefix",
        catchers=(_HITS + "test_a_hit_never_evicts_its_own_match",
                  _EXPLORER + "[v2-full-tpb2-b3-reuse_on-ids-r2-h2]"))
def hit_allocates_before_claiming():
    return {"claim_match_first": False}


@defect("commit-onto-detached-prefix", upstream="TensorRT-LLM PR #18095 / PR #18610, issue #17926 (an eviction "
        "detached a live request's tree block; its next commit built on the detached prefix and segfaulted)",
        story="a request kept the blocks it had stored as its path; an eviction took them out of the tree, and its "
              "next commit filed new blocks below them, cached pages no lookup could reach",
        catchers=(_LINKS + "test_a_commit_after_its_prefix_was_evicted_files_under_the_root",
                  _EXPLORER + "[v1-full-tpb2-b4-reuse_on-ids-r2]"))
def commit_onto_detached_prefix():
    return {"recorded_path_checked": False}


@defect("detached-block-keeps-parent-link", upstream="TensorRT-LLM PR #16037 (nvbugs 6418912, in #16019: released "
        "detached blocks kept their mPrevBlockInSeq links and joined finished requests' chains)",
        story="a block taken out of the tree still named its parent, so a request's path looked filed where it was "
              "not and its next commit built on it",
        catchers=(_LINKS + "test_a_detached_block_names_no_parent",
                  _LINKS + "test_a_commit_after_its_prefix_was_evicted_files_under_the_root",
                  _EXPLORER + "[v1-full-tpb2-b4-reuse_on-ids-r2]"))
def detached_block_keeps_parent_link():
    return {"detached_node_unlinked": False}
