"""Stop strings, checked after every token without decoding every sequence's tail at every step.

A sequence stops at a stop string when the decoded text of its newest output tokens (a window of the longest stop
string's length plus 8 tokens) contains one. Decoding is what costs: about 12 µs a sequence with SmolLM2's fast
Hugging Face tokenizer, so a batch of 256 paid about 3 ms of host time a step for it, more than the H200 takes
for a few-shot GSM8K mixed step's forward (``benchmarks/host_step.py --stop-strings`` measures it).

The window is decoded only when the new token could have completed a stop string. A stop string that was not in
the text before this token is there now only if this token's text supplies its last character: so the check
first asks whether the token's own text (decoded once per token id and kept) holds the last character of any of
the request's stop strings. That is exact when the last character is ASCII: in UTF-8 an ASCII byte is never part
of a longer character, so a token that yields the character in context (a byte-level BPE piece, a byte-fallback
piece, a special token's text) yields it decoded alone too, and one that does not yield it alone cannot yield it
in context. A stop string ending in any other character is searched for after every token, as before.
"""
from __future__ import annotations


class StopStrings:
    """One tokenizer's stop-string check; each token id's own text is decoded once and kept."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._ends: dict[tuple[str, ...], frozenset[str] | None] = {}

    def _last_chars(self, stops: tuple[str, ...]) -> frozenset[str] | None:
        """The stop strings' last characters; None when one is not ASCII (then every token is checked)."""
        try:
            return self._ends[stops]
        except KeyError:
            ends = frozenset(s[-1] for s in stops)
            self._ends[stops] = ends if all(c.isascii() for c in ends) else None
            return self._ends[stops]

    def _may_end(self, token: int, ends: frozenset[str]) -> bool:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token])
        return any(c in text for c in ends)

    def find(self, stops: tuple[str, ...], output: list[int], pos: int) -> str | None:
        """The first of ``stops`` in the text of ``output``'s window ending at ``pos``; None when none is."""
        ends = self._last_chars(stops)
        if ends is not None and not self._may_end(output[pos], ends):
            return None
        longest = max(len(s) for s in stops)
        tail = self.tokenizer.decode(output[max(0, pos + 1 - (longest + 8)):pos + 1])
        for s in stops:
            if s in tail:
                return s
        return None
