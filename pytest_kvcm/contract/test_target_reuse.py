"""Block reuse (prefix caching) through the contract: the numbers of vLLM's ``tests/v1/core/test_prefix_caching.py``
where kvcm (TensorRT-LLM's semantics) and vLLM behave alike, asked of every target with reuse.

Shared, and tested here: a prompt is looked up less its last token (whole blocks only with partial reuse off);
a hit while the first request still runs shares its pages; cached blocks nobody holds count as free and are
evicted, the deepest block of a prefix first, when an allocation needs them; an allocation that does not fit
with a hit changes nothing; a reset refuses while a request holds pages. Where a target departs (kvcm V1 stores
a block-aligned prompt's last block later; vLLM and SGLang never cache a partial block; SGLang evicts whole radix
nodes) the test names the difference.
Pools are sized in *usable* pages: vLLM's 11 blocks are its null block plus 10. Every count is the target's
own (its page size, the free pages it reports at the start), so a pool of another size runs the same checks;
vLLM's numbers are the case of exactly 10 pages of 16 (``_pool``).
"""

import pytest

from pytest_kvcm.targets import PoolSpec

PS = 16                                                # the page size asked; a target's own is used throughout


def _common(ps: int) -> list[int]:
    return [i for i in range(3) for _ in range(ps)]    # three full blocks: 0 x ps, 1 x ps, 2 x ps


def _pool(kvcm_target, usable=10):
    """A reuse pool asked for ``usable`` pages of 16 tokens: ``(target, page size, free pages)``.

    Every count of a test is the target's own: blocks are cut at its page size and pages are counted from the free
    pages it reports at the start, so a pool of another size runs the same checks (vLLM's numbers are the case of
    exactly 10 pages of 16). That the pool is the size asked is one assertion here, which ``exact_pool_size`` and
    ``page_size`` relax, never a reason to skip a test."""
    probe = kvcm_target(PoolSpec(num_pages=8, reuse=True))
    probe.require_reuse()
    target = kvcm_target(PoolSpec(num_pages=usable + probe.reserved_pages, page_size=PS, max_model_len=8192,
                                  reuse=True))
    ps, free = target.page_size, target.free_pages()
    if ps != PS and not target.differs("page_size", f"blocks cut at its own page size {ps}, not {PS}"):
        raise AssertionError(f"{target}: pages of {ps} tokens, {PS} asked")
    if free != usable and not target.differs("exact_pool_size", f"pages counted from its own {free} free at the "
                                                                f"start, not {usable}"):
        raise AssertionError(f"{target}: {free} free pages in a pool of {usable} usable pages asked")
    return target, ps, free


def _free_is(t, want: int, what: str) -> None:
    """``t.free_pages() == want``, unless the target declares ``free_pages``: its free count is then not one pool's
    (DeepSeek-V4: the smallest of several pools, the window ones releasing pages as they slide), and no single
    count of pages held or freed applies to it. The hits, refusals and cached blocks are checked as always."""
    __tracebackhide__ = True
    if t.differs("free_pages", "the free-page counts are not compared (several pools, each filling at its own "
                               "rate); hits, refusals and cached blocks are"):
        return
    got = t.free_pages()
    assert got == want, f"{t}: {got} free pages, {want} expected: {what}"


def _snapshot(t):
    """What a refused allocation must leave as it was: free and cached pages, every request's tokens and pages."""
    return t.free_pages(), t.cached_pages(), {r: (t.tokens(r), t.held_pages(r)) for r in sorted(t.requests)}


def test_prefill_hit_shares_pages_and_cached_blocks_count_as_free(kvcm_target):
    """vLLM test_prefill: 48 common tokens + 7, then + 5 while the first runs, then + 6 once both are freed."""
    t, ps, free = _pool(kvcm_target)
    common = _common(ps)
    assert t.allocate_prompt("0", common + [3] * 7) == 0
    assert t.held_pages("0")["full"] == 4
    _free_is(t, free - 4, "req 0 holds four pages")
    assert t.allocate_prompt("1", common + [3] * 5) == 3 * ps, f"{t}: the common prefix hits while req 0 runs"
    assert t.held_pages("1")["full"] == 4
    _free_is(t, free - 5, "the hit's three pages are shared, one new page taken")
    t.free("0")
    t.free("1")
    _free_is(t, free, "cached blocks nobody holds count as free")
    assert t.cached_pages() >= 3
    if t.differs("partial_blocks_cached", "exactly 3 blocks cached (the partial one not), instead of at least 3"):
        assert t.cached_pages() == 3
    assert t.allocate_prompt("2", common + [3] * 6) == 3 * ps, f"{t}: the prefix hits once its holders are gone"
    _free_is(t, free - 4, "req 2 holds four pages, three of them the hit's")
    t.free("2")
    if "free_pages" in t.differences:
        return      # the miss below is sized by the free count
    assert t.allocate_prompt("3", [99] * (ps * free)) == 0, f"{t}: a miss"
    assert t.free_pages() == 0 and t.cached_pages() == 0, f"{t}: the miss evicted every cached block to fit"
    t.free("3")
    assert t.lookup(common + [3] * 6) == 0, f"{t}: the common prefix was evicted"


@pytest.mark.parametrize("evicted", [0, 1, 2, 3])
def test_eviction_takes_the_deepest_block_of_a_prefix_first(kvcm_target, evicted):
    """vLLM test_prefill's eviction order (free queue [5, 4, 6..10, 3, 2, 1]: partial and never-used blocks first,
    then the common prefix from its last block back): a miss of all pages but the prefix's three and ``evicted``
    more (vLLM's 7, 8, 9 and 10 of its 10) leaves the first ``3 - evicted`` blocks of the prefix."""
    t, ps, free = _pool(kvcm_target)
    t.require("free_pages", "the miss is sized by the free count, which is not one pool's")
    common, miss_pages, hit = _common(ps), free - 3 + evicted, (3 - evicted) * ps
    assert t.allocate_prompt("0", common + [3] * 7) == 0
    assert t.allocate_prompt("1", common + [3] * 5) == 3 * ps
    t.free("0")
    t.free("1")
    assert t.allocate_prompt("miss", [99] * (ps * miss_pages)) == 0
    if evicted and hit and t.differs("whole_node_eviction",
                                     f"a miss of {miss_pages} pages leaves no hit, not {hit // ps} block(s)"):
        hit = 0  # the prefix is one radix node of three pages (SGLang): any shortfall evicts all of it
    assert t.lookup(common + [5] * 3) == hit, (f"{t}: a miss of {miss_pages} of {free} pages evicts {evicted} "
                                               f"block(s) of the prefix from its end")


def test_failed_allocation_with_a_hit_changes_nothing(kvcm_target):
    """vLLM test_prefill_not_enough_free_blocks_with_computed_blocks: req 3 hits six blocks but needs three new
    pages with two left; refused, the hit blocks' references and the free count stay as they were. Whatever the
    target declares (``differences.py``), a prompt with a hit that is refused changes nothing: blocks are cut at
    the target's own page size, and the pool is filled to vLLM's state from the target's own free count."""
    t, ps, _ = _pool(kvcm_target, usable=24)   # more than vLLM's 10: req 2 fills it to vLLM's state
    common = _common(ps)
    late = t.differs("last_prompt_block", "req 1 hits 2 blocks of req 0's prompt and req 3 would hit 5, not 3 and 6 "
                                          "(req 0's last block is not stored yet)")
    hit1, hit3 = (2 * ps, 5 * ps) if late else (3 * ps, 6 * ps)
    assert t.allocate_prompt("0", common) == 0
    got = t.allocate_prompt("1", common * 2)
    assert got == hit1, f"{t}: req 1 hit {got} tokens of req 0's prompt, {hit1} expected"
    t.free("1")
    longest = common * 3 + [9] * (t.max_model_len - 9 * ps)   # the hit, then more tokens than the whole pool
    before = _snapshot(t)
    assert t.allocate_prompt("long", longest) is None, f"{t}: a prompt of max_model_len tokens fits"
    assert _snapshot(t) == before and "long" not in t.requests, f"{t}: the refused allocation changed the pool"
    assert t.lookup(common * 3) == hit3, f"{t}: the refused request's hit is still cached"
    if t.differs("free_pages", "vLLM's case at the boundary (three pages needed, two free beside the hit) is not "
                               "run: the free count does not say how many pages a prompt may take"):
        return
    fill = t.free_pages() - 5   # as in vLLM's pool of 10, where req 2 takes two never-used pages: five stay free
    assert fill >= 1, f"{t}: {t.free_pages()} free pages with req 0 running; the test needs 6 or more"
    assert t.allocate_prompt("2", [7] * ps * fill) == 0
    assert t.free_pages() == 5
    assert t.lookup(common * 3) == hit3
    before = _snapshot(t)
    assert t.allocate_prompt("3", common * 3) is None, (f"{t}: a prompt of 9 blocks hitting {hit3 // ps} fits in "
                                                        "5 free pages, the hit's cached ones among them")
    assert _snapshot(t) == before and "3" not in t.requests, f"{t}: the refused allocation changed the pool"
    assert t.lookup(common * 3) == hit3, f"{t}: the refused request's hit is still cached"
    t.free("2")
    assert t.allocate_prompt("3", common * 3) == hit3, f"{t}: with req 2's pages back it fits"
    assert t.held_pages("3")["full"] == 9


def test_reset_refuses_while_in_use(kvcm_target):
    """vLLM test_reset_prefix_cache: False while two requests hold pages (the cache kept), True once freed."""
    t, ps, free = _pool(kvcm_target)
    common = _common(ps)
    assert t.allocate_prompt("0", common + [3] * 7) == 0
    assert t.allocate_prompt("1", common + [4] * 7) == 3 * ps
    assert t.held_pages("1")["full"] == 4
    _free_is(t, free - 5, "the two requests hold five pages, three of them shared")
    assert t.reset_cache() is False
    assert t.lookup(common + [5] * 7) == 3 * ps, f"{t}: a refused reset dropped the cache"
    t.free("0")
    t.free("1")
    assert t.reset_cache() is True
    assert t.lookup(common + [5] * 7) == 0 and t.cached_pages() == 0
    _free_is(t, free, "a reset with nothing held leaves every page free")


@pytest.mark.parametrize("blocks", [1, 3])
def test_last_token_is_always_recomputed(kvcm_target, blocks):
    """vLLM ``get_computed_blocks``: max_cache_hit_length = num_tokens - 1, whole blocks: a block-aligned prompt
    repeated reuses one block less; a one-token prompt reuses nothing (nano-vllm #144: a full hit left nothing
    to compute)."""
    t, ps, _ = _pool(kvcm_target)
    prompt = _common(ps)[:blocks * ps]
    assert t.allocate_prompt("0", prompt) == 0
    t.free("0")
    assert t.lookup(prompt) == (blocks - 1) * ps
    assert t.allocate_prompt("1", prompt) == (blocks - 1) * ps
    t.free("1")
    assert t.allocate_prompt("2", [5]) == 0
    t.free("2")
    assert t.allocate_prompt("3", [5]) == 0, f"{t}: a one-token prompt must be computed"


def test_hit_stops_at_the_first_differing_block(kvcm_target):
    """vLLM test_cache_key_salting's unsalted half: 48 common + 11 of [4] after 48 + 11 of [3] hits three blocks;
    a prompt that differs in its first token hits nothing (keys chain through the prefix)."""
    t, ps, _ = _pool(kvcm_target)
    common = _common(ps)
    assert t.allocate_prompt("0", common + [3] * 11) == 0
    t.free("0")
    assert t.lookup(common + [4] * 11) == 3 * ps
    assert t.lookup([9] + common[1:] + [3] * 11) == 0
    assert t.lookup(common[:ps] + [9] + common[ps + 1:] + [3] * 11) == ps


def test_block_aligned_prompt_stores_its_last_block(kvcm_target):
    """A block-aligned prompt's blocks are all cached with it (vLLM caches full blocks at allocation; TensorRT-LLM
    V2 commits the prompt's tokens): a longer prompt with that prefix hits every block."""
    t, ps, _ = _pool(kvcm_target)
    common = _common(ps)
    assert t.allocate_prompt("0", common) == 0
    t.free("0")
    late = t.differs("last_prompt_block", "a hit of the 2 blocks before the last, not all 3")
    got, want = t.lookup(common + [3] * 5), (2 if late else 3) * ps
    assert got == want, f"{t}: a hit of {got} tokens after a 3-block prompt, {want} expected"


def test_repeated_block_aligned_prompt(kvcm_target):
    """The same 48-token prompt twice, both running: the second reuses 32 tokens and recomputes the third block.
    kvcm V2 (TensorRT-LLM V2's commit) finds that block cached and swaps its page for the cached one, so the pair
    holds three pages; V1 has not stored it yet (``last_prompt_block``); vLLM keeps the recomputed block as a
    second cached copy (``duplicate_blocks``); a design that keeps it as the request's private page, freed at
    release, declares ``private_recomputed_block``."""
    t, ps, free = _pool(kvcm_target)
    common = _common(ps)
    assert t.allocate_prompt("0", common) == 0
    assert t.allocate_prompt("1", common) == 2 * ps
    held, cached = 3, 3
    if t.differs("duplicate_blocks", "4 pages held while both run, 4 cached after release (not 3 and 3)"):
        held, cached = 4, 4
    elif (t.differs("private_recomputed_block", "4 pages held while both run (not 3), 3 cached after release")
          or t.differs("last_prompt_block", "4 pages held while both run (not 3), 3 cached after release")):
        held = 4
    _free_is(t, free - held, f"the pair holds {held} pages (3: the recomputed block swapped for the cached page; 4 "
                             "for a design that declares duplicate_blocks, private_recomputed_block or "
                             "last_prompt_block)")
    t.free("0")
    t.free("1")
    _free_is(t, free, "every page back after both are freed")
    assert t.cached_pages() == cached, f"{t}: {t.cached_pages()} cached pages after release, {cached} expected"


def test_running_request_s_hit_blocks_are_never_evicted(kvcm_target):
    """A request that runs on cached blocks pins them: a miss that needs every free page evicts only the blocks
    nobody holds (TensorRT-LLM #17926: radix blocks detached under a live request; vLLM touch() takes hit blocks
    out of the free queue)."""
    t, ps, free0 = _pool(kvcm_target)
    common = _common(ps)
    assert t.allocate_prompt("a", common) == 0
    t.free("a")
    assert t.allocate_prompt("d", [8] * ps * 2) == 0
    t.free("d")
    hit = t.allocate_prompt("b", common + [4] * 7)
    assert hit in (2 * ps, 3 * ps)
    cached_hit = t.lookup(common + [5] * 7)
    free = t.free_pages()
    _free_is(t, free0 - 4, "the running request holds four pages")
    admitted = t.allocate_prompt("c", [99] * (ps * free))
    sized = not t.differs("free_pages", "a miss of the free count's pages need not take every page (or fit): only "
                                        "that the running request's blocks survive it is checked")
    if sized:
        assert admitted == 0, f"{t}: {free} free pages, cached ones included, refused a miss of {free} pages"
        assert t.free_pages() == 0, f"{t}: {t.free_pages()} pages free after a miss took all of them"
        assert t.allocate_prompt("e", [5] * ps) is None
    assert t.lookup(common + [5] * 7) == cached_hit, f"{t}: the running request's blocks were evicted"
    if sized:
        assert t.lookup([8] * ps * 2 + [1]) == 0, f"{t}: the unheld blocks should have gone first"


def test_colliding_digest_is_not_a_hit(kvcm_target):
    """Keys compare the tokens (or a strong digest of them: vLLM's sha256 since GHSA-rm76-4mrf-v9r8 / PR #12621):
    blocks with the same multiset of tokens in another order share nothing."""
    t, ps, _ = _pool(kvcm_target)
    assert t.allocate_prompt("0", [1, 2] * (ps // 2) * 3 + [3] * 7) == 0
    t.free("0")
    assert t.lookup([2, 1] * (ps // 2) * 3 + [3] * 7) == 0
    assert t.allocate_prompt("1", [2, 1] * (ps // 2) * 3 + [3] * 7) == 0
    assert t.lookup([1, 2] * (ps // 2) * 3 + [4] * 7) == 3 * ps


def test_hybrid_hit_is_the_shortest_over_its_groups(kvcm_target):
    """A model with a sliding-window group beside the full one: a hit must hold in every group, so it is the
    shortest over them (TensorRT-LLM PR #10875 / PR #2983 took one window's or the longest)."""
    t = kvcm_target(PoolSpec(num_pages=32, page_size=PS, sliding_window=2 * PS, max_model_len=8192, reuse=True))
    t.require_reuse()
    ps = t.page_size
    common = _common(ps)
    assert t.allocate_prompt("0", common + [3] * 7) == 0
    running = 0 if t.differs("window_stored_at_release", "no hit while the first request runs, not 48") else 3 * ps
    assert t.lookup(common + [4] * 7) == running, f"{t}: the window group has no block of the prefix yet"
    assert t.allocate_prompt("1", common + [4] * 7) == running
    t.free("0")
    t.free("1")
    assert t.lookup(common + [5] * 7) == 3 * ps
    assert t.allocate_prompt("2", common + [5] * 7) == 3 * ps


def test_reuse_is_whole_blocks_only(kvcm_target):
    """A prompt that shares two blocks and a quarter of the third reuses the two blocks: vLLM has no partial
    reuse, and DeepSeek-V4 turns it off whatever the config says (its compressed groups hold rows of whole
    blocks: TensorRT-LLM's DeepseekV4CacheManager _supports_partial_reuse = False)."""
    t = kvcm_target(PoolSpec(num_pages=16, max_model_len=4096, reuse=True))
    t.require_reuse()
    ps = t.page_size
    assert t.allocate_prompt("a", [1] * (2 * ps + ps // 2)) == 0
    t.free("a")
    assert t.allocate_prompt("b", [1] * (2 * ps + ps // 4) + [2] * ps) == 2 * ps
