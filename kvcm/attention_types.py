"""Attention types: what a layer reads of its past, and so which of a request's pages it still needs.

A layer group asks its type, never ``window is None``: the type owns the arithmetic of one life cycle at a page
size of ``tokens_per_block`` tokens: the oldest token the in-flight query still reads
(``first_live_token``), the pages below it that may be released and that a block-reuse match may leave out
(``stale_range``), the pages a request of some length needs (``pages_needed``) and the most one request can hold
(``max_pages``, for bounded types). V2 releases stale pages and its reuse skips them; V1 keeps every page.

* ``FullAttention``: every token, every page.
* ``SlidingWindow(window, sink_tokens)``: the last ``window`` tokens plus the first ``sink_tokens``
  (docs/semantics.md 4.1; its policy's ``window_first_token`` and ``window_bound_blocks``).
* ``ChunkedLocal(chunk)``: the tokens of the query's own chunk of ``chunk`` positions, Llama 4's
  ``attention_chunk_size`` (its policy's ``chunk_first_token``; vLLM ``v1/core/single_type_kv_cache_manager.py``
  ``ChunkedLocalAttentionManager``: ``get_num_skipped_tokens(n) = n // chunk * chunk``, and
  ``find_longest_cache_hit`` looks up only the pages from the last chunk's start; ``v1/kv_cache_interface.py``
  ``ChunkedLocalAttentionSpec``; TensorRT-LLM's ``attention_chunk_size`` in
  ``tensorrt_llm/_torch/attention_backend/interface.py``).

``TYPES`` names each type for the life-cycle key and ``describe()``; a new type is its class here and a line in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .policy import Policy, active
from .units import ceil_div


@dataclass(frozen=True)
class AttentionType:
    """The base: full attention's answers (nothing stale, unbounded)."""

    kind = "full"
    releases_pages = False          # whether pages fall out of what future queries read

    @property
    def is_full(self) -> bool:
        return not self.releases_pages

    @property
    def window(self) -> int | None:
        """The sliding window, for code that reports it (None for every other type)."""
        return None

    @property
    def chunk_tokens(self) -> int | None:
        """The attention chunk, for the kernels that mask by it (None for every other type)."""
        return None

    def mask_floor(self, positions):
        """The lowest key position a query at ``positions`` (an int or a tensor) attends to, as the model defines
        it: what the engine's attention masks by. It is the model's rule, not the release decision
        (``first_live_token``, which a defect may change), so a page released too early is missed by a query
        that still reads it and the output leaves Hugging Face's."""
        return 0

    def first_live_token(self, history: int) -> int:
        """The oldest token the query at position ``history`` (the in-flight token) reads."""
        return 0

    def stale_range(self, history: int, tokens_per_block: int) -> tuple[int, int]:
        """Logical pages ``[lo, hi)`` no future query reads at this history (empty when nothing is stale)."""
        return 0, 0

    def pages_needed(self, capacity: int, history: int, tokens_per_block: int) -> int:
        """Pages a request of ``capacity`` slots holds at this history: all of them less the stale ones."""
        lo, hi = self.stale_range(history, tokens_per_block)
        return ceil_div(capacity, tokens_per_block) - (hi - lo)

    def max_pages(self, tokens_per_block: int) -> int:
        """Most pages one request can hold in this group, one batch in flight (bounded types only)."""
        raise ValueError(f"a {self.kind}-attention group holds a request's every page: it has no bound")

    def label(self) -> str:
        return self.kind


@dataclass(frozen=True)
class FullAttention(AttentionType):
    pass


@dataclass(frozen=True)
class SlidingWindow(AttentionType):
    window_tokens: int
    sink_tokens: int = 0
    policy: Policy = field(default_factory=active, compare=False, repr=False)   # its window arithmetic's decisions

    kind = "sliding"
    releases_pages = True

    @property
    def window(self) -> int:
        return self.window_tokens

    def mask_floor(self, positions):
        """Sinks aside: no Hugging Face model the engine runs has them."""
        return positions + 1 - self.window_tokens

    def sink_pages(self, tokens_per_block: int) -> int:
        return ceil_div(self.sink_tokens, tokens_per_block)

    def first_live_token(self, history: int) -> int:
        return max(0, self.policy.window_first_token(history, self.window_tokens))

    def stale_range(self, history: int, tokens_per_block: int) -> tuple[int, int]:
        lo = min(ceil_div(history, tokens_per_block), self.sink_pages(tokens_per_block))
        return lo, max(lo, self.policy.window_first_token(history, self.window_tokens) // tokens_per_block)

    def max_pages(self, tokens_per_block: int) -> int:
        return self.policy.window_bound_blocks(self.window_tokens, tokens_per_block) + self.sink_pages(tokens_per_block)

    def label(self) -> str:
        return f"window{self.window_tokens}"


@dataclass(frozen=True)
class ChunkedLocal(AttentionType):
    chunk: int
    policy: Policy = field(default_factory=active, compare=False, repr=False)   # its chunk arithmetic's decisions

    kind = "chunked"
    releases_pages = True

    @property
    def chunk_tokens(self) -> int:
        return self.chunk

    def mask_floor(self, positions):
        """The query's own chunk: Hugging Face's ``chunked_overlay`` (``masking_utils.py``) keeps key ``k`` for
        query ``q`` when ``k // chunk == q // chunk``."""
        return positions // self.chunk * self.chunk

    def first_live_token(self, history: int, tokens_per_block: int = 1) -> int:
        return self.policy.chunk_first_token(history, self.chunk, tokens_per_block)

    def stale_range(self, history: int, tokens_per_block: int) -> tuple[int, int]:
        return 0, self.first_live_token(history, tokens_per_block) // tokens_per_block

    def max_pages(self, tokens_per_block: int) -> int:
        """The pages of one whole chunk at its worst alignment to the pages (a chunk starts at a multiple of
        ``chunk``, so ``chunk % tokens_per_block`` decides the offsets), plus the in-flight token's page."""
        step = math.gcd(self.chunk, tokens_per_block)
        worst = max(ceil_div(offset + self.chunk, tokens_per_block) for offset in range(0, tokens_per_block, step)
                    if offset == 0 or self.chunk % tokens_per_block)
        return worst + 1

    def label(self) -> str:
        return f"chunk{self.chunk}"


TYPES = {"full": FullAttention, "sliding": SlidingWindow, "chunked": ChunkedLocal}


def of_layer(window: int | None, sink_tokens: int = 0, chunk: int | None = None, policy: Policy | None = None
             ) -> AttentionType:
    """The type of a layer as a ``LayerSpec`` gives it (a window, sink tokens, an attention chunk); ``policy``:
    the decisions of a sliding window's and a chunk's arithmetic (None: the active policy)."""
    if chunk is not None:
        return ChunkedLocal(chunk, active() if policy is None else policy)
    if window is not None:
        return SlidingWindow(window, sink_tokens, active() if policy is None else policy)
    return FullAttention()
