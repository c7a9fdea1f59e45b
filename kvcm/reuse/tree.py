"""The radix tree of cached blocks: one root per reuse scope, one node per block of tokens.

A node is a block of a prefix: its tokens (``tpb`` of them, fewer for a stored partial last block), its parent
(the prefix before it) and, per layer group, the page that holds its KV (-1 where that group has none: never
stored there, or evicted). A child is filed under ``seams.block_key(tokens)``, the tokens themselves: keys are
compared exactly, so two prompts share a block only when every token of the prefix is equal (TensorRT-LLM V1's
``BlockKey`` equality; a digest alone, as vLLM had, can collide). The scope (LoRA task id, cache salt) picks the
root, so scopes never share a block.
"""

from __future__ import annotations

from .. import seams


class Node:
    __slots__ = ("tokens", "parent", "children", "by_first", "pages", "refs", "stamps", "child_pages", "priority",
                 "depth")

    def __init__(self, tokens: tuple, parent: "Node | None", num_groups: int, priority: int = 35):
        self.tokens = tokens
        self.parent = parent
        self.children: dict = {}
        self.by_first: dict = {}                # first token -> children starting with it (partial matching)
        self.pages = [-1] * num_groups          # per group: the page holding this block's KV, -1 = none
        self.refs = [0] * num_groups            # per group: requests holding that page
        self.stamps = [0] * num_groups          # per group: when the page was last released (LRU order)
        self.child_pages = [0] * num_groups     # per group: children that have a page there (leaf test)
        self.priority = priority
        self.depth = -1 if parent is None else parent.depth + 1

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def has_pages(self) -> bool:
        return any(p >= 0 for p in self.pages)

    def __repr__(self):
        return f"Node(depth={self.depth}, tokens={len(self.tokens)}, pages={self.pages}, refs={self.refs})"


class RadixTree:
    def __init__(self, num_groups: int):
        self.num_groups = num_groups
        self.roots: dict = {}

    def root(self, scope, create: bool = False) -> Node | None:
        node = self.roots.get(scope)
        if node is None and create:
            node = self.roots[scope] = Node((), None, self.num_groups)
        return node

    @staticmethod
    def child(parent: Node, tokens: tuple) -> Node | None:
        return parent.children.get(seams.block_key(tokens))

    def add_child(self, parent: Node, tokens: tuple, priority: int) -> Node:
        node = Node(tokens, parent, self.num_groups, priority)
        parent.children[seams.block_key(tokens)] = node
        if tokens:
            parent.by_first.setdefault(tokens[0], []).append(node)
        return node

    def remove(self, node: Node) -> None:
        """Take a node without children out of its parent (its pages are the caller's business)."""
        parent = node.parent
        key = seams.block_key(node.tokens)
        if parent.children.get(key) is node:
            del parent.children[key]
        siblings = parent.by_first.get(node.tokens[0]) if node.tokens else None
        if siblings is not None and node in siblings:
            siblings.remove(node)
            if not siblings:
                del parent.by_first[node.tokens[0]]
        node.parent = None

    def walk(self, root: Node | None, blocks: list[tuple]) -> list[Node]:
        """The nodes of the longest run of ``blocks`` found from ``root``, in order (full blocks only)."""
        out: list[Node] = []
        node = root
        if node is None:
            return out
        for tokens in blocks:
            node = node.children.get(seams.block_key(tokens))
            if node is None:
                break
            out.append(node)
        return out

    @staticmethod
    def partial_candidates(parent: Node, tokens: tuple):
        """Children of ``parent`` sharing a first token with ``tokens``, each with the length of the common prefix
        (most first); only those share anything, so the scan is bounded by them, not by the tree."""
        if not tokens:
            return []
        out = []
        for node in parent.by_first.get(tokens[0], ()):
            n, limit = 0, min(len(tokens), len(node.tokens))
            while n < limit and node.tokens[n] == tokens[n]:
                n += 1
            out.append((n, node))
        out.sort(key=lambda item: -item[0])
        return out
