"""KVCacheManagerV1: token counting (docs/semantics.md 3).

A request holds a token count and ``ceil(count / tpb)`` blocks in every pool (one pool per window); all pools
have the same number of blocks, so one V1 "block" spans every layer. V1 has no constraints, no typical step
and never releases stale sliding-window blocks (a simplification: the window only bounds what attention reads).
"""

from __future__ import annotations

from . import validation
from .errors import OutOfPagesError
from .units import ceil_div
from .manager import BaseKVCacheManager
from .policy import Decisions, rule, setting
from .retention_clock import RetentionClock, reads_clock


class KVCacheManagerV1(BaseKVCacheManager):
    """Its pools keep TensorRT-LLM's free queue (ids and eviction order as BlockManagerReuseTest pins), its host
    tier is the secondary pool (``kvcm.versions``: the V1 entry's factories)."""

    releases_window_pages = False          # a request keeps every page of every group: ceil(len / page) each
    reserves_max_draft_len = True          # a context chunk reserves max_draft_len draft slots, whatever it drafts
    common_max_tokens_across_ranks = True  # every pipeline rank takes the fewest ranks' max_tokens
    trtllm_estimation_path = False         # kvcm plan shows no TensorRT-LLM estimation max_tokens (semantics.md 10)

    @staticmethod
    def trtllm_splits_draft_budget(*, separate_draft_engine: bool, vswa: bool) -> bool:
        """TensorRT-LLM's V1 splits max_gpu_total_bytes between target and draft only when the layout has variable
        windows (otherwise one shared max_tokens sizes both)."""
        return vswa

    def _init_reuse(self) -> None:
        """One ``RetentionClock`` for every pool, the host tier's included (it takes the GPU pools' clock)."""
        clock = RetentionClock()
        for pool in self.pools:
            pool.clock = clock
        super()._init_reuse()

    def _size_pools(self) -> list[int]:
        cfg, tpb = self.kv_cache_config, self.tokens_per_block
        bytes_per_block = sum(g.bytes_per_block for g in self.layer_groups)
        budgets = self._budget_candidates()
        candidates = {name: b // bytes_per_block for name, b in budgets.items()}
        if cfg.max_tokens is not None:  # whole blocks only, as TensorRT-LLM's calculate_max_num_blocks floors
            candidates["max_tokens"] = self.policy.v1_blocks_for_max_tokens(cfg.max_tokens, tpb)
        blocks = min(candidates.values())
        if cfg.max_tokens is not None:
            budgets["max_tokens"] = candidates["max_tokens"] * bytes_per_block
        self.budget_bytes = min(budgets.values())
        return [blocks] * len(self.layer_groups)

    # ---- token counting -------------------------------------------------------------------------------------
    def _set_tokens(self, request_id, tokens: int, what: str) -> None:
        """Grow or shrink the request to ``tokens`` slots in every pool; raises with nothing changed."""
        seq = self._seq(request_id)
        target = self.policy.v1_blocks_for_tokens(tokens, self.tokens_per_block)
        have = len(seq.blocks[0])
        if target > have:
            need = target - have
            if any(pool.num_available < need for pool in self.pools):
                raise self._out_of_pages(request_id, [need] * len(self.pools), what)
            taken = []
            try:
                for pool in self.pools:
                    taken.append(pool.allocate(need))
            except BaseException:      # all or nothing: no group keeps a page another group could not match
                for pool, pages in zip(self.pools, taken):
                    pool.release(pages)
                raise
            for blocks, pages in zip(seq.blocks, taken):
                blocks.extend(pages)
        elif target < have:
            front = self.policy.rewind_to_front                                       # removeToken
            for g, (blocks, pool) in enumerate(zip(seq.blocks, self.pools)):
                if seq.reuse is None or self._reuse is None:
                    pool.release(blocks[target:], front=front)
                else:
                    kept = seq.reuse.block_priorities(len(blocks), self.tokens_per_block)[target:]
                    self._reuse.release(g, blocks[target:], kept, front=front)
                del blocks[target:]
        seq.capacity = tokens

    def add_tokens(self, request_id, n: int) -> None:
        n = validation.count("n", n)
        self._set_tokens(request_id, self.get_capacity(request_id) + n, f"add {n} tokens")

    def rewind(self, request_id, n: int) -> None:
        seq = self._seq(request_id)
        n = validation.count("rewind", n, 0, seq.capacity - seq.history, "tokens past history")
        self._set_tokens(request_id, seq.capacity - n, f"rewind {n}")

    # ---- engine paths ---------------------------------------------------------------------------------------
    def begin_context_chunk(self, request_id, start: int, num_tokens: int, prompt_len: int, draft_len: int = 0):
        """The first chunk reserves the whole context: ``prompt_len + E + draft_len`` tokens."""
        validation.count("start", start)
        validation.count("num_tokens", num_tokens)
        prompt_len = validation.count("prompt_len", prompt_len)
        draft_len = validation.count("draft_len", draft_len)
        if self.has_request(request_id):
            seq = self._seq(request_id)
            self._refuse_while_loading(request_id, seq)
            if seq.reuse is not None and not seq.reuse.started:   # made by add_sequence: reserve now
                self._set_tokens(request_id, max(seq.capacity, prompt_len + self.num_extra_kv_tokens + draft_len),
                                 "context")
                seq.reuse.started = True
            return
        self._new_seq(request_id)
        try:
            self._set_tokens(request_id, prompt_len + self.num_extra_kv_tokens + draft_len, "context")
        except BaseException:
            self.free_resources(request_id)
            raise

    def end_context_chunk(self, request_id, history: int) -> None:
        seq = self._seq(request_id)
        seq.history = validation.count("history", history, seq.history, seq.capacity, "history so far, capacity")
        state = seq.reuse
        if state is not None and seq.history >= state.prompt_len:
            # context end: TensorRT-LLM's storeContextBlocks, full blocks of the prompt less its last token
            self._store_full(seq, "context")

    def _store_full(self, seq, when: str) -> None:
        state = seq.reuse
        upto = min(len(state.tokens) - 1, seq.history)
        if upto // self.tokens_per_block > state.stored_full:
            self._store(seq, upto, when, partial=False)
            state.stored_full = upto // self.tokens_per_block

    def _on_decode_tokens(self, seq) -> None:
        """TensorRT-LLM's storeNewBlock: a block is stored once its tokens (less the newest) have final KV."""
        self._store_full(seq, "decode")

    def _release_with_tokens(self, seq) -> None:
        """TensorRT-LLM's releaseBlocks: every block of the tokens less the last, the partial one included."""
        self._store(seq, min(len(seq.reuse.tokens) - 1, seq.history), "release", partial=True)
        self._free_reuse(seq)

    def begin_generation(self, request_id, num_draft: int = 0) -> None:
        """Reserve ``1 + max(num_draft, K)`` tokens, K = ``max_draft_len`` (draft slots V1 always reserves)."""
        seq = self._seq(request_id)
        if type(num_draft) is not int or num_draft < 0:
            num_draft = validation.count("num_draft", num_draft)
        reserve = max(num_draft, self.limits.max_draft_len)
        tokens = seq.capacity + 1 + reserve
        if tokens <= len(seq.blocks[0]) * self.tokens_per_block:
            seq.capacity = tokens     # within the blocks it holds (ceil(capacity / tpb) in every pool)
        else:
            self._set_tokens(request_id, tokens, "generation")
        seq.reserved_draft = reserve

    def end_generation(self, request_id, num_tokens: int, num_draft: int = 0, num_accepted: int = 0) -> None:
        """Rewind the reserved draft slots that were not accepted; history = ``num_tokens - 1``."""
        seq = self._seq(request_id)
        if not (type(num_draft) is int and type(num_accepted) is int and 0 <= num_accepted <= num_draft):
            num_draft = validation.count("num_draft", num_draft)
            num_accepted = validation.count("num_accepted", num_accepted, 0, num_draft, "num_draft")
        capacity = seq.capacity - max(seq.reserved_draft - num_accepted, 0)
        if not (type(num_tokens) is int and seq.history < num_tokens <= capacity + 1):
            validation.count("num_tokens", num_tokens, seq.history + 1, capacity + 1,
                             "history so far + 1, capacity after the rewind + 1")
        history = num_tokens - 1
        if capacity != seq.capacity:
            self._set_tokens(request_id, capacity, "rewind")
        seq.reserved_draft = 0
        seq.history = history

    # ---- queries --------------------------------------------------------------------------------------------
    def get_num_available_tokens(self, *, token_num_upper_bound: int, batch_size: int = 1,
                                 max_num_draft_tokens: int = 0) -> int:
        """``min(upper_bound, free_blocks * tpb - E - drafts)``; ``batch_size`` is checked and ignored."""
        if not (validation.plain(token_num_upper_bound, batch_size, max_num_draft_tokens) and batch_size >= 1):
            token_num_upper_bound = validation.count("token_num_upper_bound", token_num_upper_bound)
            validation.count("batch_size", batch_size, 1)
            max_num_draft_tokens = validation.count("max_num_draft_tokens", max_num_draft_tokens)
        policy = self.policy
        free = min(pool.num_free + pool.num_reusable for pool in self.pools)   # cached unheld blocks count
        available = (free * self.tokens_per_block
                     - policy.available_extra(self.num_extra_kv_tokens, max_num_draft_tokens))
        return max(0, min(token_num_upper_bound, available))

    def _dummy_blocks(self, token_num: int, is_gen: bool, reserve: int) -> list[int]:
        tokens = token_num + self.num_extra_kv_tokens + (reserve if is_gen else 0)
        return [self.policy.v1_blocks_for_tokens(tokens, self.tokens_per_block)] * len(self.pools)

    def _place_dummy(self, request_id, token_num: int, is_gen: bool, reserve: int) -> bool:
        tokens = token_num + self.num_extra_kv_tokens + (reserve if is_gen else 0)
        try:
            self._set_tokens(request_id, tokens, "dummy")
        except OutOfPagesError:
            return False
        self._seq(request_id).history = token_num - 1 if is_gen else 0
        return True


# The calls that may start or check a retention timer: a release (``free_resources``, a shrinking ``_set_tokens``:
# a rewind, rejected drafts), an allocation that may offload a timed block to the host tier (``add_sequence``, a
# growing ``_set_tokens``, dummies), ``refresh_blocks``; and ``begin_context_chunk``, which frees the request it made
# when its ``_set_tokens`` fails. With a user's clock each reads it once before it changes anything
# (kvcm/retention_clock.py); a decode step within the blocks a request holds reads none (the engine's hot path).
# V1 stores blocks without releasing any (rebasing is V2's), so ``append_tokens`` and ``end_context_chunk`` read none.
# The exhaustive explorer runs every operation with a clock that fails.
CLOCK_READERS = ("add_sequence", "begin_context_chunk", "_set_tokens", "free_resources", "add_dummy_requests",
                 "refresh_blocks")
for _name in CLOCK_READERS:
    setattr(KVCacheManagerV1, _name, reads_clock(getattr(KVCacheManagerV1, _name)))


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class V1Decisions(Decisions):
    SUBSYSTEM = "V1 sizing and rewinds"

    @rule("V1's blocks for kv_cache_config.max_tokens: whole blocks only, as TensorRT-LLM's "
          "calculate_max_num_blocks floors max_tokens // tokens_per_block")
    def v1_blocks_for_max_tokens(max_tokens: int, tpb: int) -> int:
        return max_tokens // tpb

    @rule("V1's blocks for a request of n token slots: ceil(n / tokens_per_block), no more (transformers 5.17's "
          "scheduler asked ((n + 1) // page) + 1, a block too many when n is a multiple of the page or one short of "
          "it; its allocators count ceil since PR #47809)")
    def v1_blocks_for_tokens(tokens: int, tpb: int) -> int:
        return ceil_div(tokens, tpb)

    rewind_to_front = setting(
        True, "whether a rewound block goes to the front of its queue (removeToken -> releaseLastBlock(toFront=true)), "
        "so the next token takes it again; at the back a speculative step's rejected drafts pushed cached blocks out")
