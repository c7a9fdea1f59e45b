"""A sliding-window group, a full group and block reuse at the edge of a 6-block pool (issue 39), as a user met it.

V1, window 8 + full, 4 tokens a block, ``max_tokens=24`` (6 blocks a group), reuse on (the default), meta device.
A request that did not reuse a prefix keeps its own page for a block below one it stored, so the prefix's cached
page in the full group is unheld but never a leaf. The pool counted it as available; eviction, leaves only, could
not take it: ``RuntimeError`` from the block pool after the window group had already given a page, a decode that
then "succeeded" over its pages, an ``IndexError`` on free and a block never free again. TensorRT-LLM's
``getFreeBlock`` evicts such a block with its descendants (``freeBlockAndAllDescendants``), which kvcm now does
(the policy's ``evict_with_descendants``). And on V2 a refused first context chunk flipped the matched page from HELD to
LOCKED (the policy's ``refused_chunk_restores_started``). Every call here either succeeds or raises ``OutOfPagesError``
with everything observable as it was; after freeing everything and ``reset_prefix_cache()`` every block is free.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import OutOfPagesError
from kvcm.model_spec import LayerSpec, ModelSpec
from _observe import all_free_after_reset, check_books, observe

R5, R6, R7, R9 = [37, 5, 17, 8], [37, 5, 17, 8, 32, 23, 19], [15, 38, 7, 21, 2, 2, 2, 35, 1, 18, 19], [32, 36, 15]


def _manager(version: str = "v1", reuse: bool = True):
    spec = ModelSpec((LayerSpec(1, 16, "bfloat16", 8, model_layer=0), LayerSpec(1, 16, "bfloat16", model_layer=1)),
                     name="window8-full")
    cfg = KvCacheConfig(tokens_per_block=4, max_tokens=24, enable_block_reuse=reuse)
    return kvcm.create_kv_cache_manager(version, spec, cfg, max_batch_size=4, max_seq_len=4096, device="meta")


def _call(mgr, fn, *args):
    """One call: it succeeds, or raises OutOfPagesError and changes nothing observable. Books balance either way."""
    before = observe(mgr)
    try:
        fn(*args)
    except OutOfPagesError:
        assert observe(mgr) == before, f"refused {fn.__name__}{args} changed the manager"
        check_books(mgr)
        return False
    check_books(mgr)
    return True


def _prefill(mgr, rid, tokens, first) -> bool:
    """add_sequence, one context chunk, the first token: each call checked on its own. A refused one (the whole
    call, then the chunk) is answered as an engine does: the request made by add_sequence is freed."""
    if not _call(mgr, mgr.add_sequence, rid, tokens):
        return False
    n = mgr.get_prepopulated_prompt_len(rid)
    if not _call(mgr, mgr.begin_context_chunk, rid, n, len(tokens) - n, len(tokens)):
        assert _call(mgr, mgr.free_resources, rid)
        return False
    assert _call(mgr, mgr.end_context_chunk, rid, len(tokens))
    assert _call(mgr, mgr.append_tokens, rid, [first])
    return True


def _decode(mgr, rid, token=1) -> bool:
    """One generation step, each call checked on its own; False when begin_generation was refused."""
    history = mgr.get_history(rid)
    if not _call(mgr, mgr.begin_generation, rid):
        return False
    assert _call(mgr, mgr.end_generation, rid, history + 2)
    assert _call(mgr, mgr.append_tokens, rid, [token])
    return True


def _step_one(mgr):
    """Step 1 of the issue: r5, r6, r7 prefilled, one decode of r6, r5 freed."""
    for rid, tokens, first in (("r5", R5, 18), ("r6", R6, 5), ("r7", R7, 30)):
        assert _prefill(mgr, rid, tokens, first)
    assert _decode(mgr, "r6")
    assert _call(mgr, mgr.free_resources, "r5")


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
def test_admission_at_the_edge_evicts_or_refuses_cleanly(reuse):
    """Step 2: admitting r9 takes the cached prefix page (with reuse) or the free one (without), never a
    RuntimeError from the pool, and r9 runs to its end like any request."""
    mgr = _manager(reuse=reuse)
    _step_one(mgr)
    assert _prefill(mgr, "r9", R9, 3)
    assert mgr.num_blocks_held("r9") == [1, 1]
    while _decode(mgr, "r9"):
        pass
    all_free_after_reset(mgr)


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
def test_decodes_at_the_edge_stay_within_their_pages(reuse):
    """Step 3: r6 decodes until the pool is spent; each step holds ceil(capacity / 4) pages in both groups, the
    refused one changes nothing, and freeing r6 then everything leaves every block free."""
    mgr = _manager(reuse=reuse)
    _step_one(mgr)
    steps = 0
    while _decode(mgr, "r6"):
        steps += 1
        held = -(-mgr.get_capacity("r6") // 4)
        assert mgr.num_blocks_held("r6") == [held, held]
    assert steps >= 2
    assert _call(mgr, mgr.free_resources, "r6")
    assert "r6" not in mgr.request_ids
    all_free_after_reset(mgr)


def test_reuse_on_and_off_answer_the_same_calls_the_same():
    """The same calls: reuse changes which pages, never whether a call fits (every page counted is evictable)."""
    outcomes = []
    for reuse in (True, False):
        mgr = _manager(reuse=reuse)
        _step_one(mgr)
        outcomes.append([_decode(mgr, "r6") for _ in range(4)] + [_prefill(mgr, "r9", R9, 3)])
    assert outcomes[0] == outcomes[1]


def test_v2_refused_first_chunk_leaves_the_match_held():
    """V2, window 8: a request matching a cached block whose first chunk does not fit keeps that page HELD
    (docs/semantics.md 11.2: a failing first chunk leaves the match as it was), and runs once pages come back."""
    mgr = _manager("v2")
    prompt = [1, 2, 3, 4, 5]
    _prefill(mgr, "a", prompt, 6)
    mgr.free_resources("a")
    filler = "fill"
    mgr.begin_context_chunk(filler, 0, 12, 12)          # no token ids: never matched, takes 3 of 6 full blocks
    n = mgr.add_sequence("b", prompt + [7] * 8)           # matches [1, 2, 3, 4] and [5]
    assert n == 5                                         # its whole block and the partial one copied
    page = mgr.block_table("b")[1][0]
    assert mgr.page_state(1, page) == "HELD"
    assert not _call(mgr, mgr.begin_context_chunk, "b", n, 9, 13)
    assert mgr.page_state(1, page) == "HELD"
    mgr.free_resources(filler)
    assert _call(mgr, mgr.begin_context_chunk, "b", n, 9, 13)
    assert mgr.page_state(1, page) == "LOCKED"
    all_free_after_reset(mgr)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_refused_first_chunk_changes_nothing_observable(version):
    """The same refusal on a full-attention-only cache, checked through everything observable (tables, counts,
    page states, stats, tree): both versions leave it as it was."""
    spec = ModelSpec.uniform(1, 1, 16, "bfloat16", name="one-layer")
    mgr = kvcm.create_kv_cache_manager(version, spec, KvCacheConfig(tokens_per_block=2, max_tokens=6),
                                       max_batch_size=4, max_seq_len=64, device="meta")
    _prefill(mgr, "a", [1, 1, 2], 3)
    mgr.free_resources("a")
    n = mgr.add_sequence("b", [1, 1, 2, 2, 2, 2, 2, 2])
    assert n == 3 and not _call(mgr, mgr.begin_context_chunk, "b", n, 5, 8)


@pytest.mark.parametrize("version", ["v1", "v2", "dsv4"])
def test_refused_dummy_batch_evicts_no_cached_block(version):
    """Found by the explorer (V2, 4 blocks of 2 tokens, reuse on): a warmup batch that cannot fit, placed dummy by
    dummy, evicted a cached block for its first dummy before the second was refused; releasing the dummies did not
    bring the block back. The batch is now refused before it places anything, the cache as it was."""
    from exhaustive.configs import Config, build

    cfg = Config(version, "dsv4" if version == "dsv4" else "full", 128 if version == "dsv4" else 2, 4, "copy", ids=True)
    mgr, t = build(cfg), cfg.tpb
    prompt = [1] * t + [2]
    _prefill(mgr, "r0", prompt, 1)
    mgr.free_resources("r0")                             # its two blocks cached, nobody holds them
    mgr.begin_context_chunk("r1", 0, t + 1, t + 1)       # no token ids: two fresh blocks
    assert mgr.get_block_counts().reusable == 2
    before = observe(mgr)
    assert mgr.add_dummy_requests(["w0", "w1"], token_nums=[1, 2 * t], is_gen=True) is None   # 3 blocks of 2
    assert observe(mgr) == before
    check_books(mgr)
    assert mgr.add_dummy_requests(["w0"], token_nums=[1], is_gen=True) is not None   # one fits, evicting one
    all_free_after_reset(mgr)


def test_a_page_the_window_released_is_neither_freed_again_nor_cached():
    """SGLang PR #31486's shape: a request decodes past its window, so its oldest window-group pages go back to the
    pool mid-request; at its release they must not be freed a second time or stored as cached blocks (the pool may
    already have given them to another request: a cache hit on someone else's KV, then a double free)."""
    mgr = _manager("v2")
    prompt = [37, 5, 17, 8, 32, 23, 19, 4]
    assert _prefill(mgr, "a", prompt, 11)
    for token in range(12, 24):             # decode to 20 tokens: the window of 8 leaves the first blocks behind
        assert _call(mgr, mgr.begin_generation, "a")
        assert _call(mgr, mgr.end_generation, "a", mgr.get_history("a") + 2)
        assert _call(mgr, mgr.append_tokens, "a", [token])
    window = mgr.group_of_layer(0)
    table = mgr.block_table("a")[window]
    assert table[:3] == [-1, -1, -1], f"blocks the window slid past are still listed: {table}"
    assert _call(mgr, mgr.free_resources, "a")
    cached = mgr.count_reusable_blocks(prompt + list(range(11, 24)))
    # the prompt's two blocks lost their window-group pages mid-request, so no block of it is whole in the cache
    assert cached == 0, f"{cached} blocks reused, though the window group's pages of them were released"
    all_free_after_reset(mgr)


@pytest.mark.parametrize("prompt_len", [9, 10, 11, 12, 13])
def test_a_hit_holds_every_page_its_first_tokens_window_reads(prompt_len):
    """SGLang PR #34870's shape: the sliding group's frontier of a hit is the matched length (the first computed
    token's window), not the prompt's token count, which is one more on a full hit. Sized from the count, at a page
    edge (11 tokens here: a hit of 10, window 8, 4 tokens a block) the block holding the window's first token was
    left unclaimed: a cached page nobody holds, free to be evicted and rewritten while the request still reads it."""
    mgr = _manager("v2")
    prompt = [37, 5, 17, 8, 32, 23, 19, 4, 9, 6, 2, 14, 3][:prompt_len]
    assert _prefill(mgr, "a", prompt, 11)
    assert _call(mgr, mgr.free_resources, "a")
    hit = mgr.add_sequence("b", prompt)
    check_books(mgr)
    assert hit == prompt_len - 1
    window = mgr.group_of_layer(0)
    table = mgr.block_table("b")[window]
    read = range(max(0, hit + 1 - 8) // 4, -(-hit // 4))    # cached tokens [hit + 1 - 8, hit) the token at hit reads
    missing = [i for i in read if table[i] < 0]
    assert not missing, f"hit {hit}: blocks {missing} of the window the first computed token reads are not held"
    assert all(mgr.page_state(window, table[i]) == "HELD" for i in read)
    n = mgr.get_prepopulated_prompt_len("b")
    assert _call(mgr, mgr.begin_context_chunk, "b", n, prompt_len - n, prompt_len)
    assert _call(mgr, mgr.free_resources, "b")
    all_free_after_reset(mgr)
