"""Attention types: what a layer reads of its past, and so which of a request's pages it still needs.

A layer group asks its type, never ``window is None``: the type owns the arithmetic of one life cycle and its page
size (``tokens_per_block`` tokens a page): the oldest token the in-flight query still reads (``first_live_token``),
the pages below it that may be released and that a block-reuse match may leave out (``stale_range``), the pages a
request of some length needs (``pages_needed``) and the most one request can hold (``max_pages``, for bounded
types). V2 releases stale pages and its reuse skips them; V1 keeps every page.

* ``FullAttention``: every token, every page.
* ``SlidingWindow(window, sink_tokens)``: the last ``window`` tokens plus the first ``sink_tokens``
  (docs/semantics.md 4.1; its policy's ``window_first_token`` and ``window_bound_blocks``).
* ``ChunkedLocal(chunk)``: the tokens of the query's own chunk of ``chunk`` positions, Llama 4's
  ``attention_chunk_size`` (its policy's ``chunk_first_token``; vLLM ``v1/core/single_type_kv_cache_manager.py``
  ``ChunkedLocalAttentionManager``: ``get_num_skipped_tokens(n) = n // chunk * chunk``, and
  ``find_longest_cache_hit`` looks up only the pages from the last chunk's start; ``v1/kv_cache_interface.py``
  ``ChunkedLocalAttentionSpec``; TensorRT-LLM's ``attention_chunk_size`` in
  ``tensorrt_llm/_torch/attention_backend/interface.py``).

``TYPES`` is the registry: ``of_layer`` (a layer's type), ``life_cycle`` (the key layers sharing a pool agree on) and
the engine (``with_window``, the type of a layer the model runs with a narrower window) ask it, in its order, the
first type that ``takes`` a layer being its type. A new type is its class here and a line in ``TYPES``
(``suites/managers/test_attention_types.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .policy import Decisions, Policy, active, rule
from .units import ceil_div


@dataclass(frozen=True)
class AttentionType:
    """The base: full attention's answers (nothing stale, unbounded). ``tokens_per_block``: the page size."""

    tokens_per_block: int = field(kw_only=True)

    kind = "full"
    releases_pages = False          # whether pages fall out of what future queries read

    @staticmethod
    def takes(window: int | None, chunk: int | None) -> bool:
        """Whether a layer of this ``window`` and attention ``chunk`` (a ``LayerSpec``'s) has this type."""
        return True

    @classmethod
    def life_cycle(cls, window: int | None, sink_tokens: int, chunk: int | None, tokens_per_block: int,
                   policy: Policy) -> tuple:
        """The key of the life cycle such a layer belongs to (its policy's ``life_cycle``): layers with one key
        share a pool."""
        return policy.life_cycle(window, sink_tokens, tokens_per_block)

    @classmethod
    def build(cls, window: int | None, sink_tokens: int, chunk: int | None, tokens_per_block: int,
              policy: Policy) -> "AttentionType":
        return cls(tokens_per_block=tokens_per_block)

    @property
    def is_full(self) -> bool:
        return not self.releases_pages

    @property
    def window(self) -> int | None:
        """The sliding window, for code that reports it (None for every other type)."""
        return None

    @property
    def sink_tokens(self) -> int:
        return 0

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

    def with_window(self, window: int) -> "AttentionType | None":
        """The type of a layer of this group that the model runs with a sliding ``window`` (a transformers layer
        says so): a window within what the group keeps, or None where the group's pages would not hold it."""
        return TYPES["sliding"](window, tokens_per_block=self.tokens_per_block)

    def first_live_token(self, history: int) -> int:
        """The oldest token the query at position ``history`` (the in-flight token) reads."""
        return 0

    def sink_pages(self) -> int:
        return 0

    def stale_range(self, history: int) -> tuple[int, int]:
        """Logical pages ``[lo, hi)`` no future query reads at this history (empty when nothing is stale)."""
        return 0, 0

    def pages_needed(self, capacity: int, history: int) -> int:
        """Pages a request of ``capacity`` slots holds at this history: all of them less the stale ones."""
        lo, hi = self.stale_range(history)
        return ceil_div(capacity, self.tokens_per_block) - (hi - lo)

    def max_pages(self) -> int:
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

    @staticmethod
    def takes(window: int | None, chunk: int | None) -> bool:
        return window is not None

    @classmethod
    def build(cls, window, sink_tokens, chunk, tokens_per_block, policy):
        return cls(window, sink_tokens, policy, tokens_per_block=tokens_per_block)

    @property
    def window(self) -> int:
        return self.window_tokens

    def mask_floor(self, positions):
        """Sinks aside: no Hugging Face model the engine runs has them."""
        return positions + 1 - self.window_tokens

    def with_window(self, window: int) -> AttentionType | None:
        return SlidingWindow(window, tokens_per_block=self.tokens_per_block) if window <= self.window_tokens else None

    def sink_pages(self) -> int:
        return ceil_div(self.sink_tokens, self.tokens_per_block)

    def first_live_token(self, history: int) -> int:
        return max(0, self.policy.window_first_token(history, self.window_tokens))

    def stale_range(self, history: int) -> tuple[int, int]:
        tpb = self.tokens_per_block
        lo = min(ceil_div(history, tpb), ceil_div(self.sink_tokens, tpb))
        return lo, max(lo, self.policy.window_first_token(history, self.window_tokens) // tpb)

    def max_pages(self) -> int:
        return self.policy.window_bound_blocks(self.window_tokens, self.tokens_per_block) + self.sink_pages()

    def label(self) -> str:
        return f"window{self.window_tokens}"


@dataclass(frozen=True)
class ChunkedLocal(AttentionType):
    chunk: int
    policy: Policy = field(default_factory=active, compare=False, repr=False)   # its chunk arithmetic's decisions

    kind = "chunked"
    releases_pages = True

    @staticmethod
    def takes(window: int | None, chunk: int | None) -> bool:
        return chunk is not None

    @classmethod
    def life_cycle(cls, window, sink_tokens, chunk, tokens_per_block, policy) -> tuple:
        """A chunked layer's life cycle is its chunk too (it has no window)."""
        return (*policy.life_cycle(window, sink_tokens, tokens_per_block), chunk)

    @classmethod
    def build(cls, window, sink_tokens, chunk, tokens_per_block, policy):
        return cls(chunk, policy, tokens_per_block=tokens_per_block)

    @property
    def chunk_tokens(self) -> int:
        return self.chunk

    def mask_floor(self, positions):
        """The query's own chunk: Hugging Face's ``chunked_overlay`` (``masking_utils.py``) keeps key ``k`` for
        query ``q`` when ``k // chunk == q // chunk``."""
        return positions // self.chunk * self.chunk

    def with_window(self, window: int) -> AttentionType | None:
        return None

    def first_live_token(self, history: int) -> int:
        return self.policy.chunk_first_token(history, self.chunk, self.tokens_per_block)

    def stale_range(self, history: int) -> tuple[int, int]:
        return 0, self.first_live_token(history) // self.tokens_per_block

    def max_pages(self) -> int:
        """The pages of one whole chunk at its worst alignment to the pages (a chunk starts at a multiple of
        ``chunk``, so ``chunk % tokens_per_block`` decides the offsets), plus the in-flight token's page."""
        tpb = self.tokens_per_block
        step = math.gcd(self.chunk, tpb)
        worst = max(ceil_div(offset + self.chunk, tpb) for offset in range(0, tpb, step)
                    if offset == 0 or self.chunk % tpb)
        return worst + 1

    def label(self) -> str:
        return f"chunk{self.chunk}"


TYPES: dict[str, type[AttentionType]] = {"chunked": ChunkedLocal, "sliding": SlidingWindow, "full": FullAttention}
"""Every attention type, in the order a layer is offered to them: the first that ``takes`` it is its type."""


def type_of(window: int | None, chunk: int | None = None) -> type[AttentionType]:
    """The type of a layer with this ``window`` and attention ``chunk``: the first of ``TYPES`` that takes it."""
    return next(cls for cls in TYPES.values() if cls.takes(window, chunk))


def life_cycle(window: int | None, sink_tokens: int, chunk: int | None, tokens_per_block: int,
               policy: Policy | None = None) -> tuple:
    """The life-cycle key of a layer (its type's), at pages of ``tokens_per_block``; ``policy``: None, the active
    one."""
    return type_of(window, chunk).life_cycle(window, sink_tokens, chunk, tokens_per_block,
                                             active() if policy is None else policy)


def of_layer(window: int | None, sink_tokens: int = 0, chunk: int | None = None, *, tokens_per_block: int,
             policy: Policy | None = None) -> AttentionType:
    """The type of a layer as a ``LayerSpec`` gives it (a window, sink tokens, an attention chunk), at pages of
    ``tokens_per_block``; ``policy``: the decisions of a sliding window's and a chunk's arithmetic (None: the
    active policy)."""
    return type_of(window, chunk).build(window, sink_tokens, chunk, tokens_per_block,
                                        active() if policy is None else policy)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class AttentionDecisions(Decisions):
    SUBSYSTEM = "attention types"

    @rule("the life cycle a layer belongs to, which layers sharing one pool must agree on: its window and its sink "
          "tokens in whole blocks, as TensorRT-LLM's AttnLifeCycle keys it (keyed by raw sink tokens, layers whose "
          "sinks fill the same blocks got a pool each; vLLM PR #14097: windows dropped, sliding layers kept every "
          "page)")
    def life_cycle(window: int | None, sink_tokens: int, tpb: int) -> tuple:
        return window, ceil_div(sink_tokens, tpb)

    @rule("the oldest token a future query of a sliding layer reads at this history: the in-flight token's window "
          "(TensorRT-LLM PR #6768; docs/semantics.md 2.1: a block released one token early is read after it is "
          "freed)")
    def window_first_token(history: int, window: int) -> int:
        return history + 1 - window

    @rule("the most blocks of a window one request holds, sinks aside: an unaligned window plus one block, one "
          "batch in flight (vLLM issue #49878: a second in-flight batch charged to every sliding pool)")
    def window_bound_blocks(window: int, tpb: int) -> int:
        return ceil_div(window, tpb) + 1

    @rule("the first token of the chunk a chunked-local query reads at this history: the in-flight token's own "
          "chunk (vLLM ChunkedLocalAttentionManager.get_num_skipped_tokens: n // chunk * chunk); mlx-lm PR #1673: "
          "Llama 4's ChunkedKVCache trimmed by its padded buffer length and dropped the current chunk's live tokens")
    def chunk_first_token(history: int, chunk: int, tokens_per_block: int) -> int:
        return history // chunk * chunk
