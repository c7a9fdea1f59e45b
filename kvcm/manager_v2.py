"""KVCacheManagerV2: capacity based, one pool per layer group, constraints and a typical step (docs/semantics.md 4).

A request holds a capacity (slots reserved) and a history (slots whose KV is final). ``resize`` moves both;
sliding-window groups release the blocks that fell out of the window, and growth never allocates them.
Every operation costs time in the blocks it changes, never in the pool's size.
"""

from __future__ import annotations

import functools

from .config import KVCacheDesc
from .constraints import (NamedConstraint, generic_constraints, longest_decode, split_quota, split_weights,
                          tokens_quota_per_group, typical_step_batch)
from . import validation
from .errors import BudgetExceededError, ConfigError
from .units import ceil_div
from .manager import BaseKVCacheManager
from .storage_quota import plan_storage
from .policy import Decisions, rule, setting


class KVCacheManagerV2(BaseKVCacheManager):
    """Its pools hand out the most recently freed page, its cached pages leave by ``kvcm.eviction.tree``'s order,
    its host tier is a host level (``kvcm.versions``: the V2 entry's factories)."""

    releases_window_pages = True            # pages a sliding window or a chunk left behind go back (semantics.md 4)
    reserves_max_draft_len = False          # a step reserves its own drafts
    common_max_tokens_across_ranks = False  # each pipeline rank is sized from its own budget
    trtllm_estimation_path = True           # kvcm plan shows TensorRT-LLM's estimation max_tokens (semantics.md 10)

    @staticmethod
    def trtllm_splits_draft_budget(*, separate_draft_engine: bool, vswa: bool) -> bool:
        """TensorRT-LLM's V2 splits max_gpu_total_bytes between target and draft only for a one-model draft with
        its own cache (a two-model draft engine keeps the whole budget, asserted equal)."""
        return not separate_draft_engine

    # ---- constraints and sizing -----------------------------------------------------------------------------
    def _typical_seq_len(self) -> int | None:
        """Generic V2 builds a typical step only when ``avg_seq_len`` is set."""
        return self.kv_cache_config.avg_seq_len

    def _named_constraints(self) -> list[NamedConstraint]:
        policy, limits = self.policy, self.limits
        named = generic_constraints(limits if policy.generic_v2_context_counts_extra
                                    else limits.replace(num_extra_kv_tokens=0))
        return named + [longest_decode(limits)] if policy.generic_v2_longest_decode else named

    def _size_pools(self) -> list[int]:
        cfg, tpb = self.kv_cache_config, self.tokens_per_block
        if cfg.avg_seq_len is not None and cfg.avg_seq_len > self.max_seq_len:
            raise ConfigError("avg_seq_len", cfg.avg_seq_len, f"must be <= max_seq_len={self.max_seq_len}")
        if cfg.pool_ratio is None:
            named = self._named_constraints()
            t = self._typical_seq_len()
            self.typical_step = None if t is None else typical_step_batch(t, self.limits)
        else:  # an explicit ratio is used as given: no floors, no typical step
            named = self._named_constraints()
            if not (self.policy.pool_ratio_keeps_v4_floors and any(c.name == "longest_decode" for c in named)):
                named = []
        self.constraint_names = [c.name for c in named]
        self.constraints = [c.batch for c in named]
        budgets = self._budget_candidates()
        token_bytes = None
        if cfg.max_tokens is not None:
            token_bytes = tokens_quota_per_group(cfg.max_tokens, self.layer_groups, tpb, self.max_batch_size)
            budgets["max_tokens"] = sum(token_bytes)
        self.budget_bytes = min(budgets.values())
        if token_bytes is not None and cfg.pool_ratio is None and self.budget_bytes == budgets["max_tokens"]:
            # the budget *is* "T tokens per full group + B windows per sliding group": split it that way, so a
            # cache asked to hold T tokens holds them (the typical step only shares budgets given in bytes)
            weights = [float(b) for b in token_bytes]
        else:
            weights = split_weights(self.layer_groups, tpb, pool_ratio=cfg.pool_ratio, typical_step=self.typical_step)
        try:
            return split_quota(self.budget_bytes, self.layer_groups, weights, named, tpb)
        except BudgetExceededError as exc:   # the finding: the pool TensorRT-LLM would enlarge to the floors
            raise BudgetExceededError(exc.constraint, exc.needed_bytes, exc.budget_bytes, exc.detail,
                                      trtllm=self.trtllm_storage_plan()) from None

    def trtllm_storage_plan(self):
        """The pools TensorRT-LLM's storage manager would build for this manager's groups, constraints, typical
        step (or ``pool_ratio``) and budget: grain-rounded, floors kept, enlarged past the budget when the floors
        need it (``kvcm.storage_quota``, docs/semantics.md 4.4)."""
        return plan_storage(self.model, self.layer_groups, self.tokens_per_block, self.budget_bytes,
                            constraints=self.constraints, typical_step=self.typical_step,
                            pool_ratio=self.kv_cache_config.pool_ratio, policy=self.policy)

    # ---- the per-request cache ------------------------------------------------------------------------------
    def add_request(self, request_id) -> None:
        """Hold a new request with capacity 0 and history 0."""
        self._new_seq(request_id)

    def resize(self, request_id, capacity: int | None = None, history: int | None = None) -> bool:
        """Move capacity and/or history (None keeps the value).

        Raises ``ValueError`` when history would decrease or exceed capacity. On lack of pages, returns False
        with the previous state untouched.
        """
        seq = self._seq(request_id)
        cap = seq.capacity if capacity is None else capacity
        hist = seq.history if history is None else history
        if type(cap) is not int or type(hist) is not int or cap < 0:  # the per-step path pays two type tests
            cap = validation.count("capacity", cap)
            hist = validation.count("history", hist)
        if hist < seq.history:
            raise ConfigError("history", hist, f"must not decrease below {seq.history}")
        if hist > cap:
            raise ConfigError("history", hist, f"must be <= capacity={cap}")
        tpb = self.tokens_per_block
        target = ceil_div(cap, tpb)
        if self._pages_unchanged(seq, hist, target):
            seq.capacity, seq.history = cap, hist
            return True
        plans = []
        for g, (group, pool, blocks) in enumerate(zip(self.layer_groups, self.pools, seq.blocks)):
            lo, hi = group.stale_range(hist)
            release = [b for b in blocks[target:] if b >= 0]
            stale = range(max(lo, seq.stale_done[g]), min(hi, target, len(blocks)))
            release += [blocks[i] for i in stale if blocks[i] >= 0]
            grow = [i for i in range(len(blocks), target) if not lo <= i < hi]
            gain = len(release) if seq.reuse is None or self._reuse is None else self._reuse.release_gain(g, release)
            if len(grow) > pool.num_available + gain:
                return False
            plans.append((lo, hi, stale, release, grow))
        for g, (pool, blocks, (lo, hi, stale, release, grow)) in enumerate(zip(self.pools, seq.blocks, plans)):
            if seq.reuse is None or self._reuse is None:
                pool.release(release)
            else:
                self._reuse.release(g, release)
            unlist = self.policy.stale_pages_unlisted
            for i in stale:
                if blocks[i] >= 0:
                    self.stale_released[g] += 1
                if unlist:
                    blocks[i] = -1
            del blocks[target:]
            fresh = iter(pool.allocate(len(grow)))
            blocks.extend(-1 if lo <= i < hi else next(fresh) for i in range(len(blocks), target))
            seq.stale_done[g] = max(seq.stale_done[g], min(hi, target))
        seq.capacity, seq.history = cap, hist
        if self._lower_tier_only:          # blocks that left the window may be cached and unheld now
            self._settle()
        return True

    @functools.cached_property
    def _windowed(self) -> list | None:
        """The sliding-window groups (the only ones that release blocks as history moves); None when there are
        none, which most models are and which lets ``resize`` skip the stale check. The groups are fixed at
        construction, so once is enough."""
        return [g for g in self.layer_groups if g.attention.releases_pages] or None

    def _pages_unchanged(self, seq, hist: int, target: int) -> bool:
        """True when a resize to ``target`` blocks at history ``hist`` allocates, releases and marks nothing
        (most decode steps): the general path would then only move the two counters. Every group holds the
        same number of logical blocks (stale ones as -1), so one length says whether any group would grow."""
        if len(seq.blocks[0]) != target:
            return False
        for group in self._windowed or ():
            if min(group.stale_range(hist)[1], target) > seq.stale_done[group.index]:
                return False
        return True

    def _resize_or_raise(self, request_id, capacity: int | None, history: int | None, what: str) -> None:
        if not self.resize(request_id, capacity, history):
            seq = self._seq(request_id)
            cap = seq.capacity if capacity is None else capacity
            needs = [max(0, group.pages_needed(cap, seq.history if history is None else history)
                         - sum(1 for b in blocks if b >= 0))
                     for group, blocks in zip(self.layer_groups, seq.blocks)]
            raise self._out_of_pages(request_id, needs, what)

    # ---- engine paths (docs/semantics.md 4.1) -----------------------------------------------------------------------
    def begin_context_chunk(self, request_id, start: int, num_tokens: int, prompt_len: int, draft_len: int = 0):
        """A chunk of n tokens at position p: ``resize(max(capacity, p + n + E))``."""
        start = validation.count("start", start)
        num_tokens = validation.count("num_tokens", num_tokens)
        validation.count("prompt_len", prompt_len)
        validation.count("draft_len", draft_len)
        created = not self.has_request(request_id)
        if created:
            self._new_seq(request_id)
        seq = self._seq(request_id)
        self._refuse_while_loading(request_id, seq)
        started = seq.reuse is not None and seq.reuse.started
        if seq.reuse is not None:
            seq.reuse.started = True      # its pages are LOCKED from now on (TensorRT-LLM's resume)
        try:
            self._resize_or_raise(request_id, max(seq.capacity, start + num_tokens + self.num_extra_kv_tokens), None,
                                  "context chunk")
        except BaseException:
            if created:
                self.free_resources(request_id)
            elif seq.reuse is not None:   # a refused first chunk leaves the match HELD, as it was
                seq.reuse.started = started if self.policy.refused_chunk_restores_started else True
            raise

    def end_context_chunk(self, request_id, history: int) -> None:
        """After the chunk's forward: its KV is final, so ``history = p + n`` (stale blocks go now, not before).
        A request made with token ids commits its prompt blocks first (the wrapper's ``try_commit_blocks``), and
        at context end the partial last one (``stop_committing``); generated tokens are never committed."""
        seq = self._seq(request_id)
        if seq.reuse is not None and type(history) is int and seq.history <= history <= seq.capacity:
            upto = min(history, seq.reuse.prompt_len)
            self._store(seq, upto, "context", partial=upto == seq.reuse.prompt_len)
        self.resize(request_id, history=history)

    def _release_with_tokens(self, seq) -> None:
        """``close()``: what was committed stays cached (DROPPABLE); a request freed mid-context commits the
        prompt tokens it computed, its partial block included (``stop_committing``)."""
        self._store(seq, min(seq.history, seq.reuse.prompt_len), "release", partial=True)
        self._free_reuse(seq)

    def begin_generation(self, request_id, num_draft: int = 0) -> None:
        """A generation step with d draft slots: ``resize(capacity + 1 + d)``."""
        if type(num_draft) is not int or num_draft < 0:
            num_draft = validation.count("num_draft", num_draft)
        seq = self._seq(request_id)
        capacity = seq.capacity + 1 + num_draft
        if capacity <= len(seq.blocks[0]) * self.tokens_per_block:
            # within the blocks it holds (every group holds ceil(capacity / tpb)): what resize would do, minus
            # its checks, which a growing capacity at the same history passes
            seq.capacity = capacity
            return
        self._resize_or_raise(request_id, capacity, None, "generation")

    def end_generation(self, request_id, num_tokens: int, num_draft: int = 0, num_accepted: int = 0) -> None:
        """``resize(capacity - max(d - a, 0), history = num_tokens - 1)``."""
        # the engine calls this for every sequence every step: plain ints are tested inline (validation.plain's
        # test, without the call); anything else takes the explaining checks
        if not (type(num_tokens) is int and type(num_draft) is int and type(num_accepted) is int
                and num_tokens >= 1 and 0 <= num_accepted <= num_draft):
            num_tokens = validation.count("num_tokens", num_tokens, 1)
            num_draft = validation.count("num_draft", num_draft)
            num_accepted = validation.count("num_accepted", num_accepted, 0, num_draft, "num_draft")
        seq = self._seq(request_id)
        capacity, history = seq.capacity - (num_draft - num_accepted), num_tokens - 1   # checked: a <= d
        if seq.history <= history <= capacity and capacity > (len(seq.blocks[0]) - 1) * self.tokens_per_block \
                and self._windowed is None:
            # the same blocks and no sliding group to release from: resize would only move the two counters
            seq.capacity, seq.history = capacity, history
            return
        self.resize(request_id, capacity, history)

    # ---- queries --------------------------------------------------------------------------------------------
    def get_num_available_tokens(self, *, token_num_upper_bound: int, batch_size: int = 1,
                                 max_num_draft_tokens: int = 0) -> int:
        """``clamp(batch_size, upper_bound + extra) - extra`` with ``extra = E + drafts`` (docs/semantics.md 4.2).

        The answer is the bound itself or a multiple of tpb less ``extra``: exactly a page boundary. Like
        TensorRT-LLM it sizes an otherwise empty cache: requests held besides warmup's short dummies are not
        taken away.
        """
        if not (validation.plain(token_num_upper_bound, batch_size, max_num_draft_tokens) and batch_size >= 1):
            token_num_upper_bound = validation.count("token_num_upper_bound", token_num_upper_bound)
            batch_size = validation.count("batch_size", batch_size, 1)
            max_num_draft_tokens = validation.count("max_num_draft_tokens", max_num_draft_tokens)
        extra = self.policy.available_extra(self.num_extra_kv_tokens, max_num_draft_tokens)
        result = self._clamp(batch_size, self.policy.clamp_bound(token_num_upper_bound, extra), extra) - extra
        if self.kv_cache_config.max_tokens is not None:
            result = min(result, self.kv_cache_config.max_tokens - extra)
        return max(0, result)

    def _clamp(self, batch_size: int, upper: int, extra: int) -> int:
        """Largest capacity the last of ``batch_size`` requests can take when the other ``batch_size - 1`` hold
        one token each (TensorRT-LLM's ``clamp_max_seq_len_for_mem``, docs/semantics.md 4.2).

        It starts from each pool's *total* blocks, not its free ones: warmup holds its ``bs - 1`` short dummies
        before it asks, and counting their blocks from the free ones as well took them away twice.
        """
        tpb = self.tokens_per_block
        shorts = batch_size - 1
        avail = [self.policy.clamp_blocks(g.num_blocks, pool.num_free, g.pages_needed(1, 1) * shorts)
                 for g, pool in zip(self.layer_groups, self.pools)]
        if any(a < 1 for a in avail):
            return 0
        if self.policy.clamp_skips_stale_pages:
            def needed(g, capacity, history, tpb):
                return g.pages_needed(capacity, history)
        else:               # every block of the sequence, the stale window blocks too
            def needed(g, capacity, history, tpb):
                return ceil_div(capacity, tpb)

        def fits(capacity: int) -> bool:
            history = max(0, capacity - extra - 1)
            return all(needed(g, capacity, history, tpb) <= a for g, a in zip(self.layer_groups, avail))

        if fits(upper):
            return upper
        lo, hi = 0, ceil_div(upper, tpb) - 1  # largest b with fits(b * tpb): O(log blocks)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid * tpb):
                lo = mid
            else:
                hi = mid - 1
        return lo * tpb

    def _dummy_blocks(self, token_num: int, is_gen: bool, reserve: int) -> list[int]:
        capacity = token_num + self.num_extra_kv_tokens + (reserve if is_gen else 0)
        history = token_num - 1 if is_gen else 0
        return [g.pages_needed(capacity, history) for g in self.layer_groups]

    def _place_dummy(self, request_id, token_num: int, is_gen: bool, reserve: int) -> bool:
        """Generation: ``resize(token_num + E, history=token_num - 1)`` then ``+ K``: capacity ``token_num + E + K``."""
        e = self.num_extra_kv_tokens
        if not is_gen:
            return self.resize(request_id, token_num + e, 0)
        if not self.resize(request_id, token_num + e, token_num - 1):
            return False
        return self.resize(request_id, self.get_capacity(request_id) + reserve, token_num - 1)

    def kv_cache_desc(self, request_id) -> KVCacheDesc:
        seq = self._seq(request_id)
        return KVCacheDesc(seq.capacity, seq.history)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class V2Decisions(Decisions):
    SUBSYSTEM = "V2 constraints, clamp and chunks"

    generic_v2_longest_decode = setting(
        False, "whether generic V2 has a longest-decode constraint floor: no, it is DeepSeek-V4's alone (TensorRT-LLM "
        "PR #16545 moved it into generic V2 and inflated every ordinary model's estimation pool; PR #19213 scoped it "
        "back)")

    generic_v2_context_counts_extra = setting(
        True, "whether generic V2's context (chunked-prefill) floor counts the extra KV tokens: max_num_tokens + E "
        "(TensorRT-LLM PR #16173: the DSV4 context constraint was sized without num_extra_kv_tokens)")

    stale_pages_unlisted = setting(
        True, "whether a page the sliding window released leaves the request's block table (-1): kept listed, the "
        "request's release frees it a second time and its store files it as a cached block, though the pool may "
        "already have handed it to another request (SGLang PR #31486: PureSWARadixCache re-inserted window-evicted "
        "KV at cache_finished_req, a stale-KV hit and a double free)")

    pool_ratio_keeps_v4_floors = setting(
        False, "whether an explicit kv_cache_config.pool_ratio keeps DeepSeek-V4's constraint floors (those with its "
        "longest decode): no, the ratio is used as given with no floors at all (TensorRT-LLM PR #19213's explicit "
        "opt-out; before it only generic V2's floors were dropped)")

    @rule("the capacity V2's clamp is asked for: the bound plus the extra slots, so a bound that fits comes back "
          "whole (TensorRT-LLM PR #13935 clamped the bound itself)")
    def clamp_bound(token_num_upper_bound: int, extra: int) -> int:
        return token_num_upper_bound + extra

    @rule("the blocks of one pool V2's clamp gives the batch's long request: the pool's total less the short "
          "requests' blocks (clamp_max_seq_len_for_mem starts from storage.num_slots; from the free blocks, "
          "warmup's short dummies were taken away twice)")
    def clamp_blocks(num_blocks: int, num_free: int, short_blocks: int) -> int:
        return num_blocks - short_blocks

    clamp_skips_stale_pages = setting(
        True, "whether the clamp's long request needs, in a sliding group, only its capacity less the window blocks "
        "already stale (its attention type's pages_needed), not every block of the sequence (vLLM PR #40946: a "
        "sliding-window gate budgeting the full sequence refused requests that fit)")

    refused_chunk_restores_started = setting(
        True, "whether a request made by add_sequence whose first context chunk was refused counts as started (its "
        "pages LOCKED, not HELD) only as it did before the call, since a refused call changes nothing "
        "(docs/semantics.md 11.2; V2 marked it started before it knew the chunk fit, issue 39)")
