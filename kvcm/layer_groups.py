"""Layer groups: layers that share one life cycle (one attention type), each group one pool.

A group's page arithmetic and page size are its attention type's (``kvcm.attention_types``), which the group
delegates to: full-attention groups keep every page of a request; a sliding-window group of window W (with S sink
tokens) can drop pages no future query will read (docs/semantics.md 4.1: ``[min(ceil(h/tpb), sink_pages), max(that,
(h + 1 - W) // tpb))`` at history h, the ``+1`` the in-flight token); a chunked-local group drops the chunks before
the query's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .attention_types import AttentionType, life_cycle, of_layer
from .model_spec import ModelSpec
from .policy import Decisions, Policy, resolve, setting
from .units import ceil_div


@dataclass
class LayerGroup:
    """One pool's worth of layers of one attention type. ``layer_offsets`` are byte offsets of each layer inside one
    block. What it reads and holds is its type's: ``stale_range``, ``pages_needed``, ``max_pages``, ``sink_pages``
    and the page size ``tokens_per_block`` are the type's own, the window and sinks what reports show."""

    index: int
    layers: tuple[int, ...]
    attention: AttentionType
    bytes_per_block: int
    layer_offsets: dict[int, int] = field(default_factory=dict)
    num_blocks: int = 0
    name: str = ""

    def __post_init__(self):
        self.name = self.name or self.attention.label()
        # the manager's hot paths ask every step: the type's own bound methods, so asking costs one call
        self.stale_range = self.attention.stale_range
        self.pages_needed = self.attention.pages_needed

    @property
    def is_full(self) -> bool:
        return self.attention.is_full

    @property
    def tokens_per_block(self) -> int:
        return self.attention.tokens_per_block

    @property
    def window(self) -> int | None:
        return self.attention.window

    @property
    def sink_tokens(self) -> int:
        return self.attention.sink_tokens

    def stale_range(self, history: int) -> tuple[int, int]:
        """The type's ``stale_range`` (each instance binds it in its place: ``__post_init__``)."""
        return self.attention.stale_range(history)

    def pages_needed(self, capacity: int, history: int) -> int:
        """The type's ``pages_needed`` (bound in its place too)."""
        return self.attention.pages_needed(capacity, history)

    def max_pages(self) -> int:
        return self.attention.max_pages()

    def sink_pages(self) -> int:
        return self.attention.sink_pages()


def build_layer_groups(spec: ModelSpec, tpb: int, policy: Policy | None = None) -> list[LayerGroup]:
    """Group layers by life cycle, numbered in order of first appearance, as TensorRT-LLM's
    ``LifeCycleRegistry`` numbers them (the policy's ``life_cycle_order``): a ``pool_ratio`` copied from a real
    config weights the same groups. ``policy``: the manager's (None: the active policy).

    A life cycle is its attention type's key (``kvcm.attention_types.life_cycle``: window and sink *blocks*, as
    ``AttnLifeCycle`` keys it, through ``policy.life_cycle``; a chunked layer's chunk too): layers whose sink tokens
    round up to the same number of blocks share one group, which keeps ``sink_blocks * tpb`` sink tokens. The
    group's type is built from its key's window, so a key that drops the window makes a full group.
    """
    policy = resolve(policy)
    members: dict[tuple, list[int]] = {}
    for i, layer in enumerate(spec.layers):
        key = life_cycle(layer.sliding_window, layer.sink_tokens, layer.attention_chunk, tpb, policy)
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
        attention = of_layer(key[0], ceil_div(first.sink_tokens, tpb) * tpb, first.attention_chunk,
                             tokens_per_block=tpb, policy=policy)
        groups.append(LayerGroup(gi, tuple(members[key]), attention, offset, offsets))
    return groups


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class LayerGroupDecisions(Decisions):
    SUBSYSTEM = "layer groups"

    life_cycle_order = setting(
        "first_seen", "the order life cycles are numbered in: first seen first, as TensorRT-LLM's LifeCycleRegistry "
        "numbers them, so a pool_ratio copied from a real config weights the same groups ('full_first': the "
        "full-attention life cycles before the sliding ones, which weighted other groups)",
        choices=("first_seen", "full_first"))
