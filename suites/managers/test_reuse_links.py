"""What a cached block is filed under and linked to (docs/semantics.md 11.2-11.4): the scope's key keeps a LoRA id
and a cache salt apart whatever their values (vLLM #44701), a block taken out of the tree names no parent
(TensorRT-LLM PR #16037), and a request whose stored prefix an eviction took out from under it files its next
blocks from the root again, where a lookup finds them (TensorRT-LLM PR #18095, issue #17926)."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

from _observe import check_books

TPB = 2
SPEC = ModelSpec((LayerSpec(1, 8, "float32", model_layer=0),), name="full")


def _v1(blocks: int):
    return kvcm.create_kv_cache_manager("v1", SPEC, KvCacheConfig(tokens_per_block=TPB, max_tokens=blocks * TPB),
                                        max_batch_size=8, max_seq_len=64, device="meta")


def test_a_salt_and_a_lora_id_of_one_value_share_nothing():
    """LoRA task 7 computes a prompt; a request salted 7 (a string or an int, as any salt) finds none of it, nor
    does the admission credit: a salt and a LoRA id are different dimensions of the key, on V1 and V2."""
    for version in ("v1", "v2"):
        mgr = kvcm.create_kv_cache_manager(version, SPEC, KvCacheConfig(tokens_per_block=TPB, max_tokens=16 * TPB),
                                           max_batch_size=8, max_seq_len=64, device="meta")
        tokens = [1, 1, 2, 2, 3]
        n = mgr.add_sequence("lora", tokens, lora_task_id=7)
        mgr.begin_context_chunk("lora", n, len(tokens) - n, len(tokens))
        mgr.end_context_chunk("lora", len(tokens))
        assert mgr.count_reusable_blocks(tokens, lora_task_id=7) == 2
        assert mgr.count_reusable_blocks(tokens, cache_salt=7) == 0, version
        assert mgr.add_sequence("salted", tokens, cache_salt=7) == 0, f"{version}: a salted request reused LoRA KV"
        check_books(mgr)


def _prefix_evicted_under_a_live_request():
    """Request "r" (its prompt [1, 1, 2, 2, 3]) is made before "x" caches the block [1, 1], so "r" computes its
    own copy of it and files only [2, 2], below x's block; x leaves, and a plain request takes every free block and
    then x's block: it leaves the tree with its descendants, r's [2, 2] staying r's own page; the plain request
    leaves."""
    mgr = _v1(6)
    mgr.add_sequence("r", [1, 1, 2, 2, 3])
    n = mgr.add_sequence("x", [1, 1, 9])
    mgr.begin_context_chunk("x", n, 3 - n, 3)
    mgr.end_context_chunk("x", 3)
    mgr.begin_context_chunk("r", 0, 5, 5)
    mgr.end_context_chunk("r", 5)
    mgr.free_resources("x")
    path = list(mgr._seqs["r"].reuse.path)
    assert [node.tokens for node in path] == [(1, 1), (2, 2)]
    free = mgr.get_block_counts(0).free
    mgr.begin_context_chunk("plain", 0, (free + 1) * TPB, (free + 1) * TPB)   # the last one is x's cached block
    assert mgr._reuse.tree.child(mgr._reuse.tree.root(mgr.policy.reuse_scope(None, None)), (1, 1)) is None
    mgr.free_resources("plain")
    return mgr, path


def test_a_detached_block_names_no_parent():
    mgr, path = _prefix_evicted_under_a_live_request()
    assert [node.parent for node in path] == [None, None], "blocks out of the tree still name their parents"


def test_a_commit_after_its_prefix_was_evicted_files_under_the_root():
    """r decodes until its third block is final and stores it: its recorded path left the tree, so it is looked up
    again from the root and r's three blocks are filed there, each found by a lookup of r's tokens."""
    mgr, _ = _prefix_evicted_under_a_live_request()
    tokens = [1, 1, 2, 2, 3]
    for t in (4, 5):
        mgr.begin_generation("r")
        mgr.end_generation("r", len(tokens) + 1)
        mgr.append_tokens("r", [t])
        tokens.append(t)
    assert mgr.count_reusable_blocks(tokens + [0]) == 3, "r's stored blocks are not where a lookup of its tokens goes"
    check_books(mgr)
