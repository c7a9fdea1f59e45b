"""Everything a caller can observe of a manager, as one comparable value, and the books that must always balance.

A refused call (``OutOfPagesError``, ``ConfigError``, ``UnknownRequestError``) must leave ``observe(mgr)`` equal to
what it was; ``check_books`` holds after every call, refused or not. Shared by the regression tests of
``test_window_reuse_edge.py`` and the exhaustive explorer (``suites/managers/exhaustive``).
"""

from __future__ import annotations

import dataclasses

from kvcm.units import ceil_div


def tree_dump(mgr) -> tuple:
    """The reuse tree as nested tuples of (tokens, pages, refs, priority, children sorted by tokens)."""
    cache = mgr._reuse
    if cache is None:
        return ()

    def node(n):
        kids = tuple(node(c) for _, c in sorted(n.children.items(), key=lambda kv: kv[1].tokens))
        return (n.tokens, tuple(n.pages), tuple(n.host), tuple(n.refs), n.priority, kids)

    return tuple((scope, node(root)) for scope, root in sorted(cache.tree.roots.items(), key=repr))


def observe(mgr) -> tuple:
    """Counts per group, stats, every request's capacity, history, table and stats, page states and the tree."""
    groups = range(len(mgr.pools))
    requests = []
    for rid in sorted(mgr.request_ids, key=repr):
        seq = mgr._seqs[rid]
        requests.append((rid, mgr.get_capacity(rid), mgr.get_history(rid), tuple(map(tuple, mgr.block_table(rid))),
                         mgr.get_prepopulated_prompt_len(rid), dataclasses.astuple(mgr.get_request_stats(rid)),
                         None if seq.reuse is None else (tuple(seq.reuse.tokens), seq.reuse.started)))
    states = tuple(tuple(mgr.page_state(g, b) for b in range(mgr.pools[g].num_blocks)) for g in groups)
    return (tuple(dataclasses.astuple(mgr.get_block_counts(g)) for g in groups), mgr.get_num_free_blocks(),
            dataclasses.astuple(mgr.get_kv_cache_stats()), tuple(requests), states, tree_dump(mgr),
            tuple(mgr.stale_released), loads_dump(mgr))


def loads_dump(mgr) -> tuple:
    """The copies from the host tier in flight (group, page, block, loading or aborted) and the tables of the
    requests freed while theirs were in flight."""
    loads = getattr(mgr._reuse, "loads", None)
    if loads is None:
        return ()
    aborted = {id(seq): rid for rid, seq in loads.aborted}
    return (tuple((load.group, load.page, load.node.tokens, aborted.get(id(load.seq), "live"))
                  for load in loads.in_flight),
            tuple((rid, tuple(map(tuple, seq.blocks))) for rid, seq in loads.aborted))


def check_books(mgr) -> None:
    """free + reusable + in use = the pool per group; a page is free or held, never both; a tree page's reference
    count is its live holders; every request's capacity is covered by the pages it holds in every group."""
    tpb, cache = mgr.tokens_per_block, mgr._reuse
    for g, (group, pool) in enumerate(zip(mgr.layer_groups, mgr.pools)):
        c = mgr.get_block_counts(g)
        assert c.free + c.reusable + c.in_use == c.total == pool.num_blocks, (g, c)
        holders: dict[int, int] = {}
        for seq in held_sequences(mgr):
            for page in seq.blocks[g]:
                if page >= 0:
                    holders[page] = holders.get(page, 0) + 1
        for page, n in holders.items():
            assert pool.is_used(page), f"group {g}: page {page} is held by {n} request(s) and free"
        tree_pages = {} if cache is None else {p: node for p, node in cache.page_node[g].items()
                                               if node.pages[g] == p}
        for page, n in holders.items():
            node = tree_pages.get(page)
            want = 1 if node is None else node.refs[g]
            assert n == want, f"group {g}: page {page} held by {n} requests, reference count {want}"
        for page, node in tree_pages.items():
            assert node.refs[g] == holders.get(page, 0), f"group {g}: tree page {page} refs {node.refs[g]}"
            assert pool.is_used(page), f"group {g}: tree page {page} is in the free list"
        unheld = sum(1 for p, node in tree_pages.items() if node.refs[g] == 0)
        assert c.reusable == unheld, (g, c, unheld)
        assert c.in_use == len(holders), (g, c, len(holders))
        for seq in held_sequences(mgr):
            blocks = seq.blocks[g]
            rid = next((r for r in mgr.request_ids if mgr._seqs[r] is seq), "an aborted request")
            assert len(blocks) == ceil_div(seq.capacity, tpb), (rid, g, len(blocks), seq.capacity)
            # V1 keeps every block; V2 releases only blocks before the window (and its sinks) or the chunk at
            # this history
            lo, hi = (0, 0) if mgr.kvcm_version == "v1" else stale_blocks(group.window, group.sink_tokens,
                                                                          seq.history, tpb, _chunk(group))
            for i, page in enumerate(blocks):
                if page < 0:
                    assert lo <= i < hi, f"{rid!r} group {g}: block {i} of {len(blocks)} has no page outside the " \
                        f"stale range [{lo}, {hi}) at history {seq.history}"
    check_levels(mgr)
    check_filed(mgr)


def held_sequences(mgr) -> list:
    """Every sequence that holds pages: the live requests', and those of requests freed while a copy from the host
    tier was in flight (they keep their pages until it lands, docs/semantics.md 11.8)."""
    loads = getattr(mgr._reuse, "loads", None)
    return [mgr._seqs[rid] for rid in mgr.request_ids] + ([] if loads is None else loads.held_by_aborted())


def check_filed(mgr) -> None:
    """Every cached page, on either level, belongs to a block a lookup can reach: its node is its parent's child
    under its tokens, up to the root of its scope. A page filed on a block that left the tree is counted as cached
    and can never be found (TensorRT-LLM PR #18095: a commit onto a detached prefix)."""
    cache = mgr._reuse
    if cache is None:
        return
    roots = {id(root) for root in cache.tree.roots.values()}
    reachable: set[int] = set()

    def filed(node) -> bool:
        seen = []
        while id(node) not in reachable and id(node) not in roots:
            parent = node.parent
            if parent is None or cache.tree.child(parent, node.tokens) is not node:
                return False
            seen.append(node)
            node = parent
        reachable.update(id(n) for n in seen)
        return True

    for g in range(len(mgr.pools)):
        for page, node in cache.page_node[g].items():
            if node.pages[g] == page:
                assert filed(node), f"group {g}: cached page {page} is filed on block {node.tokens}, which no " \
                                    "lookup reaches (it left the tree)"
        for row, node in getattr(cache, "host_node", [{}] * len(mgr.pools))[g].items():
            assert filed(node), f"group {g}: host page {row} holds block {node.tokens}, which no lookup reaches"


def check_levels(mgr) -> None:
    """The host tier's books, per group: every host page holds one cached block that names it back, a block is
    resident on one level at a time (never a GPU page and a host page, never left between them), the cached ones
    nobody holds are the reusable (evictable) count, and free + cached = the tier (V1's secondary pool and V2's host
    level alike)."""
    cache = mgr._reuse
    host_nodes = getattr(cache, "host_node", None)
    if host_nodes is None:
        return
    for g, rows in enumerate(host_nodes):
        host = mgr.get_host_block_counts(g)
        for row, node in rows.items():
            assert node.host[g] == row, f"group {g}: host page {row} names a block that is not on it"
            assert node.pages[g] < 0, f"group {g}: a block on host page {row} has GPU page {node.pages[g]} too"
        unheld = sum(1 for node in rows.values() if node.refs[g] == 0)
        assert host.reusable == unheld, f"group {g}: host counts {host} with {unheld} cached host blocks unheld"
        assert host.free + len(rows) == host.total, f"group {g}: host counts {host} with {len(rows)} cached"
        full = mgr.layer_groups[g].is_full
        stack = [(root, True) for _, root in cache.tree.roots.items()]
        while stack:
            node, reachable = stack.pop()
            assert node.host[g] == -1 or rows.get(node.host[g]) is node, \
                f"group {g}: a block in the tree holds host page {node.host[g]}, which holds another block"
            has_page = node.pages[g] >= 0 or node.host[g] >= 0
            # a full-attention group matches a block only through its ancestors: one whose ancestor lost its page
            # on both levels can never be found, yet keeps its page counted (remove_subtree drops it with them)
            assert not (full and has_page and not reachable), \
                f"group {g}: block {node.tokens} keeps a page below an ancestor with none on either level"
            stack.extend((child, reachable and (has_page or node.parent is None)) for child in node.children.values())


def _chunk(group) -> int | None:
    """A chunked-local group's chunk in tokens (its type's field; the arithmetic stays here)."""
    return getattr(group.attention, "chunk", None)


def stale_blocks(window, sinks: int, history: int, tpb: int, chunk: int | None = None) -> tuple[int, int]:
    """Logical blocks [lo, hi) no future query of a window or an attention chunk reads at this history
    (docs/semantics.md 4.1), written out again here rather than asked of ``kvcm.layer_groups``: the in-flight
    token's window starts at ``history + 1 - window``, sink blocks stay; its chunk starts at the multiple of
    ``chunk`` at or below ``history`` (Hugging Face's ``chunked_overlay``: ``k // chunk == q // chunk``)."""
    if chunk is not None:
        return 0, history // chunk * chunk // tpb
    if window is None:
        return 0, 0
    lo = min(ceil_div(history, tpb), ceil_div(sinks, tpb))
    return lo, max(lo, (history + 1 - window) // tpb)


def check_reused_tokens(mgr) -> None:
    """A request holds a cached page only where the page's block is its own tokens: the node's tokens are the
    request's at that position, and the node is that deep in the tree (exact keys, never a collision)."""
    cache, tpb = mgr._reuse, mgr.tokens_per_block
    if cache is None:
        return
    for rid in mgr.request_ids:
        seq = mgr._seqs[rid]
        if seq.reuse is None:
            continue
        tokens = seq.reuse.tokens
        for g, blocks in enumerate(seq.blocks):
            for i, page in enumerate(blocks):
                node = cache.page_node[g].get(page) if page >= 0 else None
                if node is None or node.pages[g] != page:
                    continue
                own = tuple(tokens[i * tpb:i * tpb + len(node.tokens)])
                assert node.depth == i and node.tokens == own, (f"{rid!r} group {g} block {i}: holds the cached "
                                                                f"page of {node.tokens} at depth {node.depth}, its "
                                                                f"own tokens there are {own}")


def all_free_after_reset(mgr) -> None:
    """Free every request, land the copies in flight, reset the prefix cache: every block of every group is free."""
    for rid in list(mgr.request_ids):
        mgr.free_resources(rid)
    mgr.complete_transfers()
    assert mgr.reset_prefix_cache() is True, "reset_prefix_cache refused with every request freed and every " \
                                             "copy landed: pages are still held"
    for g, pool in enumerate(mgr.pools):
        assert pool.num_free == pool.num_blocks, f"group {g}: {pool.num_blocks - pool.num_free} blocks never free"


class RouterIndex:
    """A router's index of ``mgr`` fed its KV cache events (``kvcm.events.shadow``): built from the blocks the
    manager would match now (its earlier events drained), then called after each call, it reads the call's events
    and asserts the index holds exactly the blocks the manager would match."""

    def __init__(self, mgr):
        from kvcm.events.shadow import ShadowIndex, cached_blocks

        mgr.flush_iteration_events()
        mgr.get_latest_events(0)
        self.shadow = ShadowIndex(cached_blocks(mgr))

    def __call__(self, mgr) -> list:
        from kvcm.events.shadow import cached_blocks, differences

        mgr.flush_iteration_events()
        events = mgr.get_latest_events(0)
        problems = differences(self.shadow.apply(events), cached_blocks(mgr))
        assert not problems, f"events {[e.kind for e in events]} leave the router's index wrong: {problems}"
        return events
