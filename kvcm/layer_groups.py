"""Layer groups: layers that share one life cycle (one attention type), each group one pool.

A group's page arithmetic is its attention type's (``kvcm.attention_types``): full-attention groups keep every
block of a request; a sliding-window group of window W (with S sink tokens) can drop blocks no future query will
read (docs/semantics.md 4.1: ``[min(ceil(h/tpb), sink_blocks), max(that, (h + 1 - W) // tpb))`` at history h,
the ``+1`` the in-flight token); a chunked-local group drops the chunks before the query's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .attention_types import AttentionType, of_layer
from .model_spec import ModelSpec
from .policy import Policy, resolve
from .units import ceil_div


@dataclass
class LayerGroup:
    """One pool's worth of layers. ``layer_offsets`` are byte offsets of each layer inside one block. Its page
    arithmetic is its attention type's (``kvcm.attention_types``); ``window`` / ``sink_tokens`` are the
    sliding window's, kept for what reports them."""

    index: int
    layers: tuple[int, ...]
    window: int | None
    sink_tokens: int
    bytes_per_block: int
    layer_offsets: dict[int, int] = field(default_factory=dict)
    num_blocks: int = 0
    name: str = ""
    attention: AttentionType | None = None      # None: from window and sink_tokens

    def __post_init__(self):
        if self.attention is None:
            self.attention = of_layer(self.window, self.sink_tokens)
        # the manager's hot path asks every step: bound to the type's method, so asking costs one call
        self.stale_range = self.attention.stale_range

    @property
    def is_full(self) -> bool:
        return self.attention.is_full

    def sink_blocks(self, tpb: int) -> int:
        return ceil_div(self.sink_tokens, tpb)

    def stale_range(self, history: int, tpb: int) -> tuple[int, int]:
        """Logical blocks ``[lo, hi)`` no future query reads at this history (empty for full attention); each
        instance binds its type's method in its place (``__post_init__``)."""
        return self.attention.stale_range(history, tpb)

    def blocks_needed(self, capacity: int, history: int, tpb: int) -> int:
        """Blocks a request holds here: ``ceil(capacity / tpb)`` less the stale ones."""
        return self.attention.pages_needed(capacity, history, tpb)

    def max_window_blocks(self, tpb: int) -> int:
        """Most blocks one request can hold in this group (sliding or chunked): its type's bound."""
        return self.attention.max_pages(tpb)


def build_layer_groups(spec: ModelSpec, tpb: int, policy: Policy | None = None) -> list[LayerGroup]:
    """Group layers by life cycle, numbered in order of first appearance, as TensorRT-LLM's
    ``LifeCycleRegistry`` numbers them (the policy's ``life_cycle_order``): a ``pool_ratio`` copied from a real
    config weights the same groups. ``policy``: the manager's (None: the active policy).

    A life cycle is (window, sink *blocks*), as ``AttnLifeCycle`` keys it (``policy.life_cycle``): layers whose
    sink tokens round up to the same number of blocks share one group, which keeps ``sink_blocks * tpb`` sink
    tokens.
    """
    policy = resolve(policy)
    members: dict[tuple, list[int]] = {}
    for i, layer in enumerate(spec.layers):   # a chunked layer's life cycle is its chunk (it has no window)
        key = policy.life_cycle(layer.sliding_window, layer.sink_tokens, tpb)
        if layer.attention_chunk is not None:
            key = (*key, layer.attention_chunk)
        members.setdefault(key, []).append(i)
    groups = []
    keys = list(members)
    if policy.life_cycle_order == "full_first":
        keys.sort(key=lambda key: key[0] is not None)
    for gi, key in enumerate(keys):
        offsets, offset = {}, 0
        for li in members[key]:
            offsets[li] = offset
            offset += spec.layers[li].bytes_per_block(tpb)
        first = spec.layers[members[key][0]]
        window, sink_tokens = key[0], ceil_div(first.sink_tokens, tpb) * tpb
        attention = of_layer(window, sink_tokens, first.attention_chunk, policy)
        groups.append(LayerGroup(gi, tuple(members[key]), window, sink_tokens, offset, offsets,
                                 name=attention.label(), attention=attention))
    return groups
