"""The contracts the engine relies on, declared: what a step-level KV cache manager and a drafter must offer.

``kvcm/engine`` is typed against these and uses no other member of a manager
(``suites/managers/test_protocols.py`` scans the engine's code for it, since no type checker runs here, and checks
kvcm's own managers and drafters against the lists at run time), so a user's manager given to ``LLM(manager=)``
needs exactly these.

Failure shapes (ARCHITECTURE.md, "How a manager reports failure"): bad arguments always raise
``kvcm.ConfigError`` with nothing changed; ``begin_*`` raise ``kvcm.OutOfPagesError`` when the pages are not
there, with nothing changed (the scheduler preempts and retries); a request id the manager does not hold raises
``kvcm.UnknownRequestError``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class StepManager(Protocol):
    """A manager the engine drives one step at a time (kvcm's V1, V2 and DeepSeek-V4 managers)."""

    kvcm_version: str
    tokens_per_block: int
    layer_groups: list
    pools: list                 # one page pool per layer group (``num_blocks``, ``num_used``, ``peak_held`` ...)
    stale_released: list[int]   # per group, pages given back as they left a sliding window since the last reset
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int | None
    max_draft_len: int
    max_tokens: int             # tokens the pools hold (for the engine's log line)
    pool_bytes: int

    def begin_context_chunk(self, request_id, start: int, num_tokens: int, prompt_len: int,
                            draft_len: int = 0) -> None:
        """Reserve the pages a prefill chunk of ``num_tokens`` at position ``start`` writes (the first chunk
        creates the request). Raises ``OutOfPagesError`` with nothing changed (a request this call created is
        gone again)."""

    def end_context_chunk(self, request_id, history: int) -> None:
        """After the chunk's forward: the KV of the first ``history`` tokens is final."""

    def begin_generation(self, request_id, num_draft: int = 0) -> None:
        """Reserve one decode token plus ``num_draft`` draft slots. Raises ``OutOfPagesError`` with nothing
        changed."""

    def end_generation(self, request_id, num_tokens: int, num_draft: int = 0, num_accepted: int = 0) -> None:
        """After the step: the request has ``num_tokens`` tokens; the draft slots not accepted are given back."""

    def free_resources(self, request_id) -> None:
        """Release every page of the request (raises ``UnknownRequestError`` for an id it does not hold)."""

    def has_request(self, request_id) -> bool:
        """Whether the request holds pages here."""

    def block_tables(self, request_ids) -> list:
        """Per request, per layer group, the physical page of each logical block (-1: released)."""

    def layer_kv(self, layer_idx: int) -> torch.Tensor:
        """The layer's pages as ``[num_blocks, kv_factor, tokens_per_block, kv_heads, head_dim]``."""

    def group_of_layer(self, layer_idx: int) -> int:
        """Which layer group (pool) holds the layer's pages."""

    def get_num_free_blocks(self) -> int:
        """Free pages of the most constrained full-attention group."""

    def block_table(self, request_id) -> list:
        """Per layer group, the request's physical page of each logical block (-1: released)."""

    def get_capacity(self, request_id) -> int:
        """Token slots the request holds."""

    def get_history(self, request_id) -> int:
        """Tokens of the request whose KV is final."""

    def reset_page_usage(self) -> None:
        """Count peaks from what is held now and released pages from zero (``kvcm.engine.page_usage``)."""


@runtime_checkable
class ReuseManager(StepManager, Protocol):
    """A step manager that reuses blocks (prefix caching): what ``kvcm/engine/reuse.py`` and the scheduler add."""

    enable_block_reuse: bool

    def add_sequence(self, request_id, token_ids, *, lora_task_id=None, cache_salt=None,
                     retention_config=None) -> int:
        """Admit a request with its tokens; the tokens already cached are returned (their KV is not recomputed)."""

    def append_tokens(self, request_id, token_ids) -> None:
        """The tokens a step computed, so their blocks can be stored once full."""

    def get_request_stats(self, request_id):
        """The request's reuse figures (``kvcm.RequestReuseStats``)."""

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (False, with nothing changed, while a request holds pages)."""


@runtime_checkable
class Drafter(Protocol):
    """Who proposes the draft tokens of speculative decoding (``kvcm.engine.drafters``).

    A drafter fills in exactly ``num_draft`` tokens for every verification item, so a batch keeps one
    verification shape; when it keeps KV of its own it mirrors the target's capacity calls (``begin_chunk`` ...
    ``free``) on its own manager, raising ``OutOfPagesError`` as a manager does.
    """

    num_draft: int
    name: str       # names its acceptance figures (``LLM.spec_stats.name``)
    # one draft's time in target forwards: the acceptance rate at which it breaks even, the speculation gate's
    # default threshold (``kvcm/engine/spec_gate.py``; a drafter written without it is taken as free, 0)
    cost_per_draft: float

    def begin_chunk(self, seq, start: int, n: int) -> None: ...

    def end_chunk(self, seq, history: int) -> None: ...

    def begin_decode(self, seq) -> None: ...

    def end_decode(self, seq, length: int, num_accepted: int) -> None: ...

    def draft(self, seqs, items: list) -> None:
        """Propose the draft tokens of every verification item in ``items`` (in place)."""

    def free(self, seq) -> None: ...

    def close(self) -> None: ...


def missing_members(obj, protocol) -> list[str]:
    """The members of ``protocol`` that ``obj`` lacks (``isinstance`` says only yes or no)."""
    names = []
    for klass in protocol.__mro__:      # a protocol's own members and those of the protocols it extends
        if klass in (protocol.__mro__[-1], Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        names += [n for n in klass.__dict__ if not n.startswith("_")] + list(klass.__dict__.get("__annotations__", {}))
    return sorted({n for n in names if not hasattr(obj, n)})
