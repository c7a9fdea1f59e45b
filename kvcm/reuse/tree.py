"""The radix tree of cached blocks: one root per reuse scope, one node per block of tokens.

A node is a block of a prefix: its tokens (``tpb`` of them, fewer for a stored partial last block), its parent
(the prefix before it) and, per layer group, the page that holds its KV (-1 where that group has none: never
stored there, or evicted). A child is filed under its tokens themselves (the policy's ``block_key_hash``): keys are
compared exactly, so two prompts share a block only when every token of the prefix is equal (TensorRT-LLM V1's
``BlockKey`` equality; a digest alone, as vLLM had, can collide). The scope (LoRA task id, cache salt) picks the
root, so scopes never share a block.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from operator import attrgetter

from ..policy import Decisions, resolve, setting

_serials = itertools.count()
_by_serial = attrgetter("serial")
_TOP = float("inf")      # above every token id: ``prefix + (_TOP,)`` bounds the tuples that start with ``prefix``


def deepest_first(node: "Node") -> list["Node"]:
    """Every descendant of ``node``, deepest first: the order in which a subtree leaves the tree, so a child
    always goes before its parent (TensorRT-LLM's ``freeChildren`` / ``detachDescendantsFromLookupTree``)."""
    found, stack = [], list(node.children.values())
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(child.children.values())
    return sorted(found, key=lambda n: -n.depth)


class Node:
    __slots__ = ("tokens", "parent", "children", "by_first", "pages", "refs", "stamps", "child_pages", "priority",
                 "duration_ms", "host", "depth", "serial")

    def __init__(self, tokens: tuple, parent: "Node | None", num_groups: int, priority: int = 35):
        self.tokens = tokens
        self.parent = parent
        self.serial = next(_serials)            # creation order: ties between partial matches go to the oldest
        self.children: dict = {}
        self.by_first: dict = {}                # first token -> Siblings starting with it (partial matching)
        self.pages = [-1] * num_groups          # per group: the page holding this block's KV, -1 = none
        self.refs = [0] * num_groups            # per group: requests holding that page
        self.stamps = [0] * num_groups          # per group: when the page was last released (LRU order)
        self.child_pages = [0] * num_groups     # per group: children that have a page there (leaf test)
        self.host = [-1] * num_groups           # per group: the host-tier page holding it once offloaded (V1)
        self.priority = priority
        self.duration_ms = None                  # how long it keeps its priority once released (None: always)
        self.depth = -1 if parent is None else parent.depth + 1

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def has_pages(self) -> bool:
        """A page in some group, on the GPU or in the host tier (or falling between them, V2's ``host_level``): a
        node without one is unreachable."""
        return any(p >= 0 for p in self.pages) or any(h != -1 for h in self.host)

    def __repr__(self):
        return f"Node(depth={self.depth}, tokens={len(self.tokens)}, pages={self.pages}, refs={self.refs})"


class Siblings:
    """The children of one node that start with the same token, sorted by their tokens, so the siblings sharing a
    prefix with some tokens are one contiguous run found by bisection. A prompt prefix shared by many requests
    that ends mid-block gives its last full block one such child per request; scanning them all made each
    admission cost as much as the requests cached before it."""
    __slots__ = ("keys", "nodes", "lengths")

    def __init__(self):
        self.keys: list[tuple] = []
        self.nodes: list[Node] = []
        self.lengths: dict[int, int] = {}       # key length -> how many siblings have it

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self):
        return iter(self.nodes)

    def add(self, node: Node) -> None:
        i = bisect_right(self.keys, node.tokens)
        self.keys.insert(i, node.tokens)
        self.nodes.insert(i, node)
        n = len(node.tokens)
        self.lengths[n] = self.lengths.get(n, 0) + 1

    def remove(self, node: Node) -> None:
        i = bisect_left(self.keys, node.tokens)
        while i < len(self.keys) and self.keys[i] == node.tokens:
            if self.nodes[i] is node:
                del self.keys[i], self.nodes[i]
                n = len(node.tokens)
                self.lengths[n] -= 1
                if not self.lengths[n]:
                    del self.lengths[n]
                return
            i += 1

    def span(self, prefix: tuple) -> tuple[int, int]:
        """The index range of the siblings whose tokens start with ``prefix`` (the one equal to it first)."""
        return bisect_left(self.keys, prefix), bisect_right(self.keys, prefix + (_TOP,))

    def longest_common(self, tokens: tuple) -> int:
        """The most leading tokens any sibling shares with ``tokens``: one of its two neighbours in sorted order."""
        i, best = bisect_left(self.keys, tokens), 0
        for key in self.keys[max(0, i - 1):i + 1]:
            n, limit = 0, min(len(key), len(tokens))
            while n < limit and key[n] == tokens[n]:
                n += 1
            best = max(best, n)
        return best


class RadixTree:
    def __init__(self, num_groups: int, policy=None):
        """``policy``: its cache's decisions (None: the active policy); its ``block_key_hash`` files children."""
        self.num_groups = num_groups
        self.roots: dict = {}
        self._hash = resolve(policy).block_key_hash      # None: a child's key is its tokens
        self._unlink = resolve(policy).detached_node_unlinked

    def root(self, scope, create: bool = False) -> Node | None:
        node = self.roots.get(scope)
        if node is None and create:
            node = self.roots[scope] = Node((), None, self.num_groups)
        return node

    def child(self, parent: Node, tokens: tuple) -> Node | None:
        return parent.children.get(tokens if self._hash is None else self._hash(tokens))

    def add_child(self, parent: Node, tokens: tuple, priority: int, duration_ms: int | None = None) -> Node:
        node = Node(tokens, parent, self.num_groups, priority)
        node.duration_ms = duration_ms
        parent.children[tokens if self._hash is None else self._hash(tokens)] = node
        if tokens:
            siblings = parent.by_first.get(tokens[0])
            if siblings is None:
                siblings = parent.by_first[tokens[0]] = Siblings()
            siblings.add(node)
        return node

    def remove(self, node: Node) -> None:
        """Take a node without children out of its parent (its pages are the caller's business)."""
        parent = node.parent
        key = node.tokens if self._hash is None else self._hash(node.tokens)
        if parent.children.get(key) is node:
            del parent.children[key]
        siblings = parent.by_first.get(node.tokens[0]) if node.tokens else None
        if siblings is not None:
            siblings.remove(node)
            if not siblings:
                del parent.by_first[node.tokens[0]]
        if self._unlink:           # a detached node names no parent: nothing can take it for a filed one
            node.parent = None

    def walk(self, root: Node | None, blocks: list[tuple]) -> list[Node]:
        """The nodes of the longest run of ``blocks`` found from ``root``, in order (full blocks only)."""
        out: list[Node] = []
        node = root
        if node is None:
            return out
        key = self._hash
        for tokens in blocks:
            node = node.children.get(tokens if key is None else key(tokens))
            if node is None:
                break
            out.append(node)
        return out

    @staticmethod
    def partial_candidates(parent: Node, tokens: tuple):
        """Children of ``parent`` sharing a first token with ``tokens``, each with the length of the common prefix:
        most first, the oldest first among equals (TensorRT-LLM compares every child; this order is the same).
        Yielded level by level: the siblings sharing ``k`` tokens are one bisected run of the sorted siblings, so
        a caller that takes the first usable one pays for the best level, not for every sibling."""
        siblings = parent.by_first.get(tokens[0]) if tokens else None
        if not siblings:
            return
        lo = hi = None
        for k in range(siblings.longest_common(tokens), 0, -1):
            a, b = siblings.span(tokens[:k])
            level = siblings.nodes[a:b] if lo is None else siblings.nodes[a:lo] + siblings.nodes[hi:b]
            lo, hi = a, b
            if not level:
                continue
            first = min(level, key=_by_serial)      # usually taken: the rest are sorted only when it is not
            yield k, first
            for node in sorted(level, key=_by_serial)[1:]:
                yield k, node


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class TreeDecisions(Decisions):
    SUBSYSTEM = "block reuse: keys"

    detached_node_unlinked = setting(
        True, "whether a block taken out of the tree drops its link to its parent (TensorRT-LLM PR #16037, nvbugs "
        "6418912 in #16019: released detached blocks kept their mPrevBlockInSeq link, and chains of finished "
        "requests stayed joined through them); a link left behind makes the block look filed where it is not")

    block_key_hash = setting(
        None, "what a block is filed and found under among its parent's children: None, its tokens themselves, "
        "compared exactly; else a function of the tokens whose value is the key (vLLM GHSA-rm76-4mrf-v9r8 / PR "
        "#12621: a weak hash let one prompt read another's blocks)")
