"""Layer groups: layers that share one life cycle, and the block arithmetic of that life cycle.

Full-attention groups keep every block of a request. A sliding-window group of window W (with S sink tokens)
can drop blocks that no future query will read: docs/semantics.md 4.1 gives the stale range at history h as
``[min(ceil(h/tpb), sink_blocks), max(that, (h + 1 - W) // tpb))``; the ``+1`` is the in-flight token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import seams
from .model_spec import ModelSpec
from .units import ceil_div


@dataclass
class LayerGroup:
    """One pool's worth of layers. ``layer_offsets`` are byte offsets of each layer inside one block."""

    index: int
    layers: tuple[int, ...]
    window: int | None
    sink_tokens: int
    bytes_per_block: int
    layer_offsets: dict[int, int] = field(default_factory=dict)
    num_blocks: int = 0
    name: str = ""

    @property
    def is_full(self) -> bool:
        return self.window is None

    def sink_blocks(self, tpb: int) -> int:
        return ceil_div(self.sink_tokens, tpb)

    def stale_range(self, history: int, tpb: int) -> tuple[int, int]:
        """Logical blocks ``[lo, hi)`` no future query reads at this history (empty for full attention)."""
        if self.window is None:
            return (0, 0)
        lo = min(ceil_div(history, tpb), self.sink_blocks(tpb))
        return lo, max(lo, seams.window_first_token(history, self.window) // tpb)

    def blocks_needed(self, capacity: int, history: int, tpb: int) -> int:
        """Blocks a request holds here: ``ceil(capacity / tpb)`` less the stale ones."""
        lo, hi = self.stale_range(history, tpb)
        return ceil_div(capacity, tpb) - (hi - lo)

    def max_window_blocks(self, tpb: int) -> int:
        """Most blocks one request can hold in this sliding group: an unaligned window plus its sinks."""
        if self.window is None:
            raise ValueError("a full-attention group has no window")
        return seams.window_bound_blocks(self.window, tpb) + self.sink_blocks(tpb)


def build_layer_groups(spec: ModelSpec, tpb: int) -> list[LayerGroup]:
    """Group layers by life cycle, numbered in order of first appearance, as TensorRT-LLM's
    ``LifeCycleRegistry`` numbers them (``seams.life_cycle_order``): a ``pool_ratio`` copied from a real config
    weights the same groups.

    A life cycle is (window, sink *blocks*), as ``AttnLifeCycle`` keys it (``seams.life_cycle``): layers whose
    sink tokens round up to the same number of blocks share one group, which keeps ``sink_blocks * tpb`` sink
    tokens.
    """
    members: dict[tuple, list[int]] = {}
    for i, layer in enumerate(spec.layers):
        members.setdefault(seams.life_cycle(layer.sliding_window, layer.sink_tokens, tpb), []).append(i)
    groups = []
    for gi, key in enumerate(seams.life_cycle_order(list(members))):
        offsets, offset = {}, 0
        for li in members[key]:
            offsets[li] = offset
            offset += spec.layers[li].bytes_per_block(tpb)
        window, sink_tokens = key[0], ceil_div(spec.layers[members[key][0]].sink_tokens, tpb) * tpb
        name = "full" if window is None else f"window{window}"
        groups.append(LayerGroup(gi, tuple(members[key]), window, sink_tokens, offset, offsets, name=name))
    return groups
