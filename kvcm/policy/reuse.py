"""Block reuse (prefix caching, ``kvcm/reuse``; docs/semantics.md 11)."""

from __future__ import annotations

from ._decisions import Decisions, rule, setting


class ReuseDecisions(Decisions):
    SUBSYSTEM = "block reuse"

    @rule("how many of a request's tokens are looked up in the cache: all but the last, whose logits must come out "
          "of a forward (nano-vllm #144 looked up all of them: a full hit left nothing to compute)")
    def lookup_length(num_tokens: int) -> int:
        return max(0, num_tokens - 1)

    block_key_hash = setting(
        None, "what a block is filed and found under among its parent's children: None, its tokens themselves, "
        "compared exactly; else a function of the tokens whose value is the key (vLLM GHSA-rm76-4mrf-v9r8 / PR "
        "#12621: a weak hash let one prompt read another's blocks)")

    @rule("the free count an engine reads: truly free blocks plus cached, unreferenced ones (TensorRT-LLM and vLLM "
          "count the latter as free, since allocating evicts them)")
    def free_blocks(truly_free: int, reusable: int) -> int:
        return truly_free + reusable

    @rule("how many blocks a dropped reference adds to the reusable count: one when the last reference goes, none "
          "while another request holds the block (SGLang #35270 counted a shared block once per holder)")
    def reusable_gain(refs_left: int) -> int:
        return 1 if refs_left == 0 else 0

    @rule("the admission credit for a request's cached prefix: with only_allocated, matched blocks some request "
          "holds; cached blocks nobody holds are already in the free count (TensorRT-LLM PR #11490 "
          "countReusableBlocks(onlyAllocated))")
    def reusable_credit(matched_refs: list, only_allocated: bool) -> int:
        if not only_allocated:
            return len(matched_refs)
        return sum(1 for refs in matched_refs if refs > 0)

    @rule("the reused length when groups (windows) reuse different lengths: the shortest, which every group has "
          "(TensorRT-LLM PR #10875 / PR #2983 took a per-window or the longest one)")
    def window_reuse_length(lengths: list) -> int:
        return min(lengths)

    hit_length_fixed_point = setting(
        True, "whether a hit's length, once one group shortened it, is checked again over every group until none "
        "shortens it (vLLM HybridKVCacheCoordinator.find_longest_cache_hit's fixed-point loop; PR #45614 and issue "
        "#43559: the common hit and a group's blocks disagreed): in one pass a V2 sliding group's window, moved back "
        "by a shorter full-attention hit, covered blocks that group does not hold, and the request took unwritten "
        "pages for tokens counted as cached")

    @rule("which groups' hits are cut to the reconciled hit length, given whether each group is full attention: "
          "every group (vLLM PR #52828: only the first full-attention group was truncated, a draft model's group "
          "kept its longer hit, its block table no longer matched the hit length and cache_hit_length went to 0)")
    def cut_to_reconciled_hit(group_is_full: tuple) -> tuple:
        return tuple(True for _ in group_is_full)

    @rule("the key of the root a request's blocks are filed and found under: its LoRA task id and cache salt, each "
          "in its own place (vLLM #44701 / PR #44706: LoRA names and cache salts went untagged into one list of extra "
          "keys, so LoRA 'X' and salt 'X' shared a first block and a base-model request read a LoRA's KV)")
    def reuse_scope(lora_task_id, cache_salt) -> tuple:
        return (lora_task_id, cache_salt)

    claim_match_first = setting(
        True, "whether a hit claims its matched blocks before it takes fresh pages for the rest (TensorRT-LLM "
        "loadOrAllocateBlocks: claimBlock on each matched block, getFreeBlock after it); allocating first let the "
        "allocation evict the very blocks the hit was about to claim (TensorRT-LLM #17926: the eviction walk "
        "detached the committing request's own blocks)")

    recorded_path_checked = setting(
        True, "whether a commit that starts from the blocks a request last matched or stored checks that each is "
        "still filed under the one before it (TensorRT-LLM PR #18095 / #18610, issue #17926: an eviction detached a "
        "live request's tree block and its next commit built on the detached prefix: a segfault upstream, cached "
        "pages no lookup can reach here)")

    detached_node_unlinked = setting(
        True, "whether a block taken out of the tree drops its link to its parent (TensorRT-LLM PR #16037, nvbugs "
        "6418912 in #16019: released detached blocks kept their mPrevBlockInSeq link, and chains of finished "
        "requests stayed joined through them); a link left behind makes the block look filed where it is not")

    @rule("whether a manager may reuse a partly matched block: only when asked and when no group stores compressed "
          "entries (DeepSeek-V4's _supports_partial_reuse = False: a mid-block prefix hands over rows of tokens the "
          "request does not own)")
    def partial_reuse_allowed(enable_partial_reuse: bool, compress_ratios: tuple) -> bool:
        return enable_partial_reuse and all(r == 1 for r in compress_ratios)

    @rule("whether a cached page at the head of the eviction order may be evicted: only when no request holds it "
          "(TensorRT-LLM #17926: blocks were detached under a live request)")
    def may_evict(refs: int) -> bool:
        return refs == 0

    evict_with_descendants = setting(
        True, "whether an allocation that finds no unheld leaf to evict (in a group that evicts leaves first) "
        "evicts an unheld block with descendants, taking its descendants' pages in that group out of the tree, as "
        "TensorRT-LLM's getFreeBlock does (kvCacheManager.cpp freeBlockAndAllDescendants / "
        "detachDescendantsFromLookupTree). Leaves only, a pool counted a cached block it could not evict as "
        "available: V1 with a window group and reuse raised RuntimeError from the block pool with another group's "
        "page already taken (issue 39). Both the eviction heap (V2) and V1's queued pool ask it")

    refused_chunk_restores_started = setting(
        True, "whether a request made by add_sequence whose first context chunk was refused counts as started (its "
        "pages LOCKED, not HELD) only as it did before the call, since a refused call changes nothing "
        "(docs/semantics.md 11.2; V2 marked it started before it knew the chunk fit, issue 39)")

    @rule("return one page to its pool; a page that is already free is refused, never listed twice in the free "
          "list (vLLM #42571: free_blocks([b, b]) grew the free count by two)")
    def release_block(pool, block: int) -> None:
        if not pool.is_used(block):
            raise RuntimeError(f"block {block} released twice")
        pool.push_free(block)
