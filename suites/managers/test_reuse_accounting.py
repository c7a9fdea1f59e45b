"""Block reuse: eviction, free counts, stats, reset, failed allocations and bad input (docs/semantics.md 11.5-11.8),
on V1, V2 and DeepSeek-V4 with reuse on, after TensorRT-LLM's ``LRUEvictionPolicy``, ``KvCacheStats`` and the
``KVCacheManager`` Python wrappers."""

from __future__ import annotations

import dataclasses

import pytest

import kvcm
from kvcm.errors import ConfigError, OutOfPagesError
from _reuse_driver import build, counts_add_up, decode, prefill, run, swa_spec
from kvcm.versions import NAMES as ALL_VERSIONS

VERSIONS = list(ALL_VERSIONS)


def _cached(mgr, tokens, scope=(None, None)):
    """How many whole blocks of ``tokens`` the tree still holds, from the root (group 0)."""
    tree = mgr._reuse.tree
    blocks = [tuple(tokens[i:i + 4]) for i in range(0, len(tokens) - len(tokens) % 4, 4)]
    return sum(1 for n in tree.walk(tree.root(scope), blocks) if n.pages[0] >= 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_eviction_takes_the_least_recently_released_leaf_first(version):
    mgr = build(version, blocks=8)
    a, b = [1] * 4 + [2] * 4 + [9], [3] * 4 + [4] * 4 + [9]
    run(mgr, "a", a, 0)
    run(mgr, "b", b, 0)                                    # 6 cached: a's 3 blocks older than b's
    prefill(mgr, "c", list(range(100, 108)) + [9])         # needs 3 pages: 2 free, 1 evicted
    assert _cached(mgr, a) == 2 and _cached(mgr, b) == 2   # the partial leaf [9] of a went first
    mgr.free_resources("c")
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_eviction_takes_the_lowest_priority_first(version):
    mgr = build(version, blocks=8)
    low, high = [1] * 4 + [2] * 4 + [9], [3] * 4 + [4] * 4 + [9]
    run(mgr, "high", high, 0, retention_config=kvcm.KvCacheRetentionConfig(priority=90))
    run(mgr, "low", low, 0, retention_config=kvcm.KvCacheRetentionConfig(priority=10))
    prefill(mgr, "c", list(range(100, 120)) + [9])         # 6 pages: 2 free, then all of low's 3, then 1 more
    assert _cached(mgr, low) == 0 and _cached(mgr, high) == 2
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_only_leaves_are_evicted_in_full_groups(version):
    """A parent block goes only after its children (a child without its parent is unreachable)."""
    mgr = build(version, blocks=8)
    run(mgr, "a", list(range(12)) + [50], 0)               # [0..3] <- [4..7] <- [8..11]
    prefill(mgr, "c", list(range(100, 120)) + [9])         # 6 pages: 5 free, 1 evicted: must be [8..11]
    assert _cached(mgr, list(range(12))) == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_a_held_block_is_never_evicted(version):
    mgr = build(version, blocks=8)
    prefill(mgr, "hold", list(range(9)))                  # holds [0..3] [4..7] (+1 private)
    run(mgr, "x", list(range(9)), 0)                       # shares them, caches nothing new but the partial
    with pytest.raises(OutOfPagesError):
        prefill(mgr, "big", list(range(100, 129)))         # 8 pages; only 5 can be had
    assert _cached(mgr, list(range(8))) == 2
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_free_count_includes_cached_blocks_and_the_split_adds_up(version):
    mgr = build(version, blocks=8)
    run(mgr, 0, list(range(12)), 100)
    c = mgr.get_block_counts()
    assert (c.free, c.reusable, c.in_use, c.total) == (5, 3, 0, 8)
    assert mgr.get_num_free_blocks() == 8 == mgr.get_kv_cache_stats().free_num_blocks
    assert mgr.get_num_reusable_blocks() == 3
    prefill(mgr, 1, list(range(12)))                       # holds the 3 cached blocks (V1: the partial in place)
    prefill(mgr, 2, list(range(8)) + [70, 71, 72, 73])     # shares 2 of them
    c = mgr.get_block_counts()
    assert c.reusable == 0 and c.free + c.in_use == 8
    assert mgr.get_kv_cache_stats().used_num_blocks == c.in_use
    counts_add_up(mgr)


def test_sliding_window_reuse_is_the_minimum_over_groups():
    """V1 matches a block only where every window group kept its page (``window_reuse_length`` = min,
    TensorRT-LLM PR #10875); V1 stores sliding groups only at release."""
    mgr = build("v1", blocks=16, spec=swa_spec(8))
    run(mgr, 0, list(range(16)), 100)
    full, swa = (g.index for g in sorted(mgr.layer_groups, key=lambda g: g.is_full))
    mgr._reuse.unset_page(mgr._reuse.tree.walk(mgr._reuse.tree.root((None, None)), [(0, 1, 2, 3), (4, 5, 6, 7)])[1],
                          swa, free=True)                  # the sliding group lost block 1's page
    assert prefill(mgr, 1, list(range(16))) == 4
    counts_add_up(mgr)


def test_v2_sliding_group_needs_only_the_window_of_the_match():
    """V2 trims per life cycle: a sliding group needs its pages only inside the window at the final length."""
    mgr = build("v2", blocks=16, spec=swa_spec(8))
    run(mgr, 0, list(range(16)), 100)
    n = prefill(mgr, 1, list(range(16)))
    assert n == 15
    swa = next(g.index for g in mgr.layer_groups if not g.is_full)
    assert mgr.block_table(1)[swa][0] == -1                # stale for the window: not claimed
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_dummies_are_never_stored_or_matched(version):
    mgr = build(version, blocks=16)
    free = mgr.get_num_available_tokens(token_num_upper_bound=10**6)
    dummies = mgr.add_dummy_requests(["d0", "d1"], token_nums=[9, 9])
    assert dummies is not None and len(mgr._reuse.page_node[0]) == 0
    assert prefill(mgr, 1, list(range(9))) == 0            # dummies' tokens are nobody's prompt
    for rid in ("d0", "d1", 1):
        mgr.free_resources(rid)
    assert mgr.get_num_available_tokens(token_num_upper_bound=10**6) == free    # cached blocks count as free
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_stats_carry_tensorrt_llm_names(version):
    mgr = build(version)
    run(mgr, 0, list(range(12)), 100)
    prefill(mgr, 1, list(range(8)) + [50, 51, 52, 53])
    s = mgr.get_kv_cache_stats()
    names = {f.name for f in dataclasses.fields(s)}
    assert {"max_num_blocks", "free_num_blocks", "used_num_blocks", "tokens_per_block", "reused_blocks",
            "missed_blocks", "alloc_total_blocks", "alloc_new_blocks", "cache_hit_rate"} <= names
    assert (s.reused_blocks, s.missed_blocks) == (2, 4)    # 0 + 3 missed, then 2 reused + 1 missed
    assert s.cache_hit_rate == pytest.approx(2 / 6)
    r = mgr.get_request_stats(1)
    assert (r.reused_blocks, r.missed_blocks, r.prepopulated_prompt_len) == (2, 1, 8)
    assert r.cache_hit_rate == pytest.approx(2 / 3) and mgr.get_prepopulated_prompt_len(1) == 8


@pytest.mark.parametrize("version", VERSIONS)
def test_reset_refuses_while_in_use_then_drops_everything(version):
    mgr = build(version)
    run(mgr, 0, list(range(12)), 100)
    prefill(mgr, 1, [5] * 5)
    assert mgr.reset_prefix_cache() is False and mgr.get_num_reusable_blocks() == 3
    mgr.free_resources(1)
    assert mgr.reset_prefix_cache() is True
    c = mgr.get_block_counts()
    assert (c.free, c.reusable, c.in_use) == (8, 0, 0)
    assert prefill(mgr, 2, list(range(12))) == 0


def _snapshot(mgr):
    cache = mgr._reuse
    nodes = []

    def walk(node):
        for child in node.children.values():
            nodes.append((child.tokens, tuple(child.pages), tuple(child.refs)))
            walk(child)
    for root in cache.tree.roots.values():
        walk(root)
    return ([(p.free_order(), bytes(p._used)) for p in mgr.pools],
            [p.num_reusable for p in mgr.pools], sorted(nodes), sorted(mgr.request_ids, key=str))


@pytest.mark.parametrize("version", VERSIONS + ["dsv4"])
def test_a_failed_context_allocation_with_a_hit_changes_nothing(version):
    """All or nothing: the request's first chunk cannot get its pages; reference counts, the tree and the free
    lists stay as they were after its match (vLLM test_prefix_caching's failed allocation with a hit)."""
    tpb = 128 if version == "dsv4" else 4
    mgr = build(version, tpb=tpb, blocks=8)
    tokens = list(range(3 * tpb + 1))
    run(mgr, 0, tokens, 1)
    prefill(mgr, 1, tokens[:2 * tpb] + [7] * tpb)          # holds two cached blocks and one more
    big = tokens[:2 * tpb] + [8] * (20 * tpb)
    mgr.add_sequence(2, big)
    before = _snapshot(mgr)
    with pytest.raises(OutOfPagesError):
        mgr.begin_context_chunk(2, 2 * tpb, len(big) - 2 * tpb, len(big))
    assert _snapshot(mgr) == before
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failed_partial_copy_changes_nothing(version):
    """``add_sequence`` cannot find the page its partial copy needs: OutOfPagesError, no request, and every count,
    the tree and the free lists as they were."""
    mgr = build(version, blocks=8)
    if version == "v1":
        prefill(mgr, 1, list(range(13)))                   # holds [0..3] [4..7] [8..11] (stored) + 1
        prefill(mgr, 3, [50] * 16)                         # the other 4
        tokens = list(range(10)) + [77, 78]                # partly matches the held [8..11]: a copy
    else:
        run(mgr, 0, list(range(9)), 100)                   # caches [0..3] [4..7] [8]
        prefill(mgr, 3, [50] * 20)                         # the 5 free pages
        tokens = list(range(10))                           # whole [0..3] [4..7], [8] copied
    before = _snapshot(mgr)
    with pytest.raises(OutOfPagesError):
        mgr.add_sequence(2, tokens)
    assert not mgr.has_request(2)
    assert _snapshot(mgr) == before
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("call, field", [
    (lambda m: m.add_sequence(1, ["a", 2]), "token_ids[0]"),
    (lambda m: m.add_sequence(1, [1, -2]), "token_ids[1]"),
    (lambda m: m.add_sequence(1, [True]), "token_ids[0]"),
    (lambda m: m.add_sequence(1, []), "token_ids"),
    (lambda m: m.add_sequence(1, "abc"), "token_ids"),
    (lambda m: m.add_sequence(1, [1], lora_task_id=-1), "lora_task_id"),
    (lambda m: m.add_sequence(1, [1], cache_salt=["a"]), "cache_salt"),
    (lambda m: m.count_reusable_blocks([1], lora_task_id=-1), "lora_task_id"),
    (lambda m: m.add_sequence(1, [1], retention_config=35), "retention_config"),
    (lambda m: kvcm.KvCacheRetentionConfig(priority=-1), "priority"),
    (lambda m: kvcm.KvCacheRetentionConfig(priority=101), "priority"),
    (lambda m: m.count_reusable_blocks([1.5]), "token_ids[0]"),
    (lambda m: m.get_block_counts(group=5), "group"),
])
def test_bad_input_is_a_config_error(version, call, field):
    mgr = build(version)
    with pytest.raises(ConfigError) as info:
        call(mgr)
    assert field in str(info.value)
    assert mgr.request_ids == []


@pytest.mark.parametrize("version", VERSIONS)
def test_reuse_asked_of_a_request_that_already_has_blocks(version):
    mgr = build(version)
    mgr.begin_context_chunk(1, 0, 5, 5)
    with pytest.raises(ConfigError, match="request_id"):
        mgr.add_sequence(1, list(range(5)))
    with pytest.raises(ConfigError, match="append_tokens"):
        mgr.append_tokens(1, [3])


@pytest.mark.parametrize("version", VERSIONS)
def test_reuse_off_caches_nothing(version):
    mgr = build(version, enable_block_reuse=False)
    assert not mgr.enable_block_reuse and not mgr.enable_partial_reuse
    run(mgr, 0, list(range(12)), 100)
    assert prefill(mgr, 1, list(range(12))) == 0
    assert mgr.get_block_counts().reusable == 0 and mgr.reset_prefix_cache() is False


@pytest.mark.parametrize("version", VERSIONS)
def test_eviction_skips_blocks_a_live_request_holds(version):
    """The oldest cached leaf is claimed by a live request while its place in the eviction order stays: an
    allocation that must evict takes the newer unheld leaf and never the held page (TensorRT-LLM #17926: blocks
    detached under a live request)."""
    mgr = build(version, blocks=8)
    if version == "v1":                                    # V1 stores what decode computed: end on a boundary
        run(mgr, "a", [1] * 4 + [2] * 3, 2, 9)             # [1..] <- [2..], a leaf
        run(mgr, "b", [3] * 4 + [4] * 3, 4, 9)
        c = [1] * 4 + [2] * 4 + [5]                        # holds both; [5] is stored only at its release
    else:
        run(mgr, "a", [1] * 4 + [2] * 4)                   # V2 commits prompt blocks
        run(mgr, "b", [3] * 4 + [4] * 4)
        c = [1] * 4 + [2] * 4                              # [2..] recomputed, then rebased onto the cached page
    prefill(mgr, "c", c)
    held = mgr.block_table("c")[0][:2]
    assert all(mgr._reuse.is_tree_page(0, p) for p in held)
    free = mgr.get_block_counts().free
    prefill(mgr, "d", list(range(100, 100 + 4 * (free + 1))))   # one page more than is free: one eviction
    assert not set(held) & set(mgr.block_table("d")[0]), "a page the running request holds was handed out"
    assert _cached(mgr, [1] * 4 + [2] * 4) == 2 and _cached(mgr, [3] * 4 + [4] * 4) == 1
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_partial_block_copied_again_and_again_keeps_the_eviction_queue_short(version):
    """Every few-shot request copies the shared prefix's partial last block (GSM8K 8-shot: 1,319 copies of one
    block). The copy holds its source for a moment and gives it back, which offers the source for eviction again
    under the same stamp. The queue compacts to one entry per page once its entries outnumber the reusable pages
    by far; keeping both entries left it above that mark, so every later release scanned the whole heap again
    (a batch-1,024 run spent a quarter of its host time there)."""
    mgr = build(version, blocks=8)
    run(mgr, "prefix", list(range(9)), 100)               # [0..3] [4..7] and the partial [8] cached
    for i in range(200):
        assert mgr.add_sequence(i, list(range(9)) + [200 + i]) == 9     # whole blocks taken, [8] copied or taken
        mgr.free_resources(i)
    queue, reusable = mgr._reuse.orders[0], mgr.get_block_counts().reusable
    assert len(queue) <= 2 * reusable + 64, (len(queue), reusable)
    prefill(mgr, "evicts", list(range(100, 132)))          # every page: each cached one is evicted once
    assert mgr.get_block_counts().reusable == 0
    counts_add_up(mgr)


@pytest.mark.parametrize("version", VERSIONS)
def test_count_reusable_blocks_credits_only_held_blocks(version):
    """TensorRT-LLM PR #11490 ``countReusableBlocks(onlyAllocated)``: with only_allocated, the matched blocks some
    request holds; cached blocks nobody holds are already in the free count and are not credited twice."""
    mgr = build(version, blocks=16)
    tokens = list(range(12)) + [50, 51, 52, 53, 60]
    run(mgr, 0, tokens, 100)                               # 4 whole blocks and [60] cached, nobody holds
    assert mgr.count_reusable_blocks(tokens) == 0
    assert mgr.count_reusable_blocks(tokens, only_allocated=False) == 4
    prefill(mgr, 1, list(range(8)) + [70])                 # holds two of them
    assert mgr.count_reusable_blocks(tokens) == 2
    assert mgr.count_reusable_blocks(tokens, only_allocated=False) == 4
    assert mgr.get_block_counts().reusable == 5 - 2        # asking changed nothing



def _with_a_decode_page(mgr, rid):
    """A request of two stored prompt blocks that decoded into a third page, private to it."""
    prefill(mgr, rid, list(range(8)))
    mgr.append_tokens(rid, [100])
    decode(mgr, rid, 101)
    page = mgr.block_table(rid)[0][-1]
    assert not mgr._reuse.is_tree_page(0, page)
    return page


def _free_entries(pool, page: int) -> int:
    """How often ``page`` waits among the pool's free pages (V2's stack, V1's queue: kvcm/free_queue.py)."""
    return pool.free_order().count(page)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_page_released_twice_is_refused(version):
    """The reuse cache gives a private page back once: a release that lists it twice (vLLM #42571:
    ``free_blocks([b, b])`` queued one block twice and ``num_free_blocks`` grew by two) is refused at the second."""
    mgr = build(version, blocks=8)
    page = _with_a_decode_page(mgr, 1)
    free = mgr.pools[0].num_free
    with pytest.raises(RuntimeError, match=f"block {page} released twice"):
        mgr._reuse.release(0, [page, page])
    assert mgr.pools[0].num_free == free + 1 and _free_entries(mgr.pools[0], page) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_a_block_table_listing_a_page_twice_is_refused_on_free(version):
    """A request whose table lists one page at two places (vLLM #42571's sliding window, where a block re-entered
    the window and was listed again): freeing it refuses the second release, and the free count an engine reads
    never passes the pool (V1 files the page in the tree at release first: the second drop is refused there)."""
    mgr = build(version, blocks=8)
    page = _with_a_decode_page(mgr, 1)
    mgr.block_tables([1])[0][0].append(page)               # the table the engine keeps now lists that page twice
    with pytest.raises(RuntimeError, match="released twice"):
        mgr.free_resources(1)
    assert mgr.get_num_free_blocks() <= 8
    c = mgr.get_block_counts()
    assert c.free + c.reusable <= c.total
