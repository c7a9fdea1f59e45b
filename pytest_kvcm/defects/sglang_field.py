"""SGLang's KV-cache bugs of 2026, put back into kvcm's managers through their decisions (``kvcm.policy``).

SGLang itself runs behind the contract (``pytest_kvcm/targets/sglang_target.py``) at its pinned release, where these
are fixed or not reachable from the CPU pools; the defects here put each shape into kvcm, so ``kvcm sensitivity``
keeps proving the suites catch it.
"""

from __future__ import annotations

from ._registry import defect

_EXPLORER = "suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"


@defect("window-released-page-recached",
        upstream="SGLang PR #31486 (closed; PureSWARadixCache.cache_finished_req inserted [0, keys_len) although "
                 "decode had freed the out-of-window range with free_swa_out_of_window_slots: a cache hit on recycled "
                 "slots, then a double free at eviction)",
        story="a page the sliding window released stayed in the request's block table: the request's release freed "
              "it again and its store filed it as a cached block while the pool could hand it to another request",
        catchers=("suites/managers/test_window_reuse_edge.py::"
                  "test_a_page_the_window_released_is_neither_freed_again_nor_cached",
                  "suites/managers/test_formulas.py::test_stale_blocks_released_by_v2_resize",
                  _EXPLORER + "[v2-full+window-tpb2-b4-reuse_on-ids-r2]"))
def window_released_page_recached():
    return {"stale_pages_unlisted": False}


@defect("window-frontier-from-token-count",
        upstream="SGLang PR #34870 (merged; on a hybrid SWA model with EAGLE, cache_unfinished_req sized the "
                 "out-of-window eviction frontier from the request's token count, while a bigram key spans one "
                 "entry fewer than its tokens and so stops the cached leaf a page lower at page multiples: the leaf "
                 "kept less than a window of live SWA, the follow-up match refused it and pool accounting broke; "
                 "the fix hands the key length to the frontier)",
        story="a V2 hit's sliding-window (and chunked) groups left their stale blocks alone from the prompt's token "
              "count instead of the matched length: on a full hit that is one token further, and at a page edge the "
              "block holding the first computed token's oldest window token was left unclaimed, a cached page "
              "nobody held that the request still read",
        catchers=("suites/managers/test_window_reuse_edge.py::"
                  "test_a_hit_holds_every_page_its_first_tokens_window_reads",
                  "suites/managers/test_window_reuse_edge.py::test_v2_refused_first_chunk_leaves_the_match_held",
                  _EXPLORER + "[v2-full+chunked-tpb4-b5-reuse_on-ids-r2]",
                  _EXPLORER + "[dsv4-dsv4-tpb128-b4-reuse_on-ids-r2]"))
def window_frontier_from_token_count():
    return {"match_window_history": lambda matched_tokens, num_tokens: num_tokens}
