"""The reuse cache of one manager: the tree, the references requests hold on its pages, eviction into the pools.

A page is either private (one request's, never in the tree) or a tree page (found through ``page_node``),
held by ``refs`` requests. A tree page nobody holds is *reusable*: out of its pool's free list, counted in
``pool.num_reusable`` and evicted (``evict``) when an allocation needs it, in the order of its group's eviction
policy (``kvcm.eviction``; the version gives the cache its factory). Every page leaves for its pool through the
manager policy's ``release_block`` (``kvcm.policy``, given at construction). The per-version choices (what a
match may take, when blocks are stored) are the version's reuse rules (``kvcm.reuse.version_rules``); this module
only keeps the books.
"""

from __future__ import annotations

import functools

from ..events.emitter import NO_EVENTS
from ..policy import Decisions, resolve, rule, setting
from .stats import BlockCounts, ReuseCounters
from .transfers import Loads
from .tree import Node, RadixTree, deepest_first


class ReuseCache:
    events = NO_EVENTS        # the manager's event emitter (kvcm.events), set when its events are on

    def __init__(self, pools, groups, leaf_only: list[bool], *, order, policy=None):
        """``order(group, pool, cached, leaf_only, policy)``: the eviction order of one group's cached pages (an
        ``kvcm.eviction.EvictionPolicy`` over the tree's nodes; ``cached`` is the group's page -> node map).
        ``policy``: the manager's decisions (None: the active policy), for the cache's life."""
        self.policy = resolve(policy)
        self.pools = pools
        self.groups = groups
        self.tree = RadixTree(len(pools), self.policy)
        self.page_node: list[dict[int, Node]] = [{} for _ in pools]
        self.leaf_only = list(leaf_only)       # per group: only leaves are evicted (a middle page takes its subtree)
        self.orders = [order(g, pool, self.page_node[g], leaf, self.policy)
                       for g, (pool, leaf) in enumerate(zip(pools, leaf_only))]
        self.referenced = [0] * len(pools)     # tree pages some request holds
        self.totals = ReuseCounters()
        self.loads = Loads()                   # copies from the host tier in flight (async_onboard)
        for g, pool in enumerate(pools):
            pool.evict = functools.partial(self.evict, g)

    # ---- references ---------------------------------------------------------------------------------------
    def claim(self, node: Node, g: int) -> int:
        """A request takes the node's page in group g; returns the page."""
        if node.refs[g] == 0:
            self.referenced[g] += 1
            self.pools[g].num_reusable -= 1
            order = self.orders[g]
            if not order.lazy:
                order.claim(node)
        node.refs[g] += 1
        return node.pages[g]

    def unclaim(self, node: Node, g: int) -> None:
        """Undo a ``claim`` made for a moment (a partial copy's source): its place in the eviction order is kept."""
        node.refs[g] -= 1
        if node.refs[g] == 0:
            self.referenced[g] -= 1
            self.pools[g].num_reusable += 1
            self.orders[g].restore(node)

    def drop(self, node: Node, g: int) -> None:
        """A request lets go of the node's page in group g; a page nobody holds is refused (a table that lists
        it twice, vLLM #42571), before any count moves."""
        if node.refs[g] <= 0:
            raise RuntimeError(f"block {node.pages[g]} released twice")
        node.refs[g] -= 1
        left = node.refs[g]
        self.pools[g].num_reusable += self.policy.reusable_gain(left)
        if left == 0:
            self.referenced[g] -= 1
            self.orders[g].release(node, node.priority)

    def is_tree_page(self, g: int, page: int) -> bool:
        node = self.page_node[g].get(page)
        return node is not None and node.pages[g] == page

    def release(self, g: int, pages, priorities=None) -> None:
        """A request gives back these pages of group g: tree pages lose a reference, private ones go free.
        Last block first, so that the deepest block of a prefix is the least recently released (evicted first).
        ``priorities`` (per page, the priority it was taken with) matter only to V1's queued pools."""
        pool, owners = self.pools[g], self.page_node[g]
        for page in reversed(pages):
            if page < 0:
                continue
            node = owners.get(page)
            if node is not None and node.pages[g] == page:
                self.drop(node, g)
            else:
                self.policy.release_block(pool, page)

    def release_gain(self, g: int, pages) -> int:
        """How many of these pages an allocation could use once the request gives them back."""
        owners = self.page_node[g]
        gain = 0
        for page in pages:
            node = owners.get(page)
            if page >= 0 and (node is None or node.pages[g] != page or node.refs[g] == 1):
                gain += 1
        return gain

    # ---- the tree's pages -----------------------------------------------------------------------------------
    def _attach(self, node: Node, g: int, page: int) -> None:
        """The node's block in group g lives in GPU page ``page``, held: the books a held tree page is in."""
        node.pages[g] = page
        self.page_node[g][page] = node
        self.referenced[g] += 1
        if node.parent is not None:
            node.parent.child_pages[g] += 1

    def set_page(self, node: Node, g: int, page: int) -> None:
        """A request's private page becomes the node's (held by that request: one reference)."""
        self._attach(node, g, page)
        node.refs[g] = 1
        self.events.stored(self, node, g)

    def onboarded_to(self, node: Node, g: int, page: int) -> int:
        """A block copied back from a host tier takes this GPU page (its reference is the claiming request's,
        counted when the match claimed it on the host): both tiers end an onboard here, so the books and the
        moved event (level 1 -> 0) cannot differ between V1 and V2."""
        self._attach(node, g, page)
        self.onboarded += 1
        self.events.moved(self, node, g, 1, 0)
        return page

    def unset_page(self, node: Node, g: int, *, free: bool, queued: bool = True) -> int:
        """Take the node's page in group g out of the tree; with ``free`` it goes back to the pool (an eviction),
        otherwise it stays with the request that holds it (a partial block taken over in place). An unheld page
        leaves its eviction order first, unless ``queued`` is False (the order chose it: it is out already)."""
        self.events.removed(self, node, g)
        page = node.pages[g]
        if node.refs[g] == 0 and queued:
            order = self.orders[g]
            if not order.lazy:
                order.remove(node)
        del self.page_node[g][page]
        node.pages[g] = -1
        if node.refs[g] == 0:
            self.pools[g].num_reusable -= 1
        else:
            self.referenced[g] -= 1
        node.refs[g] = 0
        if free:
            self.policy.release_block(self.pools[g], page)
        self._unlink_from_parent(node, g)
        self._prune(node)
        return page

    def _unlink_from_parent(self, node, g: int) -> None:
        """Node ``node`` gave up its page of group g: its parent has one child page fewer, and a cached parent
        left with none and held by nobody becomes a leaf the eviction order may take."""
        parent = node.parent
        if parent is not None:
            parent.child_pages[g] -= 1
            if parent.parent is not None and parent.child_pages[g] == 0 and parent.pages[g] >= 0 \
                    and parent.refs[g] == 0:
                self.orders[g].restore(parent)

    def _prune(self, node: Node) -> None:
        """Nodes with no page in any group and no children are unreachable for every group: drop them."""
        while node.parent is not None and not node.children and not node.has_pages():
            parent = node.parent
            self.tree.remove(node)
            node = parent

    def evict(self, g: int, n: int) -> None:
        """Put at least ``n`` cached pages of group g back into its free list (a pool's allocation asks), in the
        group's eviction order. A victim with descendants (reached only when no leaf can go: a V1-style request that
        did not reuse a prefix holds its own copy of a block below it, so the prefix's page is unheld yet never a
        leaf) goes with them, as TensorRT-LLM's ``getFreeBlock`` frees a block and all its descendants: every page
        counted reusable can be had, so ``num_available`` never promises too much."""
        pool, order = self.pools[g], self.orders[g]
        target = pool.num_free + n
        while pool.num_free < target:
            victim = order.victim()
            if victim is None:
                raise RuntimeError(f"layer group {g}: no cached block can be evicted")
            if self.leaf_only[g] and victim.child_pages[g]:
                self._detach_descendants(victim, g)
            self.unset_page(victim, g, free=True, queued=False)

    def _detach_descendants(self, node: Node, g: int) -> None:
        """Take every descendant's page in group g out of the tree, deepest first: an unheld one goes free, a
        held one stays with its request as a private page (TensorRT-LLM detachDescendantsFromLookupTree)."""
        with self.events.silenced(not self.policy.removed_event_for_descendants):
            for child in deepest_first(node):
                if child.pages[g] >= 0:
                    self.unset_page(child, g, free=child.refs[g] == 0)

    def reset(self) -> None:
        """Drop every cached page (the caller checked that no request holds any)."""
        for g in range(len(self.pools)):
            self.orders[g].clear()
            for page, node in list(self.page_node[g].items()):
                self.events.removed(self, node, g)
                node.pages[g] = -1
                self.policy.release_block(self.pools[g], page)
            self.page_node[g].clear()
            self.pools[g].num_reusable = 0
            self.referenced[g] = 0
        self.tree = RadixTree(len(self.pools), self.policy)

    # ---- counts ---------------------------------------------------------------------------------------------
    def counts(self, g: int) -> BlockCounts:
        """Free, reusable and in use, each counted on its own: in use is private pages plus held tree pages."""
        pool = self.pools[g]
        private = pool.num_used - len(self.page_node[g])
        return BlockCounts(pool.num_free, pool.num_reusable, private + self.referenced[g], pool.num_blocks)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class ReuseCacheDecisions(Decisions):
    SUBSYSTEM = "block reuse: references and eviction"

    @rule("how many blocks a dropped reference adds to the reusable count: one when the last reference goes, none "
          "while another request holds the block (SGLang #35270 counted a shared block once per holder)")
    def reusable_gain(refs_left: int) -> int:
        return 1 if refs_left == 0 else 0

    @rule("whether a cached page at the head of the eviction order may be evicted: only when no request holds it "
          "(TensorRT-LLM #17926: blocks were detached under a live request)")
    def may_evict(refs: int) -> bool:
        return refs == 0

    evict_with_descendants = setting(
        True, "whether an allocation that finds no unheld leaf to evict (in a group that evicts leaves first) "
        "evicts an unheld block with descendants, taking its descendants' pages in that group out of the tree, as "
        "TensorRT-LLM's getFreeBlock does (kvCacheManager.cpp freeBlockAndAllDescendants / "
        "detachDescendantsFromLookupTree). Leaves only, a pool counted a cached block it could not evict as "
        "available: V1 with a window group and reuse raised RuntimeError from the block pool with another group's "
        "page already taken (issue 39). Both the eviction heap (V2) and V1's queued pool ask it")

    @rule("return one page to its pool; a page that is already free is refused, never listed twice in the free "
          "list (vLLM #42571: free_blocks([b, b]) grew the free count by two)")
    def release_block(pool, block: int) -> None:
        if not pool.is_used(block):
            raise RuntimeError(f"block {block} released twice")
        pool.push_free(block)
