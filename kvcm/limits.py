"""``Limits``: what an engine promises the cache it sizes, as one frozen value.

TensorRT-LLM's ``KVCacheManager`` takes these one by one (``max_batch_size``, ``max_seq_len``, ``max_num_tokens``,
the draft length, extra KV tokens per request); every layer here (managers, constraints, warmup, the engine)
reads the same object, so the bundle is checked once and spelled once:

* ``max_batch_size``: requests in flight at once (``B``);
* ``max_seq_len``: tokens of one request, prompt and output (``S``);
* ``max_num_tokens``: tokens one step may carry (``N``, the chunked-prefill budget; None = no budget);
* ``max_draft_len``: draft tokens a request may verify per step (``D``);
* ``num_extra_kv_tokens``: KV slots a request holds beyond its tokens (e.g. MTP's extra slots);
* ``device``: where the pools live (``meta`` = accounting only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from . import validation
from .errors import ConfigError
from .validation import MAX_BATCH_SIZE, MAX_SEQ_LEN  # the limits live in validation, so kvcm plan checks them before torch loads

FIELDS = ("max_batch_size", "max_seq_len", "max_num_tokens", "max_draft_len", "num_extra_kv_tokens", "device")


@dataclass(frozen=True)
class Limits:
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int | None = None
    max_draft_len: int = 0
    num_extra_kv_tokens: int = 0
    device: torch.device = torch.device("meta")

    def __post_init__(self) -> None:
        checked = {
            "max_batch_size": validation.count("max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE,
                                               "kvcm.MAX_BATCH_SIZE: batch descriptions and warmup hold one entry "
                                               "per request"),
            "max_seq_len": validation.count("max_seq_len", self.max_seq_len, 1, MAX_SEQ_LEN,
                                            "kvcm.MAX_SEQ_LEN: warmup's long dummy holds one entry per block"),
            "max_num_tokens": validation.optional_count("max_num_tokens", self.max_num_tokens, 1),
            "max_draft_len": validation.count("max_draft_len", self.max_draft_len),
            "num_extra_kv_tokens": validation.count("num_extra_kv_tokens", self.num_extra_kv_tokens),
        }
        try:
            checked["device"] = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError("device", self.device, f"must be a torch device ('meta', 'cpu', 'cuda:0'): {exc}"
                              ) from None
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, limits: Limits | None = None, **fields) -> Limits:
        """``limits`` as given, or built from keyword fields (the pre-``Limits`` calling convention); not both."""
        given = {k: v for k, v in fields.items() if v is not None}
        unknown = sorted(set(given) - set(FIELDS))
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown}; the limits are {list(FIELDS)}")
        if limits is None:
            for name in ("max_batch_size", "max_seq_len"):
                if name not in given:
                    raise ConfigError(name, None, "is required (or pass limits=kvcm.Limits(...))")
            return cls(**given)
        if not isinstance(limits, Limits):
            raise ConfigError("limits", type(limits).__name__, "must be a kvcm.Limits")
        if given:
            raise ConfigError(sorted(given)[0], given[sorted(given)[0]], "is given twice: also in limits= "
                              "(use limits.replace(...) to change one field)")
        return limits

    def replace(self, **changes) -> Limits:
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict:
        """The keyword form, for callers of the pre-``Limits`` convention."""
        return {name: getattr(self, name) for name in FIELDS}
