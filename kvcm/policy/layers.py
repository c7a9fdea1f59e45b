"""Layer groups and windows (``kvcm/layer_groups.py``, ``kvcm/attention_types.py``)."""

from __future__ import annotations

from ..units import ceil_div
from ._decisions import Decisions, rule, setting


class LayerDecisions(Decisions):
    SUBSYSTEM = "layer groups"

    @rule("the life cycle a layer belongs to, which layers sharing one pool must agree on: its window and its sink "
          "tokens in whole blocks, as TensorRT-LLM's AttnLifeCycle keys it (keyed by raw sink tokens, layers whose "
          "sinks fill the same blocks got a pool each; vLLM PR #14097: windows dropped, sliding layers kept every "
          "page)")
    def life_cycle(window: int | None, sink_tokens: int, tpb: int) -> tuple:
        return window, ceil_div(sink_tokens, tpb)

    life_cycle_order = setting(
        "first_seen", "the order life cycles are numbered in: first seen first, as TensorRT-LLM's LifeCycleRegistry "
        "numbers them, so a pool_ratio copied from a real config weights the same groups ('full_first': the "
        "full-attention life cycles before the sliding ones, which weighted other groups)",
        choices=("first_seen", "full_first"))

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
