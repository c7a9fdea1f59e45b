"""The block-reuse API every manager has (``BaseKVCacheManager`` inherits it; /docs/semantics.md 11).

A request reuses only when it is made with ``add_sequence`` and its token ids: every other request (made by a
context chunk, ``add_request`` or a warmup dummy) is never matched or stored, so an engine that never passes
token ids sees the managers exactly as they were. The version's choices come from its reuse rules
(``_reuse_rules``, built from the version's entry in ``kvcm.versions``).
"""

from __future__ import annotations

import operator

from .. import validation
from ..policy import Decisions, rule, setting
from ..errors import ConfigError, OutOfPagesError
from ..units import ceil_div
from . import host_switches
from .cache import ReuseCache  # noqa: F401  (the type the managers' _reuse is)
from .version_rules import find_match, store
from .retention import DEFAULT_RETENTION_PRIORITY, KvCacheRetentionConfig
from .state import ReuseState
from .transfers import Load, TransferMixin
from .queries import ReuseQueriesMixin
from .stats import ReuseCounters


def _token_ids(field: str, token_ids, *, allow_empty: bool = False) -> list[int]:
    if isinstance(token_ids, (str, bytes)) or not hasattr(token_ids, "__iter__"):
        raise ConfigError(field, token_ids, "must be a list of token ids (non-negative integers)")
    out = list(token_ids)
    if out and set(map(type, out)) == {int} and min(out) >= 0:   # the common case, checked at C speed
        return out
    for i, t in enumerate(out):
        if type(t) is not int:
            if isinstance(t, bool):
                raise ConfigError(f"{field}[{i}]", t, "must be a token id (a non-negative integer), not a bool")
            try:
                t = out[i] = operator.index(t)
            except TypeError:
                raise ConfigError(f"{field}[{i}]", t, "must be a token id (a non-negative integer), "
                                  f"not {type(t).__name__}") from None
        if t < 0:
            raise ConfigError(f"{field}[{i}]", t, "must be a token id (a non-negative integer)")
    if not out and not allow_empty:
        raise ConfigError(field, out, "must hold at least one token id")
    return out


def _scope(lora_task_id, cache_salt, policy) -> tuple:
    """The key of the root a request's blocks are filed under, from its LoRA task id and cache salt (each None or
    checked): the policy's ``reuse_scope``."""
    if lora_task_id is not None:
        validation.count("lora_task_id", lora_task_id)
    if cache_salt is not None:
        try:
            hash(cache_salt)
        except TypeError:
            raise ConfigError("cache_salt", cache_salt, "must be hashable (a string or an int), not "
                              f"{type(cache_salt).__name__}") from None
    return policy.reuse_scope(lora_task_id, cache_salt)


class ReuseMixin(TransferMixin, ReuseQueriesMixin):
    def _init_reuse(self) -> None:
        """The version's reuse rules and, with block reuse on, its reuse cache (``kvcm.versions``: the entry's
        factories); ``host_cache_size`` puts the version's host tier behind the GPU pools, or is refused."""
        cfg, version = self.kv_cache_config, self._version
        host_tier = version.host_tier_class
        if cfg.host_cache_size and host_tier is None:
            raise ConfigError("host_cache_size", cfg.host_cache_size, f"must be None or 0 for "
                              f"{type(self).__name__}: {version.no_host_tier}")
        if cfg.host_cache_size and cfg.host_eviction_policy not in host_tier.host_eviction_policies:
            raise ConfigError("host_eviction_policy", cfg.host_eviction_policy, f"must be one of "
                              f"{host_tier.host_eviction_policies} for {type(self).__name__}: its host tier keeps "
                              "its own order")
        self._reuse_rules = version.reuse_rules()
        host_switches.check_config(cfg)
        self._reuse: ReuseCache | None = None
        if cfg.enable_block_reuse:
            self._reuse = self._make_reuse_cache()
            host_switches.check_built(cfg, self._reuse)
        self._lower_tier_only = cfg.lower_tier_only
        self._reuse_totals = ReuseCounters()
        self._compress_ratios = tuple(sorted({self.model.layers[i].compress_ratio
                                              for g in self.layer_groups for i in g.layers}))

    def _make_reuse_cache(self):
        """The version's reuse cache over its pools, with its host tier when ``host_cache_size`` gives it pages."""
        version, cfg = self._version, self.kv_cache_config
        leaf_only = self._reuse_rules.leaf_only(self.layer_groups)
        host_tier = version.host_tier_class
        if host_tier is not None and cfg.host_cache_size:
            cache = host_tier.sized(self.pools, self.layer_groups, leaf_only, cfg, order=version.eviction_order,
                                    policy=self.policy)
            if cache is not None:
                return cache
        return version.reuse_cache_class(self.pools, self.layer_groups, leaf_only, order=version.eviction_order,
                                         policy=self.policy)

    @property
    def enable_block_reuse(self) -> bool:
        return self._reuse is not None

    @property
    def enable_partial_reuse(self) -> bool:
        """Partial reuse as this manager applies it: asked for, and allowed (DeepSeek-V4's compressed groups
        turn it off whatever the config says)."""
        return self._reuse is not None and self.policy.partial_reuse_allowed(self.kv_cache_config.enable_partial_reuse,
                                                                        self._compress_ratios)

    # ---- a request with token ids ------------------------------------------------------------------------
    def add_sequence(self, request_id, token_ids, *, lora_task_id=None, cache_salt=None, retention_config=None) -> int:
        """Make the request, take its cached prefix and return the prepopulated prompt length (tokens whose KV
        is already in its blocks, always below ``len(token_ids)``). All or nothing: OutOfPagesError (a partial
        copy or a page to fill needs a block that is not there) leaves every count, the tree and the pools as
        they were."""
        validation.request_id(request_id)
        if request_id in self._seqs:
            raise ConfigError("request_id", request_id, "is already held by this manager")
        tokens = _token_ids("token_ids", token_ids)
        validation.count("token_ids", len(tokens), 1, self.max_seq_len, "max_seq_len; the value is the length")
        if retention_config is None:
            retention = KvCacheRetentionConfig()
        elif isinstance(retention_config, KvCacheRetentionConfig):
            retention = retention_config
        else:
            raise ConfigError("retention_config", retention_config, "must be a kvcm.KvCacheRetentionConfig or None")
        state = ReuseState(tokens, _scope(lora_task_id, cache_salt, self.policy), len(tokens), retention.priority,
                           retention.decode_priority, retention_config is not None,
                           retention.per_block(self.tokens_per_block, len(tokens), self.policy)
                           if retention_config is not None else [], retention.decode_duration_ms)
        tpb = self.tokens_per_block
        cache = self._reuse
        reported = self._reported_group()          # the group the counters describe, chosen before the match
        fresh_before = self.pools[reported].num_free
        if cache is None:
            blocks = [[] for _ in self.layer_groups]
            match, length, window_at = None, 0, 0
        else:
            match = self._find(state, tokens)
            length = match.length(tpb)
            window_at = self._window_history(length, state)
            blocks, loads = self._take(request_id, match, state, window_at)
            state.path = list(match.nodes)
        seq = self._new_seq(request_id)
        seq.blocks = blocks
        seq.reuse = state
        if match is not None and loads:
            self._start_loads(seq, loads)
        seq.capacity = seq.history = state.prepopulated = length
        if match is not None:
            for group in self.layer_groups:
                if not group.is_full:
                    seq.stale_done[group.index] = min(group.stale_range(window_at)[1], len(blocks[group.index]))
        context = ceil_div(len(tokens), tpb)
        matched = 0 if match is None else len(match.nodes) + (match.partial is not None)
        # reused: the blocks the reported group takes (V2 leaves a sliding group's blocks before the window alone;
        # TensorRT-LLM test_swa_context_reuse_stats_skip_stale_prefix_blocks counts 2 of a 16-token hit, window 8)
        group = self.layer_groups[reported]
        reused = 0 if match is None else (len(match.nodes) - len(self._skipped(group, window_at, len(match.nodes)))
                                          + (match.partial is not None))
        copied = 0 if match is None else int(match.partial is not None and not match.in_place)
        onboarded = 0 if match is None else state.onboarded[reported]
        c = state.counters
        c.reused_blocks, c.missed_blocks = reused, context - matched
        # TensorRT-LLM counts a block in alloc_total each time one is taken from the free pool (a miss or a partial
        # copy) and in alloc_new when it held no cached tokens (it did not evict a cached block)
        c.alloc_total_blocks = context - matched + copied + onboarded   # an onboard takes a GPU block too
        c.reused_host_blocks = onboarded
        # V2 counts a page migrated back from the host as a new allocation as well (_record_migrated_slots)
        migrated = onboarded if getattr(cache, "migration_is_new_allocation", False) else 0
        c.alloc_new_blocks = min(c.alloc_total_blocks - migrated, fresh_before) + migrated
        c.reused_tokens, c.queried_tokens = length, len(tokens)
        self._reuse_totals.add(c)
        self._settle()
        return length

    def _settle(self) -> None:
        """After a call that may leave cached blocks unheld: in lower-tier-only mode each goes to the host tier
        now (docs/semantics.md 11.8), so no hit is ever served from the GPU."""
        if self._lower_tier_only:
            self._reuse.demote_unheld()

    def _find(self, state: ReuseState, tokens: list[int]):
        cfg = self.kv_cache_config
        lookup = tokens[:self.policy.lookup_length(len(tokens))]
        return find_match(self._reuse, self._reuse.tree.root(state.scope), lookup, self.tokens_per_block,
                          self.layer_groups, self._reuse_rules, partial=self.enable_partial_reuse,
                          copy_on_partial_reuse=cfg.copy_on_partial_reuse)

    def _take(self, request_id, match, state: ReuseState, window_at: int) -> tuple[list[list[int]], list[Load]]:
        """Claim the match's pages (and copy or take over the partial block): checked first, then done. Returns the
        tables and, with ``async_onboard``, the copies from the host tier left in flight (else none: done here).
        The match is claimed before any fresh page is taken (the policy's ``claim_match_first``), so the
        allocation can never evict a block this hit is about to hold."""
        cache, rules, tpb = self._reuse, self._reuse_rules, self.tokens_per_block
        plans, needs = [], []
        for group, pool in zip(self.layer_groups, self.pools):
            g = group.index
            nodes = match.of_group(g)
            skipped = self._skipped(group, window_at, len(nodes))
            # each block is a GPU page to claim, a host block to bring back, or a fresh page: decided here, once
            plan = [(i, node, "gpu" if node.pages[g] >= 0 else "host" if node.host[g] >= 0 else "fresh")
                    for i, node in enumerate(nodes) if i not in skipped]
            fresh = sum(1 for _, _, where in plan if where != "gpu")
            fresh += int(match.partial is not None and not match.in_place)
            unheld = sum(1 for _, node, where in plan if where == "gpu" and node.refs[g] == 0)
            if match.partial is not None and match.partial.refs[g] == 0:
                unheld += 1        # taken over in place, or held while it is copied
            if fresh > pool.num_available - unheld:
                raise OutOfPagesError(request_id, g, fresh, pool.num_available - unheld, "reuse: partial copy")
            plans.append(plan)
            needs.append(fresh)
        tables = []
        state.onboarded = [0] * len(self.pools)
        taken = None if self.policy.claim_match_first else [pool.allocate(n) for pool, n in zip(self.pools, needs)]
        for group, pool, plan in zip(self.layer_groups, self.pools, plans):
            g = group.index
            table = [-1] * len(match.of_group(g))
            for i, node, where in plan:
                if where == "gpu":
                    table[i] = cache.claim(node, g)
                elif where == "host":            # in the host tier: held now, onboarded into a fresh page below
                    cache.claim_host(node, g)
                    table[i] = -3
                    state.onboarded[g] += 1
                else:
                    table[i] = -2                # a fresh page, below
            tables.append(table)
        cache.events.claimed(cache, match.nodes + ([match.partial] if match.partial is not None else []),
                             state.context_retention)
        rules.retain_claimed(match.nodes, state, tpb, self.policy)
        source = match.partial
        if source is not None and match.in_place:      # the block keeps its priority unless a range sets one
            i = len(match.nodes)
            p, d = state.context_retention[i] if i < len(state.context_retention) else (None, None)
            state.kept_retention[i] = (source.priority if p is None else p, d)
        for g, table in enumerate(tables):
            if source is not None and match.in_place:      # the leaf leaves the tree, now private
                with cache.events.silenced(not self.policy.in_place_take_announced):
                    table.append(cache.unset_page(source, g, free=False))
            elif source is not None:
                cache.claim(source, g)       # held while the copy's page is found: never its own victim
        loads = []
        later = self.kv_cache_config.async_onboard
        for g, (pool, table, need) in enumerate(zip(self.pools, tables, needs)):
            fresh = iter(pool.allocate(need) if taken is None else taken[g])
            for i, page in enumerate(table):
                if page == -2:
                    table[i] = next(fresh)
                elif page == -3 and later:       # the copy is left in flight: the page is the request's meanwhile
                    table[i] = next(fresh)
                    loads.append(Load(None, g, match.of_group(g)[i], table[i]))
                elif page == -3:
                    table[i] = cache.onboard(match.of_group(g)[i], g, next(fresh))
            if source is not None and not match.in_place:
                table.append(next(fresh))
                self._copy_rows(g, source.pages[g], table[-1], match.partial_len)
                cache.unclaim(source, g)
        return tables, loads

    def _window_history(self, length: int, state: ReuseState) -> int:
        """The history at which a hit of ``length`` tokens leaves a sliding group's stale blocks alone (the policy's
        ``match_window_history``): the matched length, where the request's first computed token sits."""
        return self.policy.match_window_history(length, state.prompt_len)

    def _skipped(self, group, length: int, n: int) -> range:
        """The indices below ``n`` of a ``length``-token match that ``group`` leaves alone (the version rules' ``skipped``)."""
        r = self._reuse_rules.skipped(group, length)
        return range(min(r.start, n), min(r.stop, n))

    def _copy_rows(self, g: int, src: int, dst: int, n: int) -> None:
        """The partial copy (real pools only): the whole page, every layer of the group in one copy, as
        TensorRT-LLM's ``copyBlock`` copies a block. Only the first ``n`` token rows matter; the request writes
        the rows after them before it reads them. One copy rather than one per layer and row range: an
        admission runs on the host between two steps, and thirty small copies a request cost the overlapped
        loop's host time."""
        storage = self.pools[g].storage
        if storage is not None:
            storage[dst].copy_(storage[src])

    def get_prepopulated_prompt_len(self, request_id) -> int:
        state = self._seq(request_id).reuse
        return 0 if state is None else state.prepopulated

    def append_tokens(self, request_id, token_ids) -> None:
        """The tokens a generation step accepted. V1 stores each block as it fills (its KV is final once
        history passes it: call this after ``end_generation``); V2's wrapper stores prompt tokens only."""
        seq = self._seq(request_id)
        if seq.reuse is None:
            raise ConfigError("request_id", request_id, "was not made by add_sequence with token ids; "
                              "append_tokens needs a request whose tokens the manager knows")
        state = seq.reuse
        state.tokens.extend(_token_ids("token_ids", token_ids, allow_empty=True))
        self._on_decode_tokens(seq)

    def _on_decode_tokens(self, seq) -> None:
        """Overridden by V1 (decode stores); V2 stores nothing after the prompt."""

    def _store(self, seq, upto: int, when: str, *, partial: bool) -> None:
        if self._reuse is None or upto <= 0:
            return
        rules = self._reuse_rules
        store(self._reuse, seq.reuse, seq.blocks, upto, rules.store_groups(self.layer_groups, when),
              partial=partial, rebase=rules.rebase, tpb=self.tokens_per_block)
        self._reuse.events.end_store()       # V1: one stored event a store call and group

    def _free_reuse(self, seq) -> None:
        """Give back a request made with token ids: tree pages lose a reference, private pages go free."""
        cache = self._reuse
        for g, (pool, blocks) in enumerate(zip(self.pools, seq.blocks)):
            if cache is None:
                pool.release(blocks)
            else:
                cache.release(g, blocks, seq.reuse.block_priorities(len(blocks), self.tokens_per_block))

    # ---- what a prompt would reuse ---------------------------------------------------------------------
    def count_reusable_blocks(self, token_ids, *, lora_task_id=None, cache_salt=None,
                              only_allocated: bool = True) -> int:
        """Whole blocks of this prompt's cached prefix an admission may credit (TensorRT-LLM
        ``countReusableBlocks``): with ``only_allocated``, only blocks a running request holds, since cached
        blocks nobody holds are in the free count already. Changes nothing."""
        tokens = _token_ids("token_ids", token_ids)
        # a prompt no request can hold is a mistake, not a prompt with no cached prefix (add_sequence refuses it)
        validation.count("token_ids", len(tokens), 0, self.max_seq_len, "max_seq_len; the value is the length")
        validation.flag("only_allocated", only_allocated)
        if self._reuse is None:
            return 0
        scope = _scope(lora_task_id, cache_salt, self.policy)
        state = ReuseState(tokens, scope, len(tokens), DEFAULT_RETENTION_PRIORITY, DEFAULT_RETENTION_PRIORITY, False)
        match = self._find(state, tokens)
        return self.policy.reusable_credit([min(node.refs) for node in match.nodes], only_allocated)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class ReuseApiDecisions(Decisions):
    SUBSYSTEM = "block reuse: admission"

    @rule("the key of the root a request's blocks are filed and found under: its LoRA task id and cache salt, each "
          "in its own place (vLLM #44701 / PR #44706: LoRA names and cache salts went untagged into one list of extra "
          "keys, so LoRA 'X' and salt 'X' shared a first block and a base-model request read a LoRA's KV)")
    def reuse_scope(lora_task_id, cache_salt) -> tuple:
        return (lora_task_id, cache_salt)

    @rule("the history at which a hit's sliding-window groups leave their stale blocks unclaimed: the matched "
          "length, where the first computed token sits, so every block its window reads is held (SGLang PR #34870: "
          "the SWA eviction frontier was sized from the request's token count while an EAGLE bigram key, one entry "
          "shorter, set the cached boundary; the cached tail kept less than a window of live KV)")
    def match_window_history(matched_tokens: int, num_tokens: int) -> int:
        return matched_tokens

    claim_match_first = setting(
        True, "whether a hit claims its matched blocks before it takes fresh pages for the rest (TensorRT-LLM "
        "loadOrAllocateBlocks: claimBlock on each matched block, getFreeBlock after it); allocating first let the "
        "allocation evict the very blocks the hit was about to claim (TensorRT-LLM #17926: the eviction walk "
        "detached the committing request's own blocks)")
