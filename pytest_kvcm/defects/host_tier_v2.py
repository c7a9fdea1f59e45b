"""The field's offload bugs, put back into V2's host level (``kvcm/reuse/host_level.py``, TensorRT-LLM
KVCacheManagerV2's cache levels) through its policy decisions: pages onboarded while being evicted, host blocks counted
twice, priorities lost on the way down, blocks left behind by a drop at the last level, and its ARC order adapting
by a fixed step (``kvcm/eviction/arc.py``).

Each is caught at two levels at least: the ported upstream cases (``suites/conformance/test_v2_host_tier.py``) and
the manager tests (``suites/managers/test_host_level.py``); the exhaustive explorer's V2 host configuration catches
the block on two levels too.
"""

from __future__ import annotations

from ._registry import defect

_CONF = "suites/conformance/test_v2_host_tier.py::"
_MGR = "suites/managers/test_host_level.py::"
_EXPLORER = ("suites/managers/exhaustive/test_exhaustive.py::"
             "test_explorer_finds_no_violation[v2-full-tpb2-b4-reuse_on-ids-r2-h2]")


@defect("v2-onboard-source-evicted", upstream="SGLang PR #27631 (a re-entrant evict_host freed pages being loaded: "
        "load_back NoneType); TensorRT-LLM kv_cache_manager_v2 _page.py batched_lock_to_gpu excludes the pages from "
        "eviction before prepare_free_slots",
        story="a hit on a host page needed a GPU slot, the page that slot pushed down needed room on the full host, "
              "and the host evicted the very page being migrated: the hit read a freed slot",
        catchers=(_MGR + "test_a_page_being_migrated_back_is_never_the_hosts_victim",
                  _CONF + "test_hits_served_from_a_full_host_are_attributed_to_host"))
def v2_onboard_source_evicted():
    return {"onboard_source_protected": False}


@defect("v2-offload-loses-priority", upstream="TensorRT-LLM kv_cache_manager_v2 _storage_manager.py _batched_migrate "
        "(the page keeps its _priority and is scheduled for eviction under it at the destination level); the "
        "brief's 'priorities lost on the way down'",
        story="a page that fell to the host level waited there at the default priority: once the host filled, a "
              "long-kept system prompt was dropped before one-off answers",
        catchers=(_CONF + "test_an_offloaded_page_keeps_its_priority_on_the_host_level",
                  _MGR + "test_the_host_level_evicts_its_lowest_priority_first"))
def v2_offload_loses_priority():
    return {"offload_keeps_priority": False}     # at the default priority, 35


@defect("v2-stored-block-on-both-levels", upstream="TensorRT-LLM kv_cache_manager_v2 _block_radix_tree.py "
        "Block.storage (one page a life cycle) and can_replace_page (an equal coverage does not replace); the "
        "brief's 'host blocks counted twice'",
        story="a request committing a block whose cached copy had fallen to the host filed its GPU page beside the "
              "host one: the block counted on both levels, and the host page was never freed with it",
        catchers=(_MGR + "test_a_block_committed_again_while_its_copy_is_on_the_host_stays_on_one_level",
                  _CONF + "test_a_block_holds_one_page_whatever_its_level", _EXPLORER))
def v2_stored_block_on_both_levels():
    return {"store_beside_host_copy": True}


@defect("v2-host-drop-keeps-descendants", upstream="TensorRT-LLM kv_cache_manager_v2 _block_radix_tree.py "
        "Block.clear_stale_blocks_after_page_unlink (remove_subtree for full attention); SGLang PR #9601 / #5499 "
        "(host pages leaked by nodes evict could no longer reach)",
        story="the host dropped a full-attention block but kept its descendants: unreachable blocks held host pages "
              "and counted as cached until the LRU found them",
        catchers=(_MGR + "test_a_dropped_full_attention_block_takes_its_descendants_from_the_host",
                  _CONF + "test_tip_with_no_live_page_anywhere_is_pruned"))
def v2_host_drop_keeps_descendants():
    return {"host_drop_takes_descendants": False}


@defect("v2-offload-counted-on-both-levels", upstream="TensorRT-LLM PR #12834 / PR #12297 (issue #11879: free > max, "
        "used < 0 after a block moved between levels)",
        story="a page that fell to the host level stayed counted as reusable on the GPU as well: the GPU level's "
              "counts no longer added up to its pool",
        catchers=(_MGR + "test_offloads_keep_each_level_counted_once",
                  _CONF + "test_offload_is_recorded_for_every_life_cycle"))
def v2_offload_counted_on_both_levels():
    return {"tier_counts_after_offload": lambda gpu, host: (gpu, host + 1)}


_ARC = "suites/conformance/test_v2_host_arc.py::test_kvcm_arc_matches_vllm_arc"


@defect("arc-ghost-step-fixed", upstream="vLLM vllm/v1/kv_offload/cpu/policies/arc.py "
        "ARCCachePolicy._adapt_to_ghost_hit (delta = max(1, len(b2) / len(b1)) on a B1 hit, max(1, len(b1) / "
        "len(b2)) on a B2 hit), after Megiddo and Modha's ARC (FAST '03, Fig. 4)",
        story="V2's host level with host_eviction_policy='arc' moved T1's target one page per ghost hit whatever "
              "the ghost lists held: ARC learned slowest exactly when one ghost list was the longer, and kept "
              "evicting the partition the workload was coming back to",
        catchers=(_ARC + "[fractional_target]", _ARC + "[b2_hit_lowers_the_target_by_the_ghost_ratio]"))
def arc_ghost_step_fixed():
    return {"arc_ghost_step": lambda hit_ghosts, other_ghosts: 1}
