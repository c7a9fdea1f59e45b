"""A hit over several layer groups, reconciled and claimed (docs/semantics.md 11.2): the length every group can
serve, reached as a fixed point (a shorter hit moves a sliding group's window back over other blocks), every
group's hit cut to it, and the matched blocks claimed before any fresh page is taken, so the hit's own allocation
never evicts its match. The evictions are real: retention priorities steer which cached page each group gives up.
Upstream: vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit`` (PR #45614, #52828, #46281) and TensorRT-LLM's
``loadOrAllocateBlocks`` (#17926)."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.reuse.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig

from _observe import check_books

TPB = 2
FULL_THEN_WINDOW = ModelSpec((LayerSpec(1, 8, "float32", model_layer=0),
                              LayerSpec(1, 8, "float32", 2 * TPB, model_layer=1)), name="full-then-window")
PROMPT = [1, 1, 2, 2, 3, 3, 4, 4, 5]        # blocks B0..B3 and a partial one: a lookup of four whole blocks


def _v2(spec, blocks: list[int], **cfg):
    """A V2 manager with ``blocks[g]`` blocks in group g."""
    probe = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=TPB, max_gpu_total_bytes=1 << 30),
                                         max_batch_size=8, max_seq_len=64, device="meta")
    sizes = [n * g.bytes_per_block for n, g in zip(blocks, probe.layer_groups)]
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=TPB, max_gpu_total_bytes=sum(sizes),
                                                                 pool_ratio=tuple(sizes), **cfg),
                                       max_batch_size=8, max_seq_len=64, device="meta")
    assert [g.num_blocks for g in mgr.layer_groups] == blocks
    return mgr


def _run(mgr, rid, tokens, **kw) -> int:
    n = mgr.add_sequence(rid, tokens, **kw)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


def _lost_b1_in_the_window_and_b3_in_full():
    """PROMPT computed and freed with B0 and B2 kept long (priority 90), B1 first to go (1), B3 and the partial
    block next (2); then a plain request of three blocks: the full group (one block free) evicts its two leaves,
    the partial block and B3; the window group (two free) evicts B1 alone, from the middle."""
    mgr = _v2(FULL_THEN_WINDOW, [6, 7], enable_partial_reuse=False)
    ranges = (TokenRangeRetentionConfig(0, 2, 90), TokenRangeRetentionConfig(2, 4, 1),
              TokenRangeRetentionConfig(4, 6, 90), TokenRangeRetentionConfig(6, None, 2))
    assert _run(mgr, "a", PROMPT, retention_config=KvCacheRetentionConfig(token_range_retention_configs=ranges)) == 0
    mgr.free_resources("a")
    mgr.begin_context_chunk("plain", 0, 3 * TPB, 3 * TPB)
    cache, node, path = mgr._reuse, mgr._reuse.tree.root(mgr.policy.reuse_scope(None, None)), []
    for i in range(4):
        node = cache.tree.child(node, tuple(PROMPT[i * TPB:(i + 1) * TPB]))
        path.append(node)
    assert [n.pages[0] >= 0 for n in path] == [True, True, True, False], "full group: B3 evicted, B0-B2 kept"
    assert [n.pages[1] >= 0 for n in path] == [True, False, True, True], "window group: B1 evicted, B0, B2, B3 kept"
    return mgr


def test_a_shorter_hit_moves_the_window_back_over_a_lost_block():
    """Full attention serves three blocks and the window four; at three blocks the window reads B1, which it lost,
    so the hit falls to what every group serves at its own end: one block (vLLM's fixed-point loop; #45614). The
    pages the window reads at the hit's end are cached pages of the prompt, never a fresh unwritten one."""
    mgr = _lost_b1_in_the_window_and_b3_in_full()
    n = mgr.add_sequence("q", PROMPT)
    assert n == 1 * TPB, f"a hit of {n} tokens: the window at token {n} reads a block it does not hold"
    table, window = mgr.block_table("q"), mgr.layer_groups[1]
    lo, hi = window.stale_range(n)
    for i in range(hi, n // TPB):
        assert mgr._reuse.is_tree_page(1, table[1][i]), f"window block {i} of the hit is not a cached page"
    check_books(mgr)


def test_every_group_is_cut_to_the_reconciled_hit():
    """The window group alone serves four blocks; every group's table holds the reconciled hit's blocks and no
    more (vLLM PR #52828: a group left uncut kept its longer hit, past the request's capacity)."""
    mgr = _lost_b1_in_the_window_and_b3_in_full()
    n = mgr.add_sequence("q", PROMPT)
    assert [len(blocks) for blocks in mgr.block_table("q")] == [n // TPB] * 2, mgr.block_table("q")
    assert mgr.get_capacity("q") == n
    check_books(mgr)


def test_a_hit_never_evicts_its_own_match():
    """B0 (priority 10, the eviction order's first) is cached on the GPU and B1 on the host level; the hit claims
    B0, then takes a fresh page to bring B1 back, which evicts the next page in order, not B0 (TensorRT-LLM
    loadOrAllocateBlocks claims each matched block before getFreeBlock; #17926 detached the committing request's
    own blocks)."""
    spec = ModelSpec((LayerSpec(1, 8, "float32", model_layer=0),), name="full")
    block = 2 * TPB * 8 * 4
    mgr = _v2(spec, [4], host_cache_size=2 * block)
    low = KvCacheRetentionConfig(token_range_retention_configs=(TokenRangeRetentionConfig(0, None, 10),))
    a = [1, 1, 2, 2, 3]
    _run(mgr, "a", a, retention_config=low)
    mgr.free_resources("a")                          # B0, B1 and the partial block cached at priority 10
    mgr.begin_context_chunk("z", 0, 3 * TPB, 3 * TPB)  # pushes the partial block and B1 down to the host
    mgr.free_resources("z")
    _run(mgr, "c", [5, 5, 6])                        # two cached pages at priority 35
    mgr.free_resources("c")
    mgr.begin_context_chunk("y", 0, TPB, TPB)        # the last free page
    assert mgr.get_block_counts(0).free == 0 and mgr.get_host_block_counts(0).reusable == 2
    n = mgr.add_sequence("q", a)
    assert n == 2 * TPB
    table = mgr.block_table("q")[0]
    assert all(mgr._reuse.is_tree_page(0, page) for page in table), f"the hit holds pages no block owns: {table}"
    check_books(mgr)
