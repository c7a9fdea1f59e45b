"""A request as the engine sees it: token ids, how many of them have final KV, and why it stopped.

``num_computed`` mirrors the manager's *history*. A sequence is *prefilling* while ``num_computed`` is below
``prefill_len`` (the tokens known when it was admitted: the prompt, plus the tokens it had generated before a
preemption, since recompute prefills them again); after that each step decodes its last token.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """Greedy decoding limits. ``ignore_eos`` keeps going past the tokenizer's / model's EOS id.

    Checked like the managers' arguments (``kvcm.ConfigError`` naming the field, the value and the limit); as in
    vLLM, one stop string may be given without a list (``stop_strings="\\n"``), and lists become tuples."""
    max_new_tokens: int = 32
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        from ..validation import count, flag
        from .checks import int_list
        count("max_new_tokens", self.max_new_tokens, 1)
        object.__setattr__(self, "stop_token_ids", int_list("stop_token_ids", self.stop_token_ids))
        stops = (self.stop_strings,) if isinstance(self.stop_strings, str) else self.stop_strings
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
            raise ConfigError("stop_strings", self.stop_strings, "must be a non-empty string or a list of them")
        object.__setattr__(self, "stop_strings", tuple(stops))
        flag("ignore_eos", self.ignore_eos)


def _checked_init(init):
    """An unknown keyword is a ``ConfigError`` listing the fields (vLLM's ``max_tokens`` is ``max_new_tokens``)."""
    names = [f.name for f in dataclasses.fields(SamplingParams)]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in names]
        if unknown or len(args) > len(names):
            key = unknown[0] if unknown else "args"
            raise ConfigError(f"SamplingParams.{key}", kwargs.get(key, args),
                              f"is not a field; the fields are {', '.join(names)}")
        init(self, *args, **kwargs)
    return __init__


SamplingParams.__init__ = _checked_init(SamplingParams.__init__)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False, slots=True)
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: int = field(default_factory=lambda: next(_ids))
    index: int = 0                      # position in the generate() call's prompt list
    output_token_ids: list[int] = field(default_factory=list)
    logits_margins: list[float] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0               # tokens whose KV is in the cache (the manager's history)
    prefill_len: int = 0                # tokens to prefill since the last admission
    finish_reason: str | None = None    # "eos", "stop_token", "stop_string", "length", "max_seq_len"
    stop_string: str | None = None
    first_token_time: float | None = None   # time.perf_counter() when its first output token was read
    num_preemptions: int = 0
    admitted_len: int | None = None     # tokens the manager was given at admission (block reuse); None: none
    # the scheduler's decode item for this sequence, rewritten each step rather than made anew (256 a step at
    # batch 256): a step's items are read while it is launched and committed, never after
    decode_item: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.prefill_len = len(self.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def last_token(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.prefill_len

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: the KV is gone; every known token is prefilled again on readmission."""
        self.num_computed = 0
        self.admitted_len = None
        self.prefill_len = self.num_tokens
        self.status = Status.WAITING
        self.num_preemptions += 1
