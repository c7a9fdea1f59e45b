"""KV cache events (``kvcm/events/``): which changes of the reuse tree are announced, and how removals are
batched. A router rebuilds its prefix index from these alone, so a removal not announced, announced for the wrong
group or out of order leaves it routing to blocks the worker no longer holds."""

from __future__ import annotations

from ._decisions import Decisions, setting


class EventDecisions(Decisions):
    SUBSYSTEM = "kv cache events"

    removed_event_for_descendants = setting(
        True, "whether the blocks an eviction takes with the block it chose (its descendants, detached from the "
        "tree: getFreeBlock's freeChildren) are announced as removed, each one; TensorRT-LLM PR #16335 fixed "
        "blockInRadixTree() testing the parent, so descendants of an evicted ancestor left silently")

    in_place_take_announced = setting(
        True, "whether a partly matched leaf a request takes over in place (it leaves the tree and the request "
        "writes into it) is announced as removed; TensorRT-LLM V1's loadOrAllocateBlocks frees the leaf with "
        "freeLeafBlock and no event (KVCacheManagerEventStreamPriority counts 1 event where it is re-stored), so "
        "a router keeps offering a block no request can match until the request releases it")

    removed_event_names_group = setting(
        True, "whether a removal names only the group that lost the block; announced for every group holding it, a "
        "router drops copies that are still cached (vLLM PR #48933: a BlockRemoved carries no count of the copies "
        "that remain, so a consumer invalidates a hash another copy still serves)")

    removed_event_merge_scope = setting(
        "last", "which pending removed event a V1 removal joins: the last event, when it is a removed event of the "
        "same group (enqueueRemovedEvent); with 'latest_of_group', the group's latest removed event past later "
        "events, which reorders a removal before a store it followed (TensorRT-LLM PR #11883: removals must reach a "
        "router in order with the stores around them)", choices=("last", "latest_of_group"))
