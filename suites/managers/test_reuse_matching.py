"""Block reuse: what a request matches and what becomes reusable when (docs/semantics.md 11.2-11.4), on V1, V2 and
DeepSeek-V4 with reuse on. TensorRT-LLM is the reference: V1's ``WindowBlockManager`` (kvCacheManager.cpp), V2's
``_KVCache`` and its wrapper (``kv_cache_manager_v2``)."""

from __future__ import annotations

import pytest

from _reuse_driver import build, counts_add_up, decode, prefill, run
from kvcm.versions import NAMES as ALL_VERSIONS

VERSIONS = list(ALL_VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("n, reused", [(1, 0), (4, 3), (5, 4), (9, 8), (12, 11)])
def test_last_token_is_never_reused(version, n, reused):
    """A full repeat reuses the prompt less its last token (``setPrepopulatedPromptLen`` asserts < prompt length):
    the last token is recomputed so the step has logits."""
    mgr = build(version)
    tokens = list(range(n))
    run(mgr, 0, tokens, 100)
    assert prefill(mgr, 1, tokens) == reused < n
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_whole_blocks_only_without_partial_reuse(version):
    mgr = build(version, enable_partial_reuse=False)
    run(mgr, 0, list(range(12)), 100)
    assert prefill(mgr, 1, list(range(11))) == 8        # 10 tokens looked up: two whole blocks
    assert mgr.get_request_stats(1).reused_blocks == 2


def test_v1_partial_leaf_taken_in_place_v2_copies():
    """V1 takes an unreferenced leaf over in place (no new block); V2 always copies the partial block."""
    for version, new, in_tree_after in (("v1", 0, 2), ("v2", 1, 3)):
        mgr = build(version)
        run(mgr, 0, list(range(12)), 100)                  # stores [0..3] [4..7] and [8..10] (V2: prompt only)
        assert prefill(mgr, 1, list(range(10))) == 9       # 2 blocks + 1 token of the third
        s = mgr.get_request_stats(1)
        assert (s.reused_blocks, s.missed_blocks, s.alloc_total_blocks) == (3, 0, new)
        assert len(mgr._reuse.page_node[0]) == in_tree_after
        counts_add_up(mgr)


def test_v1_copies_a_held_partial_block_only_with_copy_on_partial_reuse():
    """A block a live request holds matches partly: copied (``copyOnPartialReuse``), or not reused at all."""
    for copy, reused, new in ((True, 10, 1), (False, 8, 1)):   # the copy, or the missed block
        mgr = build("v1", blocks=16, copy_on_partial_reuse=copy)
        prefill(mgr, 0, list(range(13)))                   # context end stores [0..3] [4..7] [8..11], held
        assert prefill(mgr, 2, list(range(10)) + [77, 78]) == reused
        s = mgr.get_request_stats(2)
        assert (s.reused_blocks, s.alloc_total_blocks) == (reused // 4 + (reused % 4 > 0), new)
        counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scope", [dict(lora_task_id=7), dict(cache_salt="tenant-b"),
                                   dict(lora_task_id=7, cache_salt="x")])
def test_scopes_never_share_blocks(version, scope):
    """LoRA task id and cache salt pick the root (TensorRT-LLM ``BlockKey`` loraTaskId / cacheSaltID)."""
    mgr = build(version)
    tokens = list(range(12))
    run(mgr, 0, tokens, 100)
    assert prefill(mgr, 1, tokens, **scope) == 0
    mgr.free_resources(1)
    assert prefill(mgr, 2, tokens, **scope) == 11
    assert prefill(mgr, 3, tokens) == 11


@pytest.mark.parametrize("version", VERSIONS)
def test_keys_compare_every_token(version):
    """One token different in the first block: only the two tokens before it are reused (a partial match), none of
    the blocks after it (exact keys, never a hash alone)."""
    mgr = build(version)
    run(mgr, 0, list(range(12)), 100)
    assert prefill(mgr, 1, [0, 1, 99, 3] + list(range(4, 12))) == 2
    assert prefill(mgr, 2, list(range(6)) + [99] * 6) == 6    # [0..3] whole, [4, 5] of the next (partial)


@pytest.mark.parametrize("version", VERSIONS)
def test_blocks_with_the_same_digest_share_nothing(version):
    """Each block holds the same tokens in another order (the same count, the same sum: a weak digest of them
    collides): nothing is reused (vLLM GHSA-rm76-4mrf-v9r8 / PR #12621, blocks found by a colliding hash)."""
    mgr = build(version)
    run(mgr, 0, list(range(12)), 100)
    assert prefill(mgr, 1, [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10]) == 0


def test_v1_stores_full_blocks_at_context_end_and_each_block_in_decode():
    mgr = build("v1", blocks=16)
    prefill(mgr, 0, list(range(10)))                        # context end: [0..3] [4..7] (tokens less the last)
    assert len(mgr._reuse.page_node[0]) == 2
    mgr.append_tokens(0, [10])
    decode(mgr, 0, 11, 12)                                 # history 12, 13 tokens: [8..11] final
    assert len(mgr._reuse.page_node[0]) == 3
    assert prefill(mgr, 1, list(range(13))) == 12          # a live request's decode blocks are matched
    mgr.free_resources(0)
    counts_add_up(mgr)


def test_v1_release_stores_the_partial_last_block():
    mgr = build("v1")
    run(mgr, 0, list(range(9)), 9, 10)                     # releaseBlocks stores [0..3] [4..7] [8, 9]
    assert prefill(mgr, 1, list(range(11))) == 10


def test_v2_commits_prompt_tokens_only():
    """The wrapper's ``try_commit_blocks`` commits the prompt; generated tokens never become reusable."""
    mgr = build("v2", blocks=16)
    run(mgr, 0, list(range(6)), 6, 7, 8, 9, 10, 11)
    assert prefill(mgr, 1, list(range(13))) == 6


def test_v2_page_states_locked_held_droppable():
    mgr = build("v2")
    run(mgr, 0, list(range(9)), 100)
    page = mgr._reuse.tree.walk(mgr._reuse.tree.root((None, None)), [(0, 1, 2, 3)])[0].pages[0]
    assert mgr.page_state(0, page) == "DROPPABLE"
    mgr.add_sequence(1, list(range(9)))
    assert mgr.page_state(0, page) == "HELD"               # matched, context not begun (suspended)
    mgr.begin_context_chunk(1, 8, 1, 9)
    assert mgr.page_state(0, page) == "LOCKED"
    mgr.end_context_chunk(1, 9)
    mgr.free_resources(1)
    assert mgr.page_state(0, page) == "DROPPABLE"


@pytest.mark.parametrize("version", VERSIONS)
def test_concurrent_identical_prompts_keep_one_copy(version):
    """Two requests compute one prompt side by side: the tree keeps one page per block and the duplicate goes back
    to the pool, not into the tree (V1 ``storeBlocks``: "block 3 matches block 2 and will be freed"; V2 rebases a
    committed full block onto the tree's page)."""
    mgr = build(version, blocks=16)
    tokens = list(range(12))
    for rid in (0, 1):
        mgr.add_sequence(rid, tokens)
        mgr.begin_context_chunk(rid, 0, 12, 12)
    for rid in (0, 1):
        mgr.end_context_chunk(rid, 12)
    for rid in (0, 1):
        mgr.free_resources(rid)
    counts_add_up(mgr)
    c = mgr.get_block_counts(0)
    assert c.reusable == 3 and c.free == 13                # [0..3] [4..7] [8..10]: one page each


def test_dsv4_forces_partial_reuse_off_and_reuses_whole_blocks():
    """DeepSeek-V4's ``_supports_partial_reuse = False``: a compressed group cannot take rows mid-block."""
    mgr = build("dsv4", tpb=128, blocks=8)
    assert mgr.kv_cache_config.enable_partial_reuse and not mgr.enable_partial_reuse
    run(mgr, 0, list(range(300)), 1)
    assert prefill(mgr, 1, list(range(300))) == 256
    assert prefill(mgr, 2, list(range(200))) == 128
    counts_add_up(mgr)


def test_dsv4_plain_model_keeps_partial_reuse():
    mgr = build("v2")
    assert mgr.enable_partial_reuse


@pytest.mark.parametrize("seed", range(6))
def test_partial_candidates_are_every_sibling_most_shared_first_oldest_first(seed):
    """The bisected sibling index gives the order a comparison against every child gives (TensorRT-LLM's
    ``findMatchingBlock`` compares them all): common prefix length descending, filing order among equals; and
    it stays so as siblings are removed. Small token alphabets make long shared prefixes and many ties."""
    import random

    from kvcm.reuse.tree import Node, RadixTree

    rng = random.Random(seed)
    tree = RadixTree(1)
    parent = tree.root(None, create=True)
    kids = []
    for _ in range(60):
        tokens = (7,) + tuple(rng.randrange(3) for _ in range(rng.randrange(0, 6)))
        if parent.children.get(tokens) is None:
            kids.append(tree.add_child(parent, tokens, 35))
    for victim in rng.sample(kids, 15):
        tree.remove(victim)
        kids.remove(victim)

    def brute(query):
        out = []
        for node in sorted(kids, key=lambda n: n.serial):
            n, limit = 0, min(len(query), len(node.tokens))
            while n < limit and node.tokens[n] == query[n]:
                n += 1
            out.append((n, node))
        return [(n, node) for n, node in sorted(out, key=lambda item: -item[0]) if n > 0]

    for _ in range(40):
        query = (7,) + tuple(rng.randrange(3) for _ in range(rng.randrange(0, 6)))
        assert list(RadixTree.partial_candidates(parent, query)) == brute(query), query
    assert list(RadixTree.partial_candidates(parent, (8, 1))) == []
    assert isinstance(parent, Node)
