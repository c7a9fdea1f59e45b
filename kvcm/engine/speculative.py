"""Draft-target speculative decoding on two kvcm managers (greedy, exact).

Each step a draft model proposes ``D`` tokens one by one; the target scores the pending token and all ``D``
proposals in one forward (a decode of query length ``1 + D``) and keeps the longest prefix of proposals that
equals its own greedy choices, plus its own next token. So every step yields ``1..D+1`` tokens and the output
is exactly the target's greedy decoding: speculation changes speed, never tokens. That is the property the
suites check, and the one a cache manager's rewinding of rejected draft slots can break.

Target and draft each own a kvcm manager (V1 or V2, chosen independently), driven through the same calls a
production engine makes. Between steps a sequence of ``L`` tokens has target history ``L - 1`` (its last token
pending) and capacity equal to history:

* target: ``begin_generation(num_draft=D)`` grows capacity by ``1 + D`` (positions ``L-1 .. L+D-1``); after
  verification with ``a`` accepted, ``end_generation(L + a + 1, num_draft=D, num_accepted=a)`` rewinds the
  ``D - a`` rejected slots, leaving capacity = history = ``L + a``.
* draft: its history may lag by one (when all ``D`` proposals were accepted, the last proposal was never fed to
  the draft), so it has 1 or 2 pending tokens ``p``. It reserves ``p + D - 1`` slots with
  ``begin_generation(num_draft=p + D - 2)``, runs ``D`` forwards (the first over its pending tokens, the rest
  over its own proposals), and ``end_generation`` keeps only the slots whose tokens were accepted.

A sequence that cannot grow (``kvcm.OutOfPagesError``) preempts the newest running sequence by recompute, as
the plain scheduler does. The step is static-shaped per batch (one ``D`` for all), so a sequence may run up to
``D`` tokens past ``max_new_tokens`` internally; outputs are cut at ``max_new_tokens`` and after EOS.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from ..errors import OutOfPagesError
from ..factory import create_kv_cache_manager
from ..model_spec import ModelSpec
from .llm import default_kv_cache_config, eos_token_ids as model_eos_ids
from .runner import ModelRunner, StepItem
from .sampler import greedy


@dataclass
class SpecSequence:
    index: int
    request_id: int
    prompt_len: int
    tokens: list[int]                       # prompt + generated (the last one has no KV anywhere yet)
    margins: list[float] = field(default_factory=list)
    draft_history: int = 0                  # tokens with KV in the draft's cache
    finished: bool = False
    finish_reason: str | None = None
    num_preemptions: int = 0

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]


@dataclass
class SpecOutput:
    index: int
    token_ids: list[int]
    logits_margins: list[float]
    finish_reason: str | None
    num_preemptions: int = 0


@dataclass
class SpecStats:
    steps: int = 0                          # verification steps (one per sequence per step)
    accepted: int = 0                       # draft tokens accepted
    emitted: int = 0                        # tokens produced by verification steps (accepted + 1 each)
    proposed: int = 0
    preemptions: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target forward per sequence (accepted drafts + the target's own token); 1.0 = no help."""
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


def _new_manager(model, version, kv_cache_config, *, max_batch_size, max_seq_len, max_draft_len, device):
    spec = ModelSpec.from_hf_config(model.config)
    return create_kv_cache_manager(version, spec, kv_cache_config, max_batch_size=max_batch_size,
                                   max_seq_len=max_seq_len, max_draft_len=max_draft_len, device=device)


class SpeculativeLLM:
    """``SpeculativeLLM(target, draft, num_draft=4, target_version="v2", draft_version="v2", ...)``;
    ``generate(prompts, max_new_tokens)`` -> outputs in prompt order; ``stats`` -> acceptance figures."""

    def __init__(self, target, draft, *, num_draft: int = 4, target_version: str = "v2", draft_version: str = "v2",
                 target_kv_cache_config=None, draft_kv_cache_config=None, max_batch_size: int = 16,
                 max_seq_len: int = 1024, device="cpu", eos_token_ids=None, target_manager=None,
                 draft_manager=None):
        if not isinstance(num_draft, int) or num_draft < 1:
            raise ValueError(f"num_draft={num_draft!r} must be an integer >= 1")
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocab_size={draft.config.vocab_size} differs from the target's "
                             f"{target.config.vocab_size}: the draft must share the target's tokenizer")
        self.device = torch.device(device)
        self.D, self.max_batch_size, self.max_seq_len = num_draft, max_batch_size, max_seq_len
        kw = dict(max_batch_size=max_batch_size, max_seq_len=max_seq_len, max_draft_len=num_draft,
                  device=self.device)
        target, draft = target.to(self.device).eval(), draft.to(self.device).eval()
        self.target_mgr = target_manager or _new_manager(
            target, target_version, target_kv_cache_config or default_kv_cache_config(
                target, max_batch_size=max_batch_size, max_seq_len=max_seq_len, device=device), **kw)
        self.draft_mgr = draft_manager or _new_manager(
            draft, draft_version, draft_kv_cache_config or default_kv_cache_config(
                draft, max_batch_size=max_batch_size, max_seq_len=max_seq_len, device=device), **kw)
        self.target = ModelRunner(target, self.target_mgr, self.device)
        self.draft = ModelRunner(draft, self.draft_mgr, self.device)
        self.eos = set(model_eos_ids(target, None) if eos_token_ids is None else eos_token_ids)
        self.stats = SpecStats()
        self._next_id = 0

    # ---- forwards -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _logits(self, runner: ModelRunner, items: list[StepItem], rows_per_item: list[int]) -> list[torch.Tensor]:
        """One packed forward; for each item the logits of its last ``rows_per_item[i]`` positions."""
        for it, k in zip(items, rows_per_item):
            it.num_logits = k
        return list(runner.run(items).split(rows_per_item))

    # ---- life cycle -----------------------------------------------------------------------------------------
    def _free(self, seq: SpecSequence) -> None:
        for mgr in (self.target_mgr, self.draft_mgr):
            if mgr.has_request(seq.request_id):
                mgr.free_resources(seq.request_id)

    def _admit(self, waiting: deque, running: list) -> None:
        """Prefill waiting sequences (whole known text, both models) while pages and batch slots last."""
        new = []
        while waiting and len(running) + len(new) < self.max_batch_size:
            seq = waiting[0]
            n = len(seq.tokens)
            try:
                self.target_mgr.begin_context_chunk(seq.request_id, 0, n, n)
                try:
                    self.draft_mgr.begin_context_chunk(seq.request_id, 0, n, n)
                except OutOfPagesError:
                    self.target_mgr.free_resources(seq.request_id)
                    raise
            except OutOfPagesError:
                if not running and not new:
                    raise RuntimeError(f"request {seq.index}: {n} tokens do not fit the KV caches even alone "
                                       f"(target free blocks {self.target_mgr.get_num_free_blocks()}, draft "
                                       f"{self.draft_mgr.get_num_free_blocks()}); enlarge the caches") from None
                break
            waiting.popleft()
            new.append(seq)
        if not new:
            return
        items = [StepItem(s.request_id, list(s.tokens), 0, decode=False) for s in new]
        logits = self._logits(self.target, items, [1] * len(items))
        self._logits(self.draft, items, [1] * len(items))  # fills the draft's cache; its guess is not needed
        toks, margins = greedy(torch.cat(logits))
        for s, t, m in zip(new, toks, margins):
            n = len(s.tokens)
            self.target_mgr.end_context_chunk(s.request_id, n)
            self.draft_mgr.end_context_chunk(s.request_id, n)
            s.draft_history = n
            self._append(s, [t], [m])
            running.append(s)

    def _append(self, seq: SpecSequence, toks: list[int], margins: list[float]) -> None:
        for t, m in zip(toks, margins):
            seq.tokens.append(t)
            seq.margins.append(m)
            if t in self.eos:
                seq.finished, seq.finish_reason = True, "eos"
                return
            if len(seq.generated) >= self._max_new:
                seq.finished, seq.finish_reason = True, "length"
                return

    def _reserve(self, running: list, waiting: deque) -> list:
        """begin_generation on both managers for every running sequence, preempting on lack of pages."""
        done = []
        for seq in list(running):
            if seq not in running:
                continue
            pending = len(seq.tokens) - seq.draft_history
            while True:
                try:
                    self.target_mgr.begin_generation(seq.request_id, num_draft=self.D)
                    try:
                        self.draft_mgr.begin_generation(seq.request_id, num_draft=pending + self.D - 2)
                    except OutOfPagesError:
                        self._unreserve_target(seq)
                        raise
                    done.append(seq)
                    break
                except OutOfPagesError:
                    victims = [s for s in running if s not in done]
                    victim = victims[-1]
                    running.remove(victim)
                    self._free(victim)
                    victim.num_preemptions += 1
                    self.stats.preemptions += 1
                    waiting.appendleft(victim)
                    if victim is seq:
                        break
        return done

    def _unreserve_target(self, seq: SpecSequence) -> None:
        """Undo a target begin_generation: an end_generation that accepts nothing and keeps the history."""
        n = len(seq.tokens)
        self.target_mgr.end_generation(seq.request_id, n, num_draft=self.D, num_accepted=-1)

    def _step(self, batch: list) -> None:
        D = self.D
        # 1) draft: D greedy proposals per sequence; the first forward also feeds a lagging pending token
        proposals = {s.request_id: [] for s in batch}
        first = sorted(batch, key=lambda s: len(s.tokens) - s.draft_history)  # 1-token (decode) items first
        items = []
        for s in first:
            pend = s.tokens[s.draft_history:]
            items.append(StepItem(s.request_id, pend, s.draft_history, decode=len(pend) == 1))
        for k in range(D):
            logits = self._logits(self.draft, items, [1] * len(items))
            toks, _ = greedy(torch.cat(logits))
            for s, t in zip(first, toks):
                proposals[s.request_id].append(t)
            if k + 1 < D:
                items = [StepItem(s.request_id, [proposals[s.request_id][-1]],
                                  len(s.tokens) + len(proposals[s.request_id]) - 1, decode=True) for s in first]
        # 2) target: verify the pending token and the D proposals in one (1 + D)-query decode
        items = [StepItem(s.request_id, [s.tokens[-1]] + proposals[s.request_id], len(s.tokens) - 1, decode=True)
                 for s in batch]
        logits = self._logits(self.target, items, [1 + D] * len(batch))
        for s, lg in zip(batch, logits):
            want, margins = greedy(lg)             # the target's choice after each of the 1 + D positions
            prop = proposals[s.request_id]
            a = 0
            while a < D and prop[a] == want[a]:
                a += 1
            L = len(s.tokens)
            self.stats.steps += 1
            self.stats.proposed += D
            self.stats.accepted += a
            self.stats.emitted += a + 1
            # 3) commit: the target keeps positions up to L + a - 1; the draft up to min(L + D - 2, L + a - 1)
            self.target_mgr.end_generation(s.request_id, L + a + 1, num_draft=D, num_accepted=a)
            pending = L - s.draft_history
            new_hd = L + min(D - 1, a)
            self.draft_mgr.end_generation(s.request_id, new_hd + 1, num_draft=pending + D - 2,
                                          num_accepted=new_hd - s.draft_history - 1)
            s.draft_history = new_hd
            self._append(s, want[:a + 1], margins[:a + 1])

    def generate(self, prompts: list[list[int]], max_new_tokens: int = 32) -> list[SpecOutput]:
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
        self._max_new = max_new_tokens
        seqs = []
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            need = len(p) + max_new_tokens + self.D + 1
            if need > self.max_seq_len:
                raise ValueError(f"prompt {i}: len {len(p)} + max_new_tokens {max_new_tokens} + num_draft "
                                 f"{self.D} + 1 = {need} exceeds max_seq_len={self.max_seq_len}")
            seqs.append(SpecSequence(i, self._new_id(), len(p), list(p)))
        waiting, running = deque(seqs), []
        while waiting or running:
            self._admit(waiting, running)
            for s in [s for s in running if s.finished]:
                running.remove(s)
                self._free(s)
            if not running:
                continue
            batch = self._reserve(running, waiting)
            if batch:
                self._step(batch)
            elif not running:
                head = waiting[0]
                raise RuntimeError(f"request {head.index}: a speculative step of {1 + self.D} tokens at length "
                                   f"{len(head.tokens)} does not fit the KV caches even alone; enlarge the caches")
            for s in [s for s in running if s.finished]:
                running.remove(s)
                self._free(s)
            for s in waiting:  # a preempted sequence re-prefills everything it knows
                s.draft_history = 0
        return [SpecOutput(s.index, s.generated[:max_new_tokens], s.margins[:max_new_tokens], s.finish_reason,
                           s.num_preemptions) for s in seqs]

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id
