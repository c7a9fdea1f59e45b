"""KV cache events behind the contract: each engine's events as a KV-aware router reads them, and the router's index.

A router (NVIDIA Dynamo's indexer, llm-d) keeps, per worker, which blocks it holds, in which group and on which
cache level, from the events alone. The engines name the same things differently: kvcm and TensorRT-LLM send
``stored`` / ``removed`` / ``updated`` (a level move) with a layer group; vLLM's ``BlockPool`` sends
``BlockStored`` / ``BlockRemoved`` (with ``group_idx``, ``medium``) and ``AllBlocksCleared``; SGLang's
``RadixCache`` the same three with one group. An adapter turns its engine's events into the four below and says
which blocks its engine would match now (``cached_blocks``); the contract replays the first into a
``RouterIndex`` and compares it with the second (``pytest_kvcm/contract/test_target_events.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

GPU, HOST = 0, 1
LEVELS = {"GPU": GPU, "CPU": HOST, None: GPU}      # vLLM's and SGLang's ``medium``


@dataclass(frozen=True)
class Stored:
    group: int
    hashes: tuple
    level: int = GPU


@dataclass(frozen=True)
class Removed:
    group: int
    hashes: tuple


@dataclass(frozen=True)
class Moved:
    group: int
    block_hash: object
    old: int
    new: int


@dataclass(frozen=True)
class Cleared:
    pass


class RouterIndex:
    """``(group, block hash) -> level`` of every block the events announced and did not take back. A removal of a
    block it does not hold, or a move from a level it is not on, is kept as an anomaly (a router would ignore it)."""

    def __init__(self):
        self.blocks: dict[tuple, int] = {}
        self.anomalies: list[str] = []

    def apply(self, events) -> "RouterIndex":
        for event in events:
            if isinstance(event, Stored):
                self.blocks.update(((event.group, h), event.level) for h in event.hashes)
            elif isinstance(event, Removed):
                for h in event.hashes:
                    if self.blocks.pop((event.group, h), None) is None:
                        self.anomalies.append(f"removed a block never stored: group {event.group}, {h!r}")
            elif isinstance(event, Moved):
                if self.blocks.get((event.group, event.block_hash)) != event.old:
                    self.anomalies.append(f"moved a block not on level {event.old}: {event}")
                self.blocks[(event.group, event.block_hash)] = event.new
            elif isinstance(event, Cleared):
                self.blocks.clear()
        return self

    def differences(self, cached: dict[tuple, int]) -> list[str]:
        """What the index and the engine's cache disagree on, one line each (empty: consistent)."""
        out = [f"announced, not cached: {k} on level {v}" for k, v in self.blocks.items() if k not in cached]
        out += [f"cached, not announced: {k} on level {v}" for k, v in cached.items() if k not in self.blocks]
        out += [f"on level {cached[k]}, announced on {v}: {k}" for k, v in self.blocks.items()
                if k in cached and cached[k] != v]
        return out + self.anomalies


def from_kvcm(events) -> list:
    """kvcm's (TensorRT-LLM's) events: stored blocks and removals by layer group, level moves as ``Moved``; a
    priority change moves nothing a router indexes."""
    out = []
    for e in events:
        group, data = e.layer_group_id, e.data
        if e.kind == "stored":
            out.append(Stored(group, tuple(b.block_hash for b in data.blocks), data.blocks[0].cache_level))
        elif e.kind == "removed":
            out.append(Removed(group, tuple(data.block_hashes)))
        elif e.kind == "updated" and data.cache_level is not None:
            out.append(Moved(group, data.block_hash, data.cache_level.old_value, data.cache_level.new_value))
    return out


def from_vllm_like(events) -> list:
    """vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` (SGLang sends the same names, with no
    ``group_idx``: one group)."""
    out = []
    for e in events:
        name = type(e).__name__
        group = getattr(e, "group_idx", None) or 0
        if name == "BlockStored":
            out.append(Stored(group, tuple(e.block_hashes), LEVELS[getattr(e, "medium", None)]))
        elif name == "BlockRemoved":
            out.append(Removed(group, tuple(e.block_hashes)))
        elif name == "AllBlocksCleared":
            out.append(Cleared())
    return out
