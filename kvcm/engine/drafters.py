"""Drafters for speculative decoding: who proposes the ``D`` tokens the target verifies in one forward.

The scheduler (``scheduler.py``) owns admission, preemption and verification; a drafter only proposes, and,
when it keeps KV of its own, mirrors the target's capacity calls on its own manager:

* :class:`NgramDrafter` (prompt lookup): the tokens that followed the latest earlier occurrence of the
  sequence's last ``n`` tokens. No model and no cache; on tasks that quote their input (GSM8K answers repeat
  the question's numbers and phrases) it accepts often for almost no cost.
* :class:`ModelDrafter`: a smaller causal LM with its own kvcm manager (V1 or V2), fed every prefill chunk the
  target gets and run ``D`` times per step. Its history may lag the target's by one token (when every
  proposal was accepted, the last one was never fed to it), so its first forward of a step takes the 1 or 2
  *pending* tokens; it reserves ``pending + D - 1`` slots (``begin_generation(num_draft=pending + D - 2)``)
  and ``end_generation`` keeps only the slots whose tokens were accepted.

Both propose exactly ``D`` tokens for every sequence, so a batch keeps one verification shape ``(bs, 1 + D)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from . import sampler
from .runner import ModelRunner, StepItem


@dataclass
class SpecStats:
    """Acceptance of one drafter: per verification step and per draft position."""
    name: str = ""
    steps: int = 0                          # verification steps (one per sequence per step)
    proposed: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)   # steps whose draft i was accepted
    proposed_at: list[int] = field(default_factory=list)   # steps that proposed a draft i

    def record(self, num_draft: int, num_accepted: int) -> None:
        while len(self.proposed_at) < num_draft:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        self.steps += 1
        self.proposed += num_draft
        self.accepted += num_accepted
        for i in range(num_draft):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < num_accepted

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target forward per sequence (accepted drafts + the target's own token); 1.0 = no help."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Fraction of steps whose draft ``i`` was accepted (every earlier one was too, by construction)."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    def as_dict(self) -> dict:
        return {"drafter": self.name, "steps": self.steps, "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate": self.acceptance_rate, "acceptance_by_position": self.acceptance_by_position}


class NgramDrafter:
    """Prompt lookup: match the last ``max_n .. min_n`` tokens against the sequence's earlier text (longest
    match first, latest occurrence) and propose what followed; the last proposed token repeats where the
    continuation runs short (it is then simply rejected)."""

    manager = None
    runner = None
    graphs = None

    def __init__(self, num_draft: int, *, max_n: int = 3, min_n: int = 1):
        if not isinstance(num_draft, int) or num_draft < 1:
            raise ValueError(f"num_draft={num_draft!r} must be an integer >= 1")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes min_n={min_n}, max_n={max_n} must satisfy 1 <= min_n <= max_n")
        self.num_draft, self.max_n, self.min_n = num_draft, max_n, min_n
        self.stats = SpecStats(f"ngram{min_n}-{max_n}")

    def propose_one(self, tokens: list[int]) -> list[int]:
        D = self.num_draft
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, len(arr) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                follow = arr[hits[-1] + n: hits[-1] + n + D].tolist()
                return follow + [follow[-1]] * (D - len(follow))
        return [int(arr[-1])] * D

    # the capacity hooks a drafter with its own cache needs; prompt lookup keeps nothing
    def begin_chunk(self, seq, start: int, n: int) -> None: ...
    def begin_decode(self, seq) -> None: ...
    def end_chunk(self, seq, history: int) -> None: ...
    def end_decode(self, seq, length: int, num_accepted: int) -> None: ...
    def free(self, seq) -> None: ...
    def close(self) -> None: ...

    def draft(self, seqs, items: list[StepItem]) -> None:
        for seq, it in zip(seqs, items):
            k = it.num_logits - 1
            if it.decode and k > 0:
                it.token_ids[1:] = self.propose_one(seq.token_ids)[:k]


class ModelDrafter:
    """A draft model with its own manager; ``graphs`` (``cuda_graph.StepGraphs``) when its steps replay."""

    def __init__(self, runner: ModelRunner, num_draft: int, *, name: str = "model", graphs=None):
        if not isinstance(num_draft, int) or num_draft < 1:
            raise ValueError(f"num_draft={num_draft!r} must be an integer >= 1")
        self.runner, self.manager, self.num_draft, self.graphs = runner, runner.mgr, num_draft, graphs
        self.history: dict[object, int] = {}     # tokens with KV in the draft's cache, per request
        self.stats = SpecStats(name)

    # ---- capacity, mirrored from the scheduler's calls on the target ----------------------------------------
    def begin_chunk(self, seq, start: int, n: int) -> None:
        self.manager.begin_context_chunk(seq.request_id, start, n, seq.prefill_len)

    def end_chunk(self, seq, history: int) -> None:
        self.manager.end_context_chunk(seq.request_id, history)
        self.history[seq.request_id] = history

    def _pending(self, seq) -> int:
        return seq.num_tokens - self.history[seq.request_id]

    def begin_decode(self, seq) -> None:
        self.manager.begin_generation(seq.request_id, num_draft=self._pending(seq) + self.num_draft - 2)

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
        if self.manager.has_request(seq.request_id):
            self.manager.free_resources(seq.request_id)

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    # ---- forwards -------------------------------------------------------------------------------------------
    def _greedy(self, items: list[StepItem]) -> list[int]:
        static = self.graphs.pick(items) if self.graphs is not None else None
        if static is not None:
            return self.graphs.run(static, items)[0]
        return sampler.greedy(self.runner.run(items))[0]

    def _catch_up(self, seq) -> StepItem:
        """The step's first draft forward for ``seq``: every token the draft's cache lacks (1, or 2 after a step
        that accepted every draft), so its proposals see the whole committed text."""
        h = self.history[seq.request_id]
        return StepItem(seq.request_id, seq.token_ids[h:], h, decode=True)

    def draft(self, seqs, items: list[StepItem]) -> None:
        """Feed this step's prefill chunks and propose ``D`` tokens for every verification item (in place)."""
        dec = [(s, it) for s, it in zip(seqs, items) if it.decode and it.num_logits > 1]
        chunks = [StepItem(s.request_id, it.token_ids, it.start, decode=False, num_logits=0)
                  for s, it in zip(seqs, items) if not it.decode]
        first = [self._catch_up(s) for s, _ in dec]
        if not dec:
            if chunks:
                self.runner.run(chunks)
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


def draft_runner(model, manager, device, tracer=None) -> ModelRunner:
    """The draft model's runner over its own manager (the draft shares the target's tokenizer)."""
    return ModelRunner(model.to(device).eval(), manager, torch.device(device), tracer)
