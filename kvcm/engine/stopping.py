"""When a request stops: the checks made on each resolved output token, in the order their reasons rank.

The order is the reason a request reports when one token meets several conditions: an end-of-sequence token
(unless the request ignores it), one of the request's stop tokens, a stop string in its text (``stop_strings.py``),
then the two lengths, ``max_new_tokens`` before the engine's ``max_seq_len``. The scheduler asks after every
token it writes, plain or verified (``scheduler.py``), so the reasons are the same with or without speculation.
"""
from __future__ import annotations

from .sequence import Sequence
from .stop_strings import StopStrings


class StopConditions:
    """The engine-wide half of the stop checks (its end-of-sequence ids, its ``max_seq_len``, its tokenizer's
    stop-string check); the per-request half lives in each sequence's ``SamplingParams``."""

    def __init__(self, eos_token_ids: tuple[int, ...], max_seq_len: int, stop_strings: StopStrings):
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_seq_len = max_seq_len
        self.stop_strings = stop_strings

    def check(self, seq: Sequence, pos: int) -> bool:
        """Whether output ``pos`` (the newest resolved one) stops ``seq``; sets its finish reason (and the stop
        string found, for a stop-string stop)."""
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
        found = self.stop_strings.find(seq.params.stop_strings, seq.output_token_ids, pos)
        if found is None:
            return False
        seq.stop_string = found
        return True
