"""Block reuse (prefix caching) through the contract: the numbers of vLLM's ``tests/v1/core/test_prefix_caching.py``
where kvcm (TensorRT-LLM's semantics) and vLLM behave alike, asked of every target with reuse.

Shared, and tested here: a prompt is looked up less its last token (whole blocks only with partial reuse off);
a hit while the first request still runs shares its pages; cached blocks nobody holds count as free and are
evicted, the deepest block of a prefix first, when an allocation needs them; an allocation that does not fit
with a hit changes nothing; a reset refuses while a request holds pages. Where a target departs (kvcm V1 stores
a block-aligned prompt's last block later; vLLM and SGLang never cache a partial block; SGLang evicts whole radix
nodes) the test names the difference.
Pools are sized in *usable* pages: vLLM's 11 blocks are its null block plus 10.
"""

import pytest

from pytest_kvcm.targets import PoolSpec

PS = 16
COMMON = [i for i in range(3) for _ in range(PS)]      # three full blocks: 0 x16, 1 x16, 2 x16


def _pool(kvcm_target, usable=10, exact=True):
    """A reuse pool of ``usable`` pages of 16 tokens; ``exact=False`` for a test that counts with the target's own
    page size and free count, and so runs whatever the target declares."""
    probe = kvcm_target(PoolSpec(num_pages=8, reuse=True))
    probe.require_reuse()
    target = kvcm_target(PoolSpec(num_pages=usable + probe.reserved_pages, page_size=PS, max_model_len=8192,
                                  reuse=True))
    if exact:
        target.require("exact_pool_size")
        assert target.usable_pages == usable and target.page_size == PS
    return target


def _snapshot(t):
    """What a refused allocation must leave as it was: free and cached pages, every request's tokens and pages."""
    return t.free_pages(), t.cached_pages(), {r: (t.tokens(r), t.held_pages(r)) for r in sorted(t.requests)}


def test_prefill_hit_shares_pages_and_cached_blocks_count_as_free(kvcm_target):
    """vLLM test_prefill: 48 common tokens + 7, then + 5 while the first runs, then + 6 once both are freed."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", COMMON + [3] * 7) == 0
    assert t.held_pages("0")["full"] == 4 and t.free_pages() == 6
    assert t.allocate_prompt("1", COMMON + [3] * 5) == 3 * PS, f"{t}: the common prefix hits while req 0 runs"
    assert t.held_pages("1")["full"] == 4
    assert t.free_pages() == 5, f"{t}: the hit's three pages are shared, one new page taken"
    t.free("0")
    t.free("1")
    assert t.free_pages() == 10, f"{t}: cached blocks nobody holds count as free"
    assert t.cached_pages() >= 3
    if t.differs("partial_blocks_cached", "exactly 3 blocks cached (the partial one not), instead of at least 3"):
        assert t.cached_pages() == 3
    assert t.allocate_prompt("2", COMMON + [3] * 6) == 3 * PS, f"{t}: the prefix hits once its holders are gone"
    assert t.free_pages() == 6
    t.free("2")
    assert t.allocate_prompt("3", [99] * (PS * 10)) == 0, f"{t}: a miss"
    assert t.free_pages() == 0 and t.cached_pages() == 0, f"{t}: the miss evicted every cached block to fit"
    t.free("3")
    assert t.lookup(COMMON + [3] * 6) == 0, f"{t}: the common prefix was evicted"


@pytest.mark.parametrize("miss_pages, hit", [(7, 48), (8, 32), (9, 16), (10, 0)])
def test_eviction_takes_the_deepest_block_of_a_prefix_first(kvcm_target, miss_pages, hit):
    """vLLM test_prefill's eviction order (free queue [5, 4, 6..10, 3, 2, 1]: partial and never-used blocks first,
    then the common prefix from its last block back): a miss of N pages leaves the first blocks of the prefix."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", COMMON + [3] * 7) == 0
    assert t.allocate_prompt("1", COMMON + [3] * 5) == 48
    t.free("0")
    t.free("1")
    assert t.allocate_prompt("miss", [99] * (PS * miss_pages)) == 0
    if miss_pages > 7 and hit and t.differs("whole_node_eviction",
                                            f"a miss of {miss_pages} pages leaves no hit, not {hit}"):
        hit = 0  # the prefix is one radix node of three pages (SGLang): any shortfall evicts all of it
    assert t.lookup(COMMON + [5] * 3) == hit, (f"{t}: a miss of {miss_pages} pages evicts "
                                               f"{miss_pages - 7} block(s) of the prefix from its end")


def test_failed_allocation_with_a_hit_changes_nothing(kvcm_target):
    """vLLM test_prefill_not_enough_free_blocks_with_computed_blocks: req 3 hits six blocks but needs three new
    pages with two left; refused, the hit blocks' references and the free count stay as they were. Whatever the
    target declares (``differences.py``), a prompt with a hit that is refused changes nothing: blocks are cut at
    the target's own page size, and the pool is filled to vLLM's state from the target's own free count."""
    t = _pool(kvcm_target, usable=24, exact=False)   # more than vLLM's 10: req 2 fills it to vLLM's state
    ps = t.page_size
    common = [i for i in range(3) for _ in range(ps)]
    late = t.differs("last_prompt_block", "req 1 hits 32 tokens of req 0's prompt and req 3 would hit 80, not 48 "
                                          "and 96 (req 0's last block is not stored yet)")
    hit1, hit3 = (2 * ps, 5 * ps) if late else (3 * ps, 6 * ps)
    assert t.allocate_prompt("0", common) == 0
    assert t.allocate_prompt("1", common * 2) == hit1
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
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", COMMON + [3] * 7) == 0
    assert t.allocate_prompt("1", COMMON + [4] * 7) == 48
    assert t.held_pages("1")["full"] == 4 and t.free_pages() == 5
    assert t.reset_cache() is False
    assert t.lookup(COMMON + [5] * 7) == 48, f"{t}: a refused reset dropped the cache"
    t.free("0")
    t.free("1")
    assert t.reset_cache() is True
    assert t.lookup(COMMON + [5] * 7) == 0 and t.cached_pages() == 0 and t.free_pages() == 10


@pytest.mark.parametrize("blocks", [1, 3])
def test_last_token_is_always_recomputed(kvcm_target, blocks):
    """vLLM ``get_computed_blocks``: max_cache_hit_length = num_tokens - 1, whole blocks: a block-aligned prompt
    repeated reuses one block less; a one-token prompt reuses nothing (nano-vllm #144: a full hit left nothing
    to compute)."""
    t = _pool(kvcm_target)
    prompt = COMMON[:blocks * PS]
    assert t.allocate_prompt("0", prompt) == 0
    t.free("0")
    assert t.lookup(prompt) == (blocks - 1) * PS
    assert t.allocate_prompt("1", prompt) == (blocks - 1) * PS
    t.free("1")
    assert t.allocate_prompt("2", [5]) == 0
    t.free("2")
    assert t.allocate_prompt("3", [5]) == 0, f"{t}: a one-token prompt must be computed"


def test_hit_stops_at_the_first_differing_block(kvcm_target):
    """vLLM test_cache_key_salting's unsalted half: 48 common + 11 of [4] after 48 + 11 of [3] hits three blocks;
    a prompt that differs in its first token hits nothing (keys chain through the prefix)."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", COMMON + [3] * 11) == 0
    t.free("0")
    assert t.lookup(COMMON + [4] * 11) == 48
    assert t.lookup([9] + COMMON[1:] + [3] * 11) == 0
    assert t.lookup(COMMON[:16] + [9] + COMMON[17:] + [3] * 11) == 16


def test_block_aligned_prompt_stores_its_last_block(kvcm_target):
    """A block-aligned prompt's blocks are all cached with it (vLLM caches full blocks at allocation; TensorRT-LLM
    V2 commits the prompt's tokens): a longer prompt with that prefix hits every block."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", COMMON) == 0
    t.free("0")
    late = t.differs("last_prompt_block", "a hit of 32 tokens, the blocks before the last, not 48")
    assert t.lookup(COMMON + [3] * 5) == (32 if late else 48)


def test_repeated_block_aligned_prompt(kvcm_target):
    """The same 48-token prompt twice, both running: the second reuses 32 tokens and recomputes the third block.
    kvcm V2 (TensorRT-LLM V2's commit) finds that block cached and swaps its page for the cached one, so the pair
    holds three pages; V1 has not stored it yet (``last_prompt_block``); vLLM keeps the recomputed block as a
    second cached copy (``duplicate_blocks``); a design that keeps it as the request's private page, freed at
    release, declares ``private_recomputed_block``."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", COMMON) == 0
    assert t.allocate_prompt("1", COMMON) == 32
    held, cached = 3, 3
    if t.differs("duplicate_blocks", "4 pages held while both run, 4 cached after release (not 3 and 3)"):
        held, cached = 4, 4
    elif (t.differs("private_recomputed_block", "4 pages held while both run (not 3), 3 cached after release")
          or t.differs("last_prompt_block", "4 pages held while both run (not 3), 3 cached after release")):
        held = 4
    assert t.free_pages() == 10 - held, f"{t}: the pair holds {10 - t.free_pages()} pages"
    t.free("0")
    t.free("1")
    assert t.free_pages() == 10
    assert t.cached_pages() == cached


def test_running_request_s_hit_blocks_are_never_evicted(kvcm_target):
    """A request that runs on cached blocks pins them: a miss that needs every free page evicts only the blocks
    nobody holds (TensorRT-LLM #17926: radix blocks detached under a live request; vLLM touch() takes hit blocks
    out of the free queue)."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("a", COMMON) == 0
    t.free("a")
    assert t.allocate_prompt("d", [8] * PS * 2) == 0
    t.free("d")
    hit = t.allocate_prompt("b", COMMON + [4] * 7)
    assert hit in (32, 48)
    cached_hit = t.lookup(COMMON + [5] * 7)
    free = t.free_pages()
    assert free == 10 - 4, f"{t}: the running request holds four pages"
    assert t.allocate_prompt("c", [99] * (PS * free)) == 0, f"{t}: {free} free pages, cached ones included"
    assert t.free_pages() == 0, f"{t}: {t.free_pages()} pages free after a miss took all of them"
    assert t.allocate_prompt("e", [5] * PS) is None
    assert t.lookup(COMMON + [5] * 7) == cached_hit, f"{t}: the running request's blocks were evicted"
    assert t.lookup([8] * PS * 2 + [1]) == 0, f"{t}: the unheld blocks should have gone first"


def test_colliding_digest_is_not_a_hit(kvcm_target):
    """Keys compare the tokens (or a strong digest of them: vLLM's sha256 since GHSA-rm76-4mrf-v9r8 / PR #12621):
    blocks with the same multiset of tokens in another order share nothing."""
    t = _pool(kvcm_target)
    assert t.allocate_prompt("0", [1, 2] * (PS // 2) * 3 + [3] * 7) == 0
    t.free("0")
    assert t.lookup([2, 1] * (PS // 2) * 3 + [3] * 7) == 0
    assert t.allocate_prompt("1", [2, 1] * (PS // 2) * 3 + [3] * 7) == 0
    assert t.lookup([1, 2] * (PS // 2) * 3 + [4] * 7) == 48


def test_hybrid_hit_is_the_shortest_over_its_groups(kvcm_target):
    """A model with a sliding-window group beside the full one: a hit must hold in every group, so it is the
    shortest over them (TensorRT-LLM PR #10875 / PR #2983 took one window's or the longest)."""
    t = kvcm_target(PoolSpec(num_pages=32, page_size=PS, sliding_window=2 * PS, max_model_len=8192, reuse=True))
    t.require_reuse()
    t.require("page_size")
    assert t.allocate_prompt("0", COMMON + [3] * 7) == 0
    running = 0 if t.differs("window_stored_at_release", "no hit while the first request runs, not 48") else 48
    assert t.lookup(COMMON + [4] * 7) == running, f"{t}: the window group has no block of the prefix yet"
    assert t.allocate_prompt("1", COMMON + [4] * 7) == running
    t.free("0")
    t.free("1")
    assert t.lookup(COMMON + [5] * 7) == 48
    assert t.allocate_prompt("2", COMMON + [5] * 7) == 48


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
