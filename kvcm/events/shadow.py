"""A router's index of one worker rebuilt from its events alone, and the blocks the worker would match: the two
sides of the event-consistency contract (docs/contract.md, "KV cache events").

``ShadowIndex`` is what NVIDIA Dynamo's indexer or llm-d keeps: per group, each announced block's hash with its
parent's and the cache level it is on. ``cached_blocks(mgr)`` reads the same out of a kvcm manager's reuse tree
(every block with a page in a group, on the GPU or the host), hashing it on its own from tokens and scope, not
through the emitter. After every call, replaying the manager's events into the index must give exactly
``cached_blocks``: a missing removal leaves a block a request can no longer reuse, a missing store hides one it
can, a wrong level or parent routes by a tier or a chain the worker does not have.
"""

from __future__ import annotations

from . import hashing
from .types import GPU_LEVEL, HOST_LEVEL, KVCacheRemovedData, KVCacheStoredData, KVCacheUpdatedData


class ShadowIndex:
    def __init__(self, blocks: dict | None = None):
        self.blocks: dict[tuple, tuple] = dict(blocks or {})   # (group, hash) -> (parent hash, level)
        self.anomalies: list[str] = []                           # removals or moves of blocks never announced

    @staticmethod
    def group_of(event):
        return event.layer_group_id if event.layer_group_id is not None else event.window_size

    def apply(self, events) -> "ShadowIndex":
        for event in events:
            group, data = self.group_of(event), event.data
            if isinstance(data, KVCacheStoredData):
                parent = data.parent_hash
                for block in data.blocks:
                    self.blocks[(group, block.block_hash)] = (parent, block.cache_level)
                    parent = block.block_hash
            elif isinstance(data, KVCacheRemovedData):
                for h in data.block_hashes:
                    if self.blocks.pop((group, h), None) is None:
                        self.anomalies.append(f"event {event.event_id}: removed {h!r} of group {group}, never stored")
            elif isinstance(data, KVCacheUpdatedData) and data.cache_level is not None:
                entry = self.blocks.get((group, data.block_hash))
                if entry is None or entry[1] != data.cache_level.old_value:
                    self.anomalies.append(f"event {event.event_id}: {data.block_hash!r} of group {group} moved "
                                          f"from level {data.cache_level.old_value}, the index has {entry}")
                    continue
                self.blocks[(group, data.block_hash)] = (entry[0], data.cache_level.new_value)
        return self


def cached_blocks(mgr) -> dict[tuple, tuple]:
    """``(group, hash) -> (parent hash, level)`` of every block the manager's tree holds a page for, in the hash
    algorithm its events use (``v1_block_key`` when they are off)."""
    cache = mgr._reuse
    if cache is None:
        return {}
    queue = getattr(mgr._events, "queue", None)
    algo = queue.hash_algo if queue is not None else hashing.V1_BLOCK_KEY
    out = {}
    for scope, root in cache.tree.roots.items():
        stack = [(child, None, (child.tokens,)) for child in root.children.values()]
        while stack:
            node, parent, path = stack.pop()
            h = hashing.chain(algo, scope, path)[-1]
            for g, (page, host) in enumerate(zip(node.pages, node.host)):
                if page >= 0:
                    out[(g, h)] = (parent, GPU_LEVEL)
                elif host >= 0:
                    out[(g, h)] = (parent, HOST_LEVEL)
            stack.extend((child, h, path + (child.tokens,)) for child in node.children.values())
    return out


def differences(shadow: ShadowIndex, truth: dict) -> list[str]:
    """What the index holds that the manager does not, and the reverse, one line each (empty: consistent)."""
    out = [f"announced, not cached: group {k[0]} block {k[1]!r} {v}" for k, v in shadow.blocks.items()
           if truth.get(k) != v and k not in truth]
    out += [f"cached, not announced: group {k[0]} block {k[1]!r} {v}" for k, v in truth.items()
            if k not in shadow.blocks]
    out += [f"differs: group {k[0]} block {k[1]!r} announced {shadow.blocks[k]}, cached {v}" for k, v in truth.items()
            if k in shadow.blocks and shadow.blocks[k] != v]
    return out + shadow.anomalies
