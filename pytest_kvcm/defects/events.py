"""The field's KV cache event bugs, put back into kvcm's events (``kvcm/events/``) through their decisions
(``EventDecisions`` in ``kvcm/events/emitter.py``, ``QueueDecisions`` in ``queue.py``): removals not sent, sent for
the wrong group, or batched out of order. Each leaves a KV-aware router's index (NVIDIA Dynamo's, llm-d's)
disagreeing with the blocks the worker would match.

Each is caught at two levels at least: the ported event cases (``suites/conformance/test_v1_kv_events.py``,
``test_v2_kv_events.py``) and the manager-level ones (``suites/managers/test_kv_events.py``), the event-consistency
contract on kvcm's targets (``pytest_kvcm/contract/test_target_events.py``) or the exhaustive explorer's event
configurations, which check a router's index after every call (the quick pre-merge budget finds all but the
descendants; a removal batched past later stores needs several calls between two reads, which the explorer,
reading after each, never has).
"""

from __future__ import annotations

from ._registry import defect

_CONTRACT = "pytest_kvcm/contract/test_target_events.py::"
_V1 = "suites/conformance/test_v1_kv_events.py::"
_MANAGER = "suites/managers/test_kv_events.py::"
_EXPLORER = "suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"


@defect("removed-events-miss-descendants", upstream="TensorRT-LLM PR #16335 (blockInRadixTree() tested the parent, "
        "so descendants of an evicted ancestor were detached without removed events)",
        story="an eviction that took a cached block with its cached descendants announced only the block: a router "
              "kept routing to a prefix's later blocks the worker no longer held",
        catchers=(_V1 + "test_eviction_announces_the_descendants_it_detaches",
                  _MANAGER + "test_an_eviction_announces_the_descendants_it_takes_in_every_group",
                  _EXPLORER + "[v1-full+window-tpb2-b4-reuse_copy-ids-r2-ev64]"))
def removed_events_miss_descendants():
    return {"removed_event_for_descendants": False}


@defect("in-place-take-unannounced", upstream="TensorRT-LLM kvCacheManager.cpp loadOrAllocateBlocks (a partly "
        "matched unreferenced leaf is taken over with freeLeafBlock and no removed event; "
        "KVCacheManagerEventStreamPriority counts the one stored event at release)",
        story="a request that took a cached partial block over in place wrote into it while routers still offered "
              "it as cached: until the request was released, every router's index held a block no request could match",
        catchers=(_V1 + "test_kv_cache_manager_event_stream_priority",
                  _EXPLORER + "[v1-full-tpb2-b4-reuse_partial-ids-r2-ev64]",
                  _EXPLORER + "[v1-full+window-tpb2-b4-reuse_copy-ids-r2-ev64]"))
def in_place_take_unannounced():
    return {"in_place_take_announced": False}


@defect("removal-drops-every-copy", upstream="vLLM PR #48933 (open: BlockRemoved carries no count of the copies of a "
        "hash that remain, so a consumer drops a hash another copy still serves); TensorRT-LLM V2's "
        "add_removed_life_cycle_event names the one layer group that lost a page",
        story="a block that left one layer group was announced removed from every group holding it: routers "
              "dropped the copies still cached in the other groups",
        catchers=("suites/conformance/test_v2_kv_events.py::"
                  "test_v2_a_sliding_page_evicted_alone_is_removed_from_its_group_only",
                  _CONTRACT + "test_events_follow_the_cache_through_reuse_eviction_and_reset",
                  _EXPLORER + "[v1-full+window-tpb2-b4-reuse_copy-ids-r2-ev64]",
                  _EXPLORER + "[v2-full+window-tpb2-b4-reuse_copy-ids-r2-ev64]"))
def removal_drops_every_copy():
    return {"removed_event_names_group": False}


@defect("removal-batched-past-stores", upstream="TensorRT-LLM PR #11883 (removal events must be processed before "
        "the storage events that follow them; removed events batched per window)",
        story="V1 joined a removal to the group's latest pending removed event even past later stored events: a "
              "block stored and evicted within one step reached routers as evicted, then stored",
        catchers=(_CONTRACT + "test_events_read_once_a_step",
                  "suites/conformance/test_v1_kv_events.py::test_removals_keep_their_place_among_stores"))
def removal_batched_past_stores():
    return {"removed_event_merge_scope": "latest_of_group"}
