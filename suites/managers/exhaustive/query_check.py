"""The queries an engine makes between steps, checked on every new state the explorer reaches.

An engine sizes its next step from these answers without changing anything: the block counts, the credit an
admission would get from the reuse cache, V1's available tokens, and on an empty cache the page-boundary promise
warmup builds its CUDA graphs on. A wrong answer here is a capacity bug even when every call the explorer makes
succeeds, so the search (``search.py``) files an ``AssertionError`` from this module as a "query" violation.
"""

from __future__ import annotations

from .configs import Config
from .ops import Driver, admissions, scope_of


def check_queries(mgr, drv: Driver, cfg: Config, prompts, copy) -> None:
    """What an engine asks between steps: counts that agree, an admission credit within what is held (and none
    under a scope no live request has: only its own requests can hold blocks of a scope), V1's available
    tokens from docs/semantics.md 3 (``min(bound, free blocks * tpb - E - drafts)``). ``copy()``: a copy of
    ``mgr`` for the page-boundary probe, which places a dummy."""
    counts = mgr.get_block_counts()
    assert mgr.get_num_free_blocks() == counts.free + counts.reusable, (mgr.get_num_free_blocks(), counts)
    for g in range(len(mgr.pools)) if cfg.host else ():   # the host tier: every block free or holding one,
        host = mgr.get_host_block_counts(g)                  # in use only while a copy in flight reads it
        reading = len({id(load.node) for load in mgr._reuse.loads.in_flight if load.group == g})
        assert host.free + host.reusable + reading == host.total == cfg.host and host.in_use == reading, \
            (g, host, reading)
        if cfg.version == "v2":     # V2's StorageStatistics of the host level: available = free + evictable
            level = mgr.get_level_statistics(1, g)
            assert (level.total, level.available) == (cfg.host, host.free + host.reusable), (g, level, host)
        stats = mgr.get_kv_cache_stats() if hasattr(mgr, "get_kv_cache_stats") else None
        if stats is not None and hasattr(stats, "offloaded_blocks"):
            assert stats.offloaded_blocks >= stats.onboarded_blocks, stats
    for prompt in prompts:
        credit = mgr.count_reusable_blocks(list(prompt))
        assert 0 <= credit <= min(counts.in_use, (len(prompt) - 1) // cfg.tpb), \
            f"count_reusable_blocks({list(prompt)}) = {credit} with {counts.in_use} blocks held"
        live = {req.scope for req in drv.slots if req is not None and req.ids}
        for kind, options in admissions(cfg).items():
            if scope_of(kind) and scope_of(kind) not in live:
                credit = mgr.count_reusable_blocks(list(prompt), **options)
                assert credit == 0, (f"count_reusable_blocks({list(prompt)}, {options}) = {credit} with no live "
                                     f"request of that scope: it reached another scope's blocks")
    bound = mgr.max_seq_len
    available = mgr.get_num_available_tokens(token_num_upper_bound=bound, max_num_draft_tokens=cfg.draft)
    if cfg.version == "v1":
        free = min(p.num_free + p.num_reusable for p in mgr.pools)
        want = max(0, min(bound, free * cfg.tpb - cfg.extra - cfg.draft))
        assert available == want, f"V1 get_num_available_tokens = {available}, docs/semantics.md 3 gives {want}"
    assert 0 <= available <= bound, available
    if not mgr.request_ids and not mgr._loads_pending() and available:    # an empty cache, as warmup has it
        _probe_page_boundary(copy, cfg, available, bound)

def _probe_page_boundary(copy, cfg: Config, available: int, bound: int) -> None:
    """With no request held, the answer is a promise warmup relies on (docs/semantics.md 4.2, 7): a generation
    dummy of that many tokens (its drafts reserved) fits, and one a block longer does not, unless the answer
    was the bound itself. Probed on a copy."""
    for tokens, fits in ((available, True), (available + cfg.tpb, False)):
        if not fits and (available == bound or tokens > bound):
            break                   # the answer was the bound, or one block more is past max_seq_len
        probe = copy()
        placed = probe.add_dummy_requests(["probe"], token_nums=[tokens], is_gen=True,
                                          max_num_draft_tokens=cfg.draft) is not None
        assert placed == fits, (f"get_num_available_tokens = {available} on an empty cache, and a generation "
                                f"dummy of {tokens} tokens {'does not fit' if fits else 'fits too'}")
