"""Continuous-batching scheduler over a kvcm manager (vLLM v1 / nano-vllm style).

Each step: running decodes first (one token each, up to ``max_batch_size``), then prefill chunks of running
sequences that are part way through their prompt, then new sequences from the waiting queue, as long as the
token budget ``max_num_tokens`` lasts (a prompt larger than what is left is split: chunked prefill).

Capacity comes from the manager: ``begin_context_chunk`` / ``begin_generation`` before the forward,
``end_context_chunk`` / ``end_generation`` after it. When a running sequence cannot grow
(``kvcm.OutOfPagesError``, raised with nothing changed) the newest running sequence is preempted by
recompute: its pages are freed and it goes back to the front of the waiting queue with its generated tokens
appended to what it will prefill; the grow is retried. A waiting sequence that does not fit just waits.

After a step is launched, :meth:`Scheduler.commit` does the bookkeeping that needs only counts and leaves a
placeholder for each token on the way; :meth:`Scheduler.complete` writes the tokens in and applies the stop
conditions. Between the two the next step can be scheduled (``pipeline.py`` overlaps them): a sequence whose
token turns out to stop it has then run one step too many, and that step's token for it is dropped.

With a drafter (speculative decoding, ``drafters.py``) the same loop runs with one more step: each decode
becomes a *verification* of the pending token and ``D`` drafts (``begin_generation(num_draft=D)``, ``1 + D``
logits), the drafter mirrors every capacity call on its own cache (a grow that fails on either cache preempts,
as above), :meth:`Scheduler.draft` fills the drafts in before the forward, and :meth:`Scheduler.verify` keeps
the longest prefix of drafts equal to the target's greedy choices plus the target's next token, rewinding the
rejected slots (``end_generation(num_accepted=a)``; where the drafter proposed nothing for a whole step, its
items are plain decodes and every reserved slot is rewound). How many tokens a step yields is known only from its
tokens, so these steps are not overlapped. The output is exactly plain greedy decoding. Above a number of active
requests (``spec_cutoff.py``, :meth:`Scheduler.decide`), or for good once the drafter's acceptance rate has
fallen below its break-even (``spec_gate.py``), a step does not speculate: it is scheduled, committed and
completed as a plain step, without the drafter.
"""
from __future__ import annotations

import time

from collections import deque

from ..policy import Decisions, resolve, rule, setting
from ..errors import OutOfPagesError, UserCallbackError
from ..limits import Limits
from ..protocols import StepManager
from . import reuse as _reuse
from .runner import StepItem, placeholders
from .sequence import Sequence, Status
from .spec_cutoff import should_speculate
from .spec_gate import SpeculationGate
from .spec_stats import SpecStats
from .stop_strings import StopStrings
from .stopping import StopConditions


class Scheduler:
    def __init__(self, mgr: StepManager, limits: Limits, *, eos_token_ids: tuple[int, ...] = (), tokenizer=None, drafter=None,
                 reuse: bool = False, on_finish=None, spec_max_concurrency: int | None = None,
                 spec_gate: SpeculationGate | None = None, stop_strings: StopStrings | None = None, policy=None):
        """``limits``: the engine's ``kvcm.Limits`` (the one its caches were sized for); the scheduler reads the
        batch size, the sequence length and the step's token budget from it. ``reuse``: admit each request with
        its token ids, so its prefill starts after its cached prefix (``reuse.py``). ``on_finish(index)``: called
        once per request as it finishes (progress bars; its last token may still be on its way).
        ``spec_max_concurrency``: with a drafter, speculate only while this many requests or fewer are active
        (``spec_cutoff.py``; None: always). ``spec_gate``: the engine's acceptance gate, fed each verification's
        acceptance and asked before each step (``spec_gate.py``; None: none). ``stop_strings``: the tokenizer's
        stop-string check, kept by the engine across runs (its per-token texts); None: a new one. ``policy``: the
        engine's decisions (``kvcm.policy``; None: the active one)."""
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a kvcm.Limits, got {type(limits).__name__}")
        self.mgr = mgr
        self.policy = resolve(policy)
        self.limits = limits
        self.drafter = drafter
        self.num_draft = drafter.num_draft if drafter is not None else 0
        self.tokenizer = tokenizer
        self.stops = StopConditions(eos_token_ids, limits.max_seq_len,
                                    stop_strings if stop_strings is not None else StopStrings(tokenizer))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._added: list[Sequence] = []       # every request of this run, for ``abort``
        self.num_preemptions = 0
        self.reuse = reuse
        self.reuse_stats = _reuse.ReuseStats()
        self.on_finish = on_finish
        self.spec_stats = SpecStats(drafter.name) if drafter is not None else None   # acceptance of this run
        self.spec_max_concurrency = spec_max_concurrency
        self.spec_gate = spec_gate
        self.speculating = drafter is not None     # this step's mode (``decide``)

    max_batch_size = property(lambda self: self.limits.max_batch_size)
    max_seq_len = property(lambda self: self.limits.max_seq_len)
    max_num_tokens = property(lambda self: self.limits.max_num_tokens)

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens >= self.max_seq_len:
            raise ValueError(f"prompt length {seq.num_tokens} must be below max_seq_len={self.max_seq_len}")
        if seq.params.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer= to LLM")
        self.waiting.append(seq)
        self._added.append(seq)

    def abort(self) -> None:
        """A run that raised part way: free every request of it on both caches (stored as at any release: only
        blocks below a request's history, which a step moves once its forward is done)."""
        for seq in self._added:
            if seq.status is not Status.FINISHED:
                seq.status = Status.FINISHED
                self._release(seq)
        self.running.clear()
        self.waiting.clear()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ------------------------------------------------------------------------------------------
    def decide(self) -> bool:
        """Whether the next step speculates: ``spec_cutoff.should_speculate`` on the requests running and
        waiting, and the acceptance gate open; False without a drafter. Asked before each step; the step's
        capacity calls follow it."""
        if self.drafter is None:
            return False
        under = should_speculate(len(self.running) + len(self.waiting), max_concurrency=self.spec_max_concurrency,
                                 max_batch_size=self.max_batch_size, max_num_tokens=self.max_num_tokens,
                                 num_draft=self.num_draft)
        closed = self.spec_gate is not None and self.spec_gate.closed
        on = self.speculating = self.policy.speculate_step(under, closed)
        if on:
            self.spec_stats.steps_on += 1
        else:
            self.spec_stats.steps_off += 1
            self.spec_stats.steps_gated += under and closed
        return on

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self._release(victim, draft=self.drafter is not None and self.policy.preemption_frees_draft)
        victim.reset_for_recompute()
        self.waiting.appendleft(victim)
        self.num_preemptions += 1

    def _release(self, seq: Sequence, *, draft: bool = True) -> None:
        """Free the sequence's pages on the target's and (``draft``) the drafter's caches, telling a manager that
        reuses the tokens it generated first, so it can store their blocks."""
        if self.mgr.has_request(seq.request_id):
            if seq.admitted_len is not None:
                _reuse.append_generated(self.mgr, seq.request_id, seq.token_ids, seq.admitted_len)
            self.mgr.free_resources(seq.request_id)
        if draft and self.drafter is not None:
            self.drafter.free(seq)

    def _decode_grow(self, seq: Sequence, k: int):
        """Target, then drafter capacity for one decode with ``k`` drafts, as a retryable grow: once the target
        holds its slots a retry (after a preemption freed pages) asks the drafter only. Nothing needs undoing:
        a sequence that cannot grow at all is preempted whole."""
        reserved = []

        def grow():
            if not reserved:
                self.mgr.begin_generation(seq.request_id, num_draft=k)
                reserved.append(True)
            if k:
                self.drafter.begin_decode(seq)
        return grow

    def _chunk_grow(self, seq: Sequence, start: int, n: int):
        """A prefill chunk on the target and the drafter (repeating a chunk that fitted before is a no-op)."""
        def grow():
            self.mgr.begin_context_chunk(seq.request_id, start, n, seq.prefill_len)
            if self.speculating:
                self.drafter.begin_chunk(seq, start, n)
        return grow

    def _grow(self, seq: Sequence, grow, scheduled: set) -> bool:
        """Run ``grow()``; on lack of pages preempt the newest unscheduled running sequence and retry.
        Returns False when ``seq`` itself had to be preempted."""
        while True:
            try:
                grow()
                return True
            except OutOfPagesError:
                victims = [s for s in self.running if s.request_id not in scheduled]
                victim = victims[-1]
                self._preempt(victim)
                if victim is seq:
                    return False

    def schedule(self) -> tuple[list[Sequence], list[StepItem]]:
        """Pick this step's work and reserve its capacity; decodes first in the returned lists."""
        budget = self.max_num_tokens if self.max_num_tokens is not None else float("inf")
        seqs: list[Sequence] = []
        items: list[StepItem] = []
        scheduled: set = set()
        # the loop every step runs once per running sequence: properties and constants are read inline
        begin_generation, max_batch_size = self.mgr.begin_generation, self.max_batch_size
        drafter = self.drafter if self.speculating else None
        running = Status.RUNNING
        for seq in list(self.running):
            if len(seqs) >= max_batch_size or budget < 1:
                break
            if seq.num_computed < seq.prefill_len or seq.status is not running:   # prefilling; preempted by an
                continue                                                        # earlier grow in this loop
            rid = seq.request_id
            if drafter is not None:
                k = self._draft_slots(seq)
                if budget < 1 + k or not self._grow(seq, self._decode_grow(seq, k), scheduled):
                    continue
                scheduled.add(rid)
                seqs.append(seq)
                items.append(StepItem(rid, [seq.last_token] + [0] * k, seq.num_tokens - 1, decode=True,
                                      num_logits=1 + k))
                budget -= 1 + k
                continue
            try:
                begin_generation(rid)
            except OutOfPagesError:
                if not self._grow(seq, lambda s=seq: begin_generation(s.request_id), scheduled):
                    continue
            scheduled.add(rid)
            seqs.append(seq)
            out, item = seq.output_token_ids, seq.decode_item
            if item is None:
                item = seq.decode_item = StepItem(rid, [0], 0, True)
            item.token_ids[0] = out[-1] if out else seq.prompt_token_ids[-1]
            item.start = len(seq.prompt_token_ids) + len(out) - 1
            items.append(item)
            budget -= 1
        # chunks of sequences part way through their prefill, then new ones
        prefills = [] if len(seqs) >= max_batch_size or budget < 1 else \
            [s for s in self.running if s.is_prefilling] + list(self.waiting)
        for seq in prefills:
            if len(seqs) >= max_batch_size or budget < 1:
                break
            waiting = seq.status is Status.WAITING
            if waiting and self.reuse and not self._lookup(seq):
                break
            start = seq.num_computed
            n = int(min(seq.prefill_len - start, budget))
            grow = self._chunk_grow(seq, start, n)
            if waiting:
                try:
                    grow()
                except OutOfPagesError:
                    self._release(seq)     # the target may hold it when the drafter's cache was full
                    seq.num_computed, seq.admitted_len = 0, None
                    break                  # keep FCFS order: nothing behind it is admitted either
                self.waiting.remove(seq)
                seq.status = Status.RUNNING
                self.running.append(seq)
                self._tally(seq)
            elif seq not in self.running or not self._grow(seq, grow, scheduled):
                continue
            scheduled.add(seq.request_id)
            seqs.append(seq)
            items.append(StepItem(seq.request_id, seq.token_ids[start:start + n], start, decode=False,
                                  num_logits=int(start + n == seq.prefill_len)))
            self.reuse_stats.computed_tokens += n
            budget -= n
        if not items and self.has_work:
            head = self.waiting[0] if self.waiting else self.running[0]
            raise RuntimeError(f"nothing could be scheduled: request {head.request_id} needs {head.prefill_len} "
                               f"tokens of KV but the cache holds {self.mgr.get_num_free_blocks()} free blocks of "
                               f"{self.mgr.tokens_per_block} tokens with nothing else running; enlarge the cache")
        return seqs, items

    def _lookup(self, seq: Sequence) -> bool:
        """Make a waiting sequence with its known tokens, its prefill starting after its cached prefix. False
        when the manager could not (a partial copy found no page): it waits, nothing made."""
        tokens = seq.token_ids[:seq.prefill_len]
        try:
            start = _reuse.admit(self.mgr, seq.request_id, tokens, self.policy)
        except OutOfPagesError:
            return False
        if start is not None:
            seq.num_computed, seq.admitted_len = start, len(tokens)
        return True

    def _tally(self, seq: Sequence) -> None:
        st = self.reuse_stats
        st.admissions += 1
        st.prompt_tokens += seq.prefill_len
        if seq.admitted_len is not None:
            req = self.mgr.get_request_stats(seq.request_id)
            st.reused_tokens += seq.num_computed
            st.reused_blocks += req.reused_blocks
            st.missed_blocks += req.missed_blocks

    # ---- after the forward -----------------------------------------------------------------------------------
    def commit(self, seqs: list[Sequence], items: list[StepItem]) -> list[tuple[Sequence, int]]:
        """The step's bookkeeping that needs no token values, done once it is launched: the manager's
        ``end_context_chunk`` / ``end_generation`` and each sequence's computed count. Each sequence that gets a
        token this step gets a placeholder in its outputs (``runner.placeholders``, of its logit row), so the next
        step can be scheduled before the token is known. A sequence that reaches its length limit with it is
        retired now (its pages freed); the stop reason is decided by :meth:`complete`. Returns the
        ``(sequence, output position)`` of each logit row, in row order."""
        pending = []
        end_generation, retire, nan = self.mgr.end_generation, self.policy.retire_at_commit, float("nan")
        max_seq_len, stand_in = self.limits.max_seq_len, placeholders(len(items))
        for seq, item in zip(seqs, items):
            out = seq.output_token_ids
            if item.decode:
                out.append(stand_in[len(pending)])
                num_tokens = len(seq.prompt_token_ids) + len(out)
                end_generation(seq.request_id, num_tokens)
                seq.num_computed = num_tokens - 1
            else:
                seq.num_computed = item.start + len(item.token_ids)
                self.mgr.end_context_chunk(seq.request_id, seq.num_computed)
                if not item.want_logits:
                    continue
                out.append(stand_in[len(pending)])
            seq.logits_margins.append(nan)
            pos = len(out) - 1
            pending.append((seq, pos))
            if retire(pos + 1, seq.params.max_new_tokens, len(seq.prompt_token_ids) + pos + 1, max_seq_len):
                self._retire(seq)
        return pending

    def complete(self, pending: list[tuple[Sequence, int]], tokens: list[int], margins: list[float]):
        """Write a committed step's sampled tokens over their placeholders and apply the stop conditions.
        A position past a sequence's end was decoded after an earlier token stopped it (the overlapped loop
        schedules before it knows): its token is dropped. Returns the sequences that finished."""
        finished, check_stop = [], self.stops.check
        for (seq, pos), tok, margin in zip(pending, tokens, margins):
            out = seq.output_token_ids
            if pos >= len(out):
                continue
            out[pos] = tok
            seq.logits_margins[pos] = margin
            if not pos:
                seq.first_token_time = time.perf_counter()
            if check_stop(seq, pos):
                del seq.output_token_ids[pos + 1:], seq.logits_margins[pos + 1:]
                self._retire(seq)
                finished.append(seq)
        return finished

    def draft(self, seqs: list[Sequence], items: list[StepItem]) -> None:
        """The drafting step: the drafter fills in each verification item's drafts (and feeds its own cache
        this step's prefill chunks). Nothing when this step does not speculate."""
        if self.speculating:
            self.drafter.draft(seqs, items)

    def verify(self, seqs: list[Sequence], items: list[StepItem], tokens: list[int], margins: list[float]):
        """A speculative step, tokens known: accept each verification's longest matching prefix of drafts and
        the target's next token, commit both caches (rejected slots rewound), append the tokens up to a stop.
        Prefill chunks commit as in :meth:`commit`. Returns the sequences that finished."""
        finished, r = [], 0
        for seq, item in zip(seqs, items):
            rid = seq.request_id
            want, wmargins = tokens[r:r + item.num_logits], margins[r:r + item.num_logits]
            r += item.num_logits
            if item.decode:
                k = item.num_logits - 1          # drafts verified: the slots reserved, or none (nothing proposed)
                a = 0
                while a < k and item.token_ids[1 + a] == want[a]:
                    a += 1
                length = seq.num_tokens
                reserved = self._draft_slots(seq)      # as schedule() reserved them
                self.mgr.end_generation(rid, length + a + 1, num_draft=reserved, num_accepted=a)
                if reserved:
                    self.drafter.end_decode(seq, length, a)
                    self.spec_stats.record(k, a)
                    if self.spec_gate is not None:
                        self.spec_gate.record(a, k)
                seq.num_computed = length + a
                want, wmargins = want[:a + 1], wmargins[:a + 1]
            else:
                seq.num_computed = item.start + len(item.token_ids)
                self.mgr.end_context_chunk(rid, seq.num_computed)
                self.drafter.end_chunk(seq, seq.num_computed)
            if not seq.output_token_ids and want:
                seq.first_token_time = time.perf_counter()
            for tok, margin in zip(want, wmargins):
                seq.output_token_ids.append(tok)
                seq.logits_margins.append(margin)
                if self.stops.check(seq, len(seq.output_token_ids) - 1):
                    self._retire(seq)
                    finished.append(seq)
                    break
        return finished

    def _retire(self, seq: Sequence) -> None:
        """Take a stopping sequence out of the queues and free its pages (once)."""
        first = seq.status is not Status.FINISHED
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:      # preempted while its last token was still on the way
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        self._release(seq)
        if first and self.on_finish is not None:
            try:
                self.on_finish(seq.index)
            except Exception as exc:
                raise UserCallbackError("on_finish", f"raised {type(exc).__name__}: {exc} (told that prompt "
                                                     f"{seq.index} finished)") from exc

    def _draft_slots(self, seq: Sequence) -> int:
        """Draft slots a verification of ``seq`` reserves: ``D``, fewer near ``max_seq_len``. ``verify`` rewinds
        exactly these, even when the drafter proposed nothing and the step ran as a plain decode."""
        return min(self.num_draft, self.limits.max_seq_len - seq.num_tokens) if self.speculating else 0


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class SchedulerDecisions(Decisions):
    SUBSYSTEM = "engine: scheduler"

    preemption_frees_draft = setting(
        True, "whether preempting a request frees its pages in the draft model's cache too, where there is one "
        "(TensorRT-LLM PR #18093: target and draft released together)")

    @rule("whether a request is retired when its step is committed, before its token is read: when the token "
          "reaches max_new_tokens or max_seq_len (vLLM PR #27922: async scheduling ran one step past max_tokens)")
    def retire_at_commit(num_outputs: int, max_new_tokens: int, num_tokens: int, max_seq_len: int) -> bool:
        return num_outputs >= max_new_tokens or num_tokens >= max_seq_len

    @rule("whether a step speculates: under the batch cut-off and the acceptance gate still open, a closed gate "
          "winning over the cut-off (TensorRT-LLM PR #7283, whose fixes list 'permanent-disable takes precedence "
          "over dynamic drafting')")
    def speculate_step(under_cutoff: bool, gate_closed: bool) -> bool:
        return under_cutoff and not gate_closed
