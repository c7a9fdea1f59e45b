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
"""
from __future__ import annotations

from collections import deque

from ..errors import OutOfPagesError
from .runner import StepItem
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, mgr, *, max_batch_size: int, max_seq_len: int, max_num_tokens: int | None = None,
                 eos_token_ids: tuple[int, ...] = (), tokenizer=None):
        self.mgr = mgr
        self.max_batch_size, self.max_seq_len, self.max_num_tokens = max_batch_size, max_seq_len, max_num_tokens
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = tokenizer
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens >= self.max_seq_len:
            raise ValueError(f"prompt length {seq.num_tokens} must be below max_seq_len={self.max_seq_len}")
        if seq.params.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer= to LLM")
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ------------------------------------------------------------------------------------------
    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        if self.mgr.has_request(victim.request_id):
            self.mgr.free_resources(victim.request_id)
        victim.reset_for_recompute()
        self.waiting.appendleft(victim)
        self.num_preemptions += 1

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
        begin_generation = self.mgr.begin_generation
        for seq in list(self.running):
            if seq.is_prefilling or len(seqs) >= self.max_batch_size or budget < 1:
                continue
            if seq.status is not Status.RUNNING:   # preempted by an earlier grow in this loop
                continue
            rid = seq.request_id
            try:
                begin_generation(rid)
            except OutOfPagesError:
                if not self._grow(seq, lambda s=seq: begin_generation(s.request_id), scheduled):
                    continue
            scheduled.add(rid)
            seqs.append(seq)
            items.append(StepItem(rid, [seq.last_token], seq.num_tokens - 1, decode=True))
            budget -= 1
        # chunks of sequences part way through their prefill, then new ones
        for seq in [s for s in self.running if s.is_prefilling] + list(self.waiting):
            if len(seqs) >= self.max_batch_size or budget < 1:
                break
            start = seq.num_computed
            n = int(min(seq.prefill_len - start, budget))
            grow = lambda s=seq, st=start, k=n: self.mgr.begin_context_chunk(s.request_id, st, k, s.prefill_len)
            if seq.status is Status.WAITING:
                try:
                    grow()
                except OutOfPagesError:
                    break                  # keep FCFS order: nothing behind it is admitted either
                self.waiting.remove(seq)
                seq.status = Status.RUNNING
                self.running.append(seq)
            elif seq not in self.running or not self._grow(seq, grow, scheduled):
                continue
            scheduled.add(seq.request_id)
            seqs.append(seq)
            items.append(StepItem(seq.request_id, seq.token_ids[start:start + n], start, decode=False,
                                  num_logits=int(start + n == seq.prefill_len)))
            budget -= n
        if not items and self.has_work:
            head = self.waiting[0] if self.waiting else self.running[0]
            raise RuntimeError(f"nothing could be scheduled: request {head.request_id} needs {head.prefill_len} "
                               f"tokens of KV but the cache holds {self.mgr.get_num_free_blocks()} free blocks of "
                               f"{self.mgr.tokens_per_block} tokens with nothing else running; enlarge the cache")
        return seqs, items

    # ---- after the forward -----------------------------------------------------------------------------------
    def commit(self, seqs: list[Sequence], items: list[StepItem]) -> list[tuple[Sequence, int]]:
        """The step's bookkeeping that needs no token values, done once it is launched: the manager's
        ``end_context_chunk`` / ``end_generation`` and each sequence's computed count. Each sequence that gets a
        token this step gets a placeholder in its outputs (:func:`placeholder` of its logit row), so the next
        step can be scheduled before the token is known. A sequence that reaches its length limit with it is
        retired now (its pages freed); the stop reason is decided by :meth:`complete`. Returns the
        ``(sequence, output position)`` of each logit row, in row order."""
        pending = []
        for seq, item in zip(seqs, items):
            rid = seq.request_id
            if item.decode:
                seq.output_token_ids.append(placeholder(len(pending)))
                self.mgr.end_generation(rid, seq.num_tokens)
                seq.num_computed = seq.num_tokens - 1
            else:
                seq.num_computed = item.start + len(item.token_ids)
                self.mgr.end_context_chunk(rid, seq.num_computed)
                if not item.want_logits:
                    continue
                seq.output_token_ids.append(placeholder(len(pending)))
            seq.logits_margins.append(float("nan"))
            pending.append((seq, len(seq.output_token_ids) - 1))
            if self._at_length_limit(seq, len(seq.output_token_ids) - 1):
                self._retire(seq)
        return pending

    def complete(self, pending: list[tuple[Sequence, int]], tokens: list[int], margins: list[float]):
        """Write a committed step's sampled tokens over their placeholders and apply the stop conditions.
        A position past a sequence's end was decoded after an earlier token stopped it (the overlapped loop
        schedules before it knows): its token is dropped. Returns the sequences that finished."""
        finished = []
        for (seq, pos), tok, margin in zip(pending, tokens, margins):
            if pos >= len(seq.output_token_ids):
                continue
            seq.output_token_ids[pos] = tok
            seq.logits_margins[pos] = margin
            if self._check_stop(seq, pos):
                del seq.output_token_ids[pos + 1:], seq.logits_margins[pos + 1:]
                self._retire(seq)
                finished.append(seq)
        return finished

    def postprocess(self, seqs: list[Sequence], items: list[StepItem], tokens: list[int], margins: list[float]):
        """``commit`` then ``complete``: one step whose tokens are already known. Returns the finished ones."""
        return self.complete(self.commit(seqs, items), tokens, margins)

    def _retire(self, seq: Sequence) -> None:
        """Take a stopping sequence out of the queues and free its pages (once)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:      # preempted while its last token was still on the way
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        if self.mgr.has_request(seq.request_id):
            self.mgr.free_resources(seq.request_id)

    def _at_length_limit(self, seq: Sequence, pos: int) -> bool:
        return pos + 1 >= seq.params.max_new_tokens or len(seq.prompt_token_ids) + pos + 1 >= self.max_seq_len

    def _check_stop(self, seq: Sequence, pos: int) -> bool:
        """Whether output ``pos`` (the newest resolved one) stops ``seq``; sets its finish reason."""
        tok = seq.output_token_ids[pos]
        p = seq.params
        if not p.ignore_eos and tok in self.eos_token_ids:
            seq.finish_reason = "eos"
        elif tok in p.stop_token_ids:
            seq.finish_reason = "stop_token"
        elif p.stop_strings and self._stop_string(seq, pos):
            seq.finish_reason = "stop_string"
        elif pos + 1 >= p.max_new_tokens:
            seq.finish_reason = "length"
        elif len(seq.prompt_token_ids) + pos + 1 >= self.max_seq_len:
            seq.finish_reason = "max_seq_len"
        return seq.finish_reason is not None

    def _stop_string(self, seq: Sequence, pos: int) -> bool:
        longest = max(len(s) for s in seq.params.stop_strings)
        tail = self.tokenizer.decode(seq.output_token_ids[max(0, pos + 1 - (longest + 8)):pos + 1])
        for s in seq.params.stop_strings:
            if s in tail:
                seq.stop_string = s
                return True
        return False


def placeholder(row: int) -> int:
    """The stand-in token id for logit row ``row`` of the step in flight (negative, so never a real id); the
    runner swaps it for that row's sampled token on the device (``ModelRunner.resolve_placeholders``)."""
    return -1 - row
