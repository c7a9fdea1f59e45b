"""Drafters for speculative decoding: who proposes the ``D`` tokens the target verifies in one forward.

The scheduler (``scheduler.py``) owns admission, preemption and verification; a drafter only proposes, and,
when it keeps KV of its own, mirrors the target's capacity calls on its own manager:

* :class:`NgramDrafter` (``ngram.py``): TensorRT-LLM's n-gram pool, pattern -> continuations learned from
  prompts and generated tokens, shared by every request. No model and no cache; on tasks that quote their
  input or repeat a phrasing (GSM8K answers) it accepts often for almost no cost.
* :class:`ModelDrafter`: a smaller causal LM with its own kvcm manager (V1 or V2), fed every prefill chunk the
  target gets and run ``D`` times per step. Its history may lag the target's by one token (when every
  proposal was accepted, the last one was never fed to it), so its first forward of a step takes the 1 or 2
  *pending* tokens; it reserves ``pending + D - 1`` slots (``begin_generation(num_draft=pending + D - 2)``)
  and ``end_generation`` keeps only the slots whose tokens were accepted. After steps that did not speculate
  (``spec_cutoff.py``) its cache lags by more; the first speculative step remakes its request up to the
  target's history (its cached blocks reused when the draft's cache reuses) before drafting (``_resync``).

Both fill in exactly ``D`` tokens for every sequence, so a batch keeps one verification shape ``(bs, 1 + D)``.
"""
from __future__ import annotations

from .. import validation
from ..policy import Decisions, resolve, setting
from . import reuse as _reuse
from . import sampler
from .ngram import NgramDrafter, NgramPool  # noqa: F401  (drafters, one import)
from .runner import ModelRunner, StepItem


class ModelDrafter:
    """A draft model with its own manager; ``graphs`` (``cuda_graph.StepGraphs``) when its steps replay."""

    def __init__(self, runner: ModelRunner, num_draft: int, *, name: str = "model", graphs=None,
                 cost_per_draft: float = 1.0, policy=None):
        """``cost_per_draft``: one draft forward's time in target forwards, the acceptance rate at which
        speculating with it breaks even (``spec_gate.py``; the engine passes the parameter share). ``policy``:
        the engine's decisions (``kvcm.policy``; None: the active one)."""
        self.policy = resolve(policy)
        num_draft = validation.count("num_draft", num_draft, 1)
        self.runner, self.manager, self.num_draft, self.graphs = runner, runner.mgr, num_draft, graphs
        self.history: dict[object, int] = {}     # tokens with KV in the draft's cache, per request
        self.admitted: dict[object, int] = {}    # tokens the draft's manager was made with (block reuse)
        self.reuse = False                       # set by the engine: admit with token ids (``reuse.py``)
        self.refill: dict[object, StepItem] = {}  # the prefill a resynced request runs before it drafts
        self.num_resyncs = 0                     # requests remade after steps without speculation
        self.name = name
        self.cost_per_draft = cost_per_draft

    # ---- capacity, mirrored from the scheduler's calls on the target ----------------------------------------
    def begin_chunk(self, seq, start: int, n: int) -> None:
        """The target's chunk ``[start, start + n)`` as the draft's cache needs it: with block reuse the two
        caches hold different cached prefixes, so the draft computes from its own history to the chunk's end
        (more than the target's chunk, or nothing when its cached prefix covers it)."""
        rid = seq.request_id
        if rid not in self.history:
            h = None
            if self.reuse:
                tokens = seq.token_ids[:seq.prefill_len]
                h = _reuse.admit(self.manager, rid, tokens, self.policy)
                if h is not None:
                    self.admitted[rid] = len(tokens)
            self.history[rid] = h or 0
        h = self.history[rid]
        if start + n > h:
            self.manager.begin_context_chunk(rid, h, start + n - h, seq.prefill_len)

    def end_chunk(self, seq, history: int) -> None:
        if history > self.history[seq.request_id]:
            self.manager.end_context_chunk(seq.request_id, history)
            self.history[seq.request_id] = history

    def chunk_item(self, seq, item: StepItem) -> StepItem | None:
        """The draft's share of a target prefill item (from its own history), None when it has the KV."""
        h, end = self.history[seq.request_id], item.start + len(item.token_ids)
        if end <= h:
            return None
        return StepItem(seq.request_id, seq.token_ids[h:end], h, decode=False, num_logits=0)

    def _pending(self, seq) -> int:
        return seq.num_tokens - self.history[seq.request_id]

    def begin_decode(self, seq) -> None:
        h = self.history.get(seq.request_id)
        if h is None or h < max(seq.num_tokens - 2, seq.prefill_len):   # speculation was off: a step or more
            self._resync(seq)                                              # went by without the draft
        self.manager.begin_generation(seq.request_id, num_draft=self._pending(seq) + self.num_draft - 2)

    def _resync(self, seq) -> None:
        """Remake the draft's request with every token of ``seq`` but the last as its context, so this step
        drafts as after an ordinary step (one pending token). The context is computed from the draft's cached
        prefix, in a forward of its own before the drafting (``refill``). Repeating it after a failed grow
        starts over, so a retry after a preemption is safe."""
        rid, n = seq.request_id, seq.num_tokens
        self.num_resyncs += 1
        self.free(seq)
        context = seq.token_ids[:n - 1]
        cached = _reuse.admit(self.manager, rid, context, self.policy) if self.reuse else None
        start = cached or 0
        self.manager.begin_context_chunk(rid, start, n - 1 - start, n - 1)
        self.manager.end_context_chunk(rid, n - 1)
        if cached is not None:
            self.admitted[rid] = n - 1
        self.history[rid] = n - 1
        stop = n - 1 if self.policy.draft_refill_to_context_end else min(n - 1, len(seq.prompt_token_ids))
        if start < stop:
            self.refill[rid] = StepItem(rid, context[start:stop], start, decode=False, num_logits=0)

    def end_decode(self, seq, length: int, num_accepted: int) -> None:
        """``length``: the sequence's tokens before this step's; keep the draft KV of accepted tokens only."""
        rid, D = seq.request_id, self.num_draft
        before = self.history[rid]
        pending = length - before
        after = length + min(D - 1, num_accepted)
        self.manager.end_generation(rid, after + 1, num_draft=pending + D - 2, num_accepted=after - before - 1)
        self.history[rid] = after

    def free(self, seq) -> None:
        self.history.pop(seq.request_id, None)
        self.refill.pop(seq.request_id, None)
        admitted = self.admitted.pop(seq.request_id, None)
        if self.manager.has_request(seq.request_id):
            if admitted is not None:
                _reuse.append_generated(self.manager, seq.request_id, seq.token_ids, admitted)
            self.manager.free_resources(seq.request_id)

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    # ---- forwards -------------------------------------------------------------------------------------------
    def _launch(self, items: list[StepItem]):
        """Queue one draft forward over ``items`` without waiting: the packed greedy rows
        (``sampler.greedy_packed``) and how many are real. Every draft forward, decode or prefill, replays a
        static step where one fits, as the target's do: run eagerly, a launch for each kernel of every layer, the
        20-layer SmolLM2 drafter's first prefill took an H200 13-17 ms against 0.7 ms for the target's replayed
        one, most of what a gated drafter cost at batch 1 and 4."""
        static = self.graphs.pick(items) if self.graphs is not None else None
        if static is not None:
            return self.graphs.launch(static, items)
        packed = sampler.greedy_packed(self.runner.run(items))
        return packed, packed.shape[1]

    def _greedy(self, items: list[StepItem]) -> list[int]:
        return sampler.unpack(*self._launch(items))[0]

    def _catch_up(self, seq) -> StepItem:
        """The step's first draft forward for ``seq``: every token the draft's cache lacks (1, or 2 after a step
        that accepted every draft), so its proposals see the whole committed text."""
        h = self.history[seq.request_id] if self.policy.draft_feeds_every_missing_token else seq.num_tokens - 1
        return StepItem(seq.request_id, seq.token_ids[h:], h, decode=True)

    def draft(self, seqs, items: list[StepItem]) -> None:
        """Feed this step's prefill chunks and propose ``D`` tokens for every verification item (in place)."""
        dec = [(s, it) for s, it in zip(seqs, items) if it.decode and it.num_logits > 1]
        chunks = [c for c in (self.chunk_item(s, it) for s, it in zip(seqs, items) if not it.decode)
                  if c is not None]
        first = [self._catch_up(s) for s, _ in dec]
        refills = [self.refill.pop(s.request_id) for s, _ in dec if s.request_id in self.refill]
        if refills:
            self._launch(refills)      # KV only: nothing read
        if not dec:
            if chunks:
                self._launch(chunks)
            return
        toks = self._greedy(first + chunks)
        proposals = [[t] for t in toks]
        for _ in range(self.num_draft - 1):
            step = [StepItem(s.request_id, [p[-1]], s.num_tokens + len(p) - 1, decode=True)
                    for (s, _), p in zip(dec, proposals)]
            for p, t in zip(proposals, self._greedy(step)):
                p.append(t)
        for (_, it), p in zip(dec, proposals):
            it.token_ids[1:] = p[:it.num_logits - 1]


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class DrafterDecisions(Decisions):
    SUBSYSTEM = "engine: drafter"

    draft_feeds_every_missing_token = setting(
        True, "whether the draft model's first forward of a step starts at its own history, so it is fed every "
        "committed token it lacks; else at the last token only (vllm-metal PR #716)")

    draft_refill_to_context_end = setting(
        True, "whether the refill of a draft request made after steps without speculation runs to the end of its "
        "context, every token the target committed while the drafter was idle; else it stops at the prompt "
        "(TensorRT-LLM test_min_runtime_draft_len.py: with a draft length of 0 the drafter's KV was not refreshed "
        "while the target committed tokens, and later drafts attended to positions allocated but never written)")
