"""The n-gram drafter: a pool of *pattern -> continuations* learned from every token the engine has seen.

The semantics are TensorRT-LLM's n-gram speculative decoding (PyTorch backend:
``tensorrt_llm/_torch/speculative/ngram.py``, ``NGramPoolManager.get_draft_tokens``; options and defaults from
``NGramDecodingConfig`` in ``tensorrt_llm/llmapi/llm_args.py``; end to end in
``tests/unittest/_torch/speculative/test_ngram.py``, which checks that its outputs equal plain decoding):

* a *pattern* is a run of ``1 .. max_matching_ngram_size`` tokens (default 2), its *matches* are the runs of up
  to ``max_draft_len`` tokens that followed it, kept in insertion order;
* each time a request drafts, the pool first learns every (pattern, match) of the request's tokens from its
  ``start_index`` on: the prompt on the first call, then the tokens accepted since (and the last
  ``max_draft_len + max_matching_ngram_size - 1`` tokens again, so a match cut short by the end of the text
  grows to full length). A new match of a known pattern drops the pattern's shorter matches; with
  ``is_keep_all=False`` a longer match replaces the pattern's matches;
* the longest pattern at the end of the request's text that the pool knows gives the draft: its oldest match
  (``is_use_oldest``, default) or its newest, cut to what the request may still generate;
* ``is_public_pool`` (default): one pool for every request, never cleared, so a request drafts from the
  phrasing of earlier requests' prompts and outputs (GSM8K answers share much of it); otherwise each request
  has its own pool, dropped when it finishes.

The pool holds only what was fed to it; an upstream quirk is not copied: TensorRT-LLM removes shorter matches
while iterating over the same ordered set, which can leave one behind; here every shorter match goes.
Speculation stays exact whatever the pool proposes: the target verifies every draft.
"""
from __future__ import annotations

from .. import validation
from .runner import StepItem

#: TensorRT-LLM's ``NGramDecodingConfig`` defaults.
MAX_MATCHING_NGRAM_SIZE = 2


class NgramPool:
    """Pattern -> matches (an insertion-ordered set: a dict with None values)."""

    def __init__(self, max_draft_len: int, max_matching_ngram_size: int = MAX_MATCHING_NGRAM_SIZE, *,
                 is_keep_all: bool = True, is_use_oldest: bool = True):
        self.max_draft_len, self.max_n = max_draft_len, max_matching_ngram_size
        self.is_keep_all, self.is_use_oldest = is_keep_all, is_use_oldest
        self.matches: dict[tuple[int, ...], dict[tuple[int, ...], None]] = {}
        # the matches shorter than max_draft_len of each pattern (cut short by the end of a text): the only
        # ones a new match can drop, so adding one costs what they number, not what the pattern's matches do
        # (a public pool gives a common token thousands)
        self.short: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self.matches)

    def clear(self) -> None:
        self.matches.clear()
        self.short.clear()

    def add(self, pattern: tuple[int, ...], match: tuple[int, ...]) -> None:
        known = self.matches.get(pattern)
        if known is None or (not self.is_keep_all and len(match) > len(next(iter(known)))):
            self.matches[pattern] = {match: None}
            self.short.pop(pattern, None)
        elif match not in known:
            short = self.short.get(pattern)
            if short:
                keep = []
                for m in short:
                    if len(m) < len(match):
                        del known[m]
                    else:
                        keep.append(m)
                short[:] = keep
            known[match] = None
        else:
            return
        if len(match) < self.max_draft_len:
            self.short.setdefault(pattern, []).append(match)

    def learn(self, tail: list[int], max_size: int) -> None:
        """Every pattern of ``max_size .. 1`` tokens in ``tail`` with the (up to ``max_draft_len``) tokens
        after it inside ``tail``."""
        d, n, add, matches = self.max_draft_len, len(tail), self.add, self.matches
        t = tuple(tail)
        for size in range(max_size, 0, -1):
            for i in range(n - size):
                pattern, match = t[i:i + size], t[i + size:i + size + d]
                known = matches.get(pattern)
                if known is None or match not in known:     # else adding it changes nothing (most of a rescan)
                    add(pattern, match)

    def lookup(self, tail: list[int], max_size: int, limit: int) -> list[int]:
        """The match of the longest known pattern ending ``tail`` (``max_size`` tokens at most), at most
        ``limit`` tokens; empty when no pattern is known."""
        for size in range(max_size, 0, -1):
            known = self.matches.get(tuple(tail[-size:]))
            if known:
                match = next(iter(known)) if self.is_use_oldest else next(reversed(known))
                return list(match[:limit])
        return []


class NgramDrafter:
    """Drafts from an :class:`NgramPool` (TensorRT-LLM's defaults: a public pool, patterns of up to 2 tokens,
    every match kept, the oldest proposed). No model and no cache of its own, so the capacity hooks are empty.

    A proposal shorter than the verification's ``k`` drafts (or none) is padded with its last token (the
    sequence's last token when empty): the step keeps its shape ``(bs, 1 + D)``, the padding is merely
    rejected; a step where no sequence has a proposal runs as a plain decode. :attr:`num_proposed` counts the
    drafts that came from the pool."""

    manager = None
    runner = None
    graphs = None
    cost_per_draft = 0.0     # a dictionary lookup: speculation's gate (``spec_gate.py``) never closes on cost

    def __init__(self, num_draft: int, *, max_matching_ngram_size: int = MAX_MATCHING_NGRAM_SIZE,
                 is_keep_all: bool = True, is_use_oldest: bool = True, is_public_pool: bool = True):
        num_draft = validation.count("num_draft", num_draft, 1)
        max_matching_ngram_size = validation.count("max_matching_ngram_size", max_matching_ngram_size, 1)
        for name, value in (("is_keep_all", is_keep_all), ("is_use_oldest", is_use_oldest),
                            ("is_public_pool", is_public_pool)):
            validation.flag(name, value)
        self.num_draft, self.max_n = num_draft, max_matching_ngram_size
        self.is_public_pool = is_public_pool
        self._pool_args = dict(is_keep_all=is_keep_all, is_use_oldest=is_use_oldest)
        self.public = NgramPool(num_draft, max_matching_ngram_size, **self._pool_args) if is_public_pool else None
        self.private: dict[object, NgramPool] = {}
        self.start_index: dict[object, int] = {}      # tokens of each request the pool has learned already
        self.num_proposed = 0
        kind = "pool" if is_public_pool else "private"
        self.name = f"ngram-{kind}-n{max_matching_ngram_size}"

    def pool(self, request_id) -> NgramPool:
        if self.public is not None:
            return self.public
        pool = self.private.get(request_id)
        if pool is None:
            pool = self.private[request_id] = NgramPool(self.num_draft, self.max_n, **self._pool_args)
        return pool

    def clear(self) -> None:
        """Forget everything learned, and the count of proposals (a benchmark's cold start; the engine itself
        never clears a public pool)."""
        if self.public is not None:
            self.public.clear()
        self.private.clear()
        self.start_index.clear()
        self.num_proposed = 0

    def propose(self, request_id, prompt: list[int], output: list[int], limit: int) -> list[int]:
        """Learn the request's new tokens (``prompt + output`` from its start index), then up to ``limit``
        drafts for what follows them."""
        total = len(prompt) + len(output)
        if limit <= 0:
            return []
        start = self.start_index.get(request_id, 0)
        p = len(prompt)
        tail = output[start - p:] if start >= p else prompt[start:] + output
        pool = self.pool(request_id)
        max_size = min(self.max_n, total - 1)
        pool.learn(tail, max_size)
        self.start_index[request_id] = max(0, total - (self.num_draft + self.max_n - 1))
        return pool.lookup(tail, max_size, limit)

    def draft(self, seqs, items: list[StepItem]) -> None:
        """Fill in each verification's drafts. When the pool proposes nothing for any sequence of a step made of
        decodes only, the step becomes a plain decode (``(bs, 1)``, its own graph): there is nothing to verify,
        and the reserved draft slots are rewound like rejected ones (``Scheduler.verify``)."""
        proposed, decodes_only = False, True
        for seq, it in zip(seqs, items):
            k = it.num_logits - 1
            decodes_only &= it.decode
            if not it.decode or k <= 0:
                continue
            out = seq.output_token_ids
            # as upstream: never past the request's last token (max_new_tokens)
            limit = min(k, seq.params.max_new_tokens - len(out) - 1)
            got = self.propose(seq.request_id, seq.prompt_token_ids, out, limit)
            self.num_proposed += len(got)
            proposed |= bool(got)
            pad = got[-1] if got else seq.last_token
            it.token_ids[1:] = got + [pad] * (k - len(got))
        if decodes_only and not proposed:
            for it in items:
                del it.token_ids[1:]
                it.num_logits = 1

    # the capacity hooks a drafter with its own cache needs; the pool keeps no KV
    def begin_chunk(self, seq, start: int, n: int) -> None: ...
    def begin_decode(self, seq) -> None: ...
    def end_chunk(self, seq, history: int) -> None: ...
    def end_decode(self, seq, length: int, num_accepted: int) -> None: ...
    def close(self) -> None: ...

    def free(self, seq) -> None:
        """A finished request's private pool and start index go; a preempted one keeps them (its tokens stay)."""
        if seq.is_finished:
            self.start_index.pop(seq.request_id, None)
            self.private.pop(seq.request_id, None)
