"""What each version matches and stores (docs/semantics.md 11): TensorRT-LLM V1's ``WindowBlockManager`` and
V2's ``_KVCache`` with its wrapper differ in the partial block, in what a match needs and in when blocks become
reusable. The cache (``kvcm.reuse.cache``) keeps the books; these rules, one class a version, decide (the decisions a
historic bug lived in are ``kvcm.policy``'s).
"""

from __future__ import annotations

from bisect import bisect_left

from dataclasses import dataclass, field

from .tree import Node
from ..policy import Decisions, rule, setting

V2_PARTIAL_CHILD_LIMIT = 32
"""V2 skips the partial match under a node with this many children (TensorRT-LLM TRTLLM-7784)."""


@dataclass
class Match:
    """A request's hit: the whole blocks it reuses and at most one partly matched block after them."""

    nodes: list[Node] = field(default_factory=list)
    partial: Node | None = None
    partial_len: int = 0
    in_place: bool = False     # V1: an unreferenced leaf taken over instead of copied
    group_nodes: list = field(default_factory=list)   # per group: the nodes it claims (``nodes`` once reconciled)

    def of_group(self, g: int) -> list[Node]:
        return self.group_nodes[g] if self.group_nodes else self.nodes

    def length(self, tpb: int) -> int:
        return len(self.nodes) * tpb + self.partial_len


def chop(tokens, upto: int, tpb: int, partial: bool) -> list[tuple]:
    """``tokens[:upto]`` as blocks of ``tpb`` (and the shorter rest, with ``partial``)."""
    out = [tuple(tokens[i:i + tpb]) for i in range(0, upto - upto % tpb, tpb)]
    if partial and upto % tpb:
        out.append(tuple(tokens[upto - upto % tpb:upto]))
    return out


def _absent(node: Node, g: int) -> bool:
    """Whether a hit cannot use the node's block in group g: no page on the GPU, and none on the host that is not
    already being loaded by a request (a load in flight makes the block its loader's until it lands)."""
    return node.pages[g] < 0 and (node.host[g] < 0 or node.refs[g] > 0)


def _leading(nodes: list[Node], g: int, n: int) -> int:
    """How many leading nodes have their block in group g, on the GPU or offloaded to the host tier."""
    for i in range(n):
        if _absent(nodes[i], g):
            return i
    return n


class V1ReuseRules:
    """TensorRT-LLM V1: every group (window) keeps every block, so a match needs each block's page in every
    group; the groups' lengths are combined by the manager policy's ``window_reuse_length`` (the minimum, PR
    #10875). A partial
    match takes an unreferenced leaf in place, otherwise copies it (when ``copy_on_partial_reuse``)."""

    partial_child_limit = None
    rebase = False

    @staticmethod
    def leaf_only(groups) -> list[bool]:
        return [True] * len(groups)

    def group_length(self, nodes: list[Node], group, n: int, tpb: int) -> int:
        """Group ``group``'s own hit among the first ``n`` nodes: the leading blocks it holds."""
        return _leading(nodes, group.index, n)

    @staticmethod
    def skipped(group, length: int) -> range:
        """The block indices a match leaves alone in ``group`` (none: V1 keeps every block)."""
        return range(0)

    @staticmethod
    def retain_claimed(nodes: list[Node], state, tpb: int, decisions) -> None:
        """A matched block takes the request's retention for its index (``claimBlock(block, priority,
        duration)``): a range's priority where one holds its first token (else it keeps its own), and the range's
        duration, or none."""
        if not decisions.claim_sets_retention:
            return
        for i, node in enumerate(nodes):
            p, d = state.context_retention[i] if i < len(state.context_retention) else (None, None)
            if p is not None:
                node.priority = p
            node.duration_ms = d

    @staticmethod
    def partial_mode(node: Node, copy_on_partial_reuse: bool) -> str | None:
        """'in_place', 'copy' or None (not eligible)."""
        if not any(node.refs) and node.is_leaf:
            return "in_place"
        return "copy" if copy_on_partial_reuse else None

    @staticmethod
    def store_groups(groups, when: str) -> list[int]:
        """Context end and decode store full-attention groups only (TensorRT-LLM: "SWA cannot store new blocks
        on the fly"); release stores every group (kvcm's V1 keeps every block, so each stays valid)."""
        if when == "release":
            return [g.index for g in groups]
        return [g.index for g in groups if g.is_full]


class V2ReuseRules:
    """TensorRT-LLM V2: a match keeps the blocks for which every full group has a page and, in each sliding
    group, the pages of the window at the final length (to a fixed point: a shorter match moves the window).
    The partial block is always copied. The wrapper commits prompt tokens only; a committed block that is
    already in the tree is swapped for the tree's page (rebased)."""

    partial_child_limit = V2_PARTIAL_CHILD_LIMIT
    rebase = True

    @staticmethod
    def leaf_only(groups) -> list[bool]:
        """A full group's page is evicted only as a leaf (descendants would be unreachable); a sliding group's
        page may go from the middle (TensorRT-LLM drops just that page)."""
        return [g.is_full for g in groups]

    @staticmethod
    def skipped(group, length: int) -> range:
        """The block indices a match leaves alone in ``group``, as one range (a sliding group's blocks before its
        window)."""
        return range(*group.stale_range(length))

    def _group_length(self, nodes: list[Node], group, n: int, tpb: int) -> int:
        g = group.index
        if group.is_full:
            return _leading(nodes, g, n)
        m = n
        while True:
            skip = self.skipped(group, m * tpb)
            missing = next((i for i in range(m) if i not in skip and _absent(nodes[i], g)), None)
            if missing is None:
                return m
            m = missing

    group_length = _group_length

    @staticmethod
    def retain_claimed(nodes: list[Node], state, tpb: int, decisions) -> None:
        """V2 sets priorities by callback when blocks are stored, and has no durations: a match changes none."""

    @staticmethod
    def partial_mode(node: Node, copy_on_partial_reuse: bool) -> str | None:
        return "copy"

    @staticmethod
    def store_groups(groups, when: str) -> list[int]:
        return [g.index for g in groups]


def reconcile(rules, nodes: list[Node], groups, tpb: int, decisions) -> tuple[int, list[int]]:
    """The hit every group can serve, in blocks, and each group's own hit: the groups' lengths combined (the
    policy's ``window_reuse_length``), then again at the shorter length until no group shortens it (a shorter hit
    moves a sliding group's window back over other blocks; V1 keeps every block, so one pass is its fixed point)."""
    own = [rules.group_length(nodes, g, len(nodes), tpb) for g in groups]
    n = min(decisions.window_reuse_length(own), len(nodes))
    while decisions.hit_length_fixed_point:
        new = decisions.window_reuse_length([rules.group_length(nodes, g, n, tpb) for g in groups])
        if new >= n:
            break
        n = new
    return n, own


def find_match(cache, root: Node | None, lookup: list, tpb: int, groups, policy, *, partial: bool,
               copy_on_partial_reuse: bool) -> Match:
    """The hit of ``lookup`` (the tokens looked up, last token already left out): changes nothing. Each group
    claims the reconciled hit's nodes (its own longer hit cut to it, the policy's ``cut_to_reconciled_hit``)."""
    blocks = chop(lookup, len(lookup), tpb, partial=True)
    full = [b for b in blocks if len(b) == tpb]
    walked = cache.tree.walk(root, full)
    n, own = reconcile(policy, walked, groups, tpb, cache.policy)
    cut = cache.policy.cut_to_reconciled_hit(tuple(g.is_full for g in groups))
    match = Match(walked[:n], group_nodes=[walked[:n if c else max(n, k)] for c, k in zip(cut, own)])
    if not partial or n < len(walked) or root is None or n >= len(blocks):
        return match
    parent = walked[n - 1] if n else root
    limit = policy.partial_child_limit
    if limit is not None and len(parent.children) >= limit:
        return match
    rest = blocks[n]
    for common, node in cache.tree.partial_candidates(parent, rest):
        if common == 0 or any(node.pages[g.index] < 0 for g in groups):   # a partial block is reused from the GPU only
            continue
        mode = policy.partial_mode(node, copy_on_partial_reuse)
        if mode is not None:
            match.partial, match.partial_len, match.in_place = node, common, mode == "in_place"
            break
    return match


def store(cache, state, table: list[list[int]], upto: int, group_ids: list[int], *, partial: bool, rebase: bool,
          tpb: int) -> None:
    """File the request's blocks of ``tokens[:upto]`` under its scope: a block not in the tree gets the
    request's page; one already there keeps the tree's (V1, and V2 for a partial block: the request's duplicate
    stays private and goes back to the pool at release; V2 for a full block: the request takes the tree's page and
    gives its own back)."""
    tree = cache.tree
    parent = tree.root(state.scope, create=True)
    known = _known_path(state.path, parent, upto // tpb, cache.policy.recorded_path_checked)
    blocks = [node.tokens for node in known] + chop(state.tokens[len(known) * tpb:], upto - len(known) * tpb, tpb,
                                                     partial)
    node = parent
    path = []
    for i, tokens in enumerate(blocks):
        node = known[i] if i < len(known) else tree.child(parent, tokens)
        if node is None:
            if rebase and len(tokens) < tpb and _covered_by_sibling(parent, tokens):
                break          # V2's UselessBlockError (V1 files the partial block beside the longer one)
            priority, duration = state.block_retention(i, tpb)
            node = tree.add_child(parent, tokens, priority, duration)
            if rebase and len(tokens) == tpb:
                _drop_covered_partials(cache, parent, tokens)
        for g in group_ids:
            page = table[g][i]
            if page < 0 or node.pages[g] == page or cache.is_tree_page(g, page):
                continue
            if node.pages[g] < 0:
                cache.set_page(node, g, page)
            elif rebase and len(tokens) == tpb:
                # only a full block is rebased (TensorRT-LLM ``tree_block.is_full and allow_seq_rebasing and
                # is_full``): a partial page is still written by its request's next tokens, so sharing it would
                # let two requests write one page
                table[g][i] = cache.claim(node, g)
                cache.policy.release_block(cache.pools[g], page)
        parent = node
        if len(tokens) == tpb:
            path.append(node)
    state.path = path
    if node is not None and node.parent is not None:
        cache._prune(node)


def _known_path(path: list[Node], root: Node, n: int, checked: bool = True) -> list[Node]:
    """The leading nodes of a request's last match or store (at most ``n``) still filed where they were: each
    one's parent the one before it. Its tokens are the request's, so ``store`` skips looking those blocks up
    again (a few-shot request's shared prefix is most of its blocks, stored at context end and at release). A
    node leaves the tree only once it has no children, so the first one moved ends the run; an eviction can take
    a prefix out from under a live request (its own copy of a block below stays its private page), which is why
    each link is checked (the policy's ``recorded_path_checked``)."""
    if not checked:
        return path[:n]
    parent = root
    for i, node in enumerate(path[:n]):
        if node.parent is not parent:
            return path[:i]
        parent = node
    return path[:n]


def _covered_by_sibling(parent: Node, tokens: tuple) -> bool:
    """A sibling longer than ``tokens`` starts with them (of the siblings that start with them, one equal to them
    sorts first and every longer one after it)."""
    siblings = parent.by_first.get(tokens[0])
    if not siblings:
        return False
    lo, hi = siblings.span(tokens)
    return hi > lo and len(siblings.keys[hi - 1]) > len(tokens)


def _drop_covered_partials(cache, parent: Node, tokens: tuple) -> None:
    """A full block makes a shorter partial sibling with its prefix useless: evict it if nobody holds it."""
    siblings = parent.by_first.get(tokens[0])
    covered = []
    shorter = sorted(n for n in siblings.lengths if n < len(tokens)) if siblings else ()
    for n in shorter:     # each shorter prefix that some sibling's length allows, looked up by bisection
        prefix = tokens[:n]
        i = bisect_left(siblings.keys, prefix)
        while i < len(siblings.keys) and siblings.keys[i] == prefix:
            covered.append(siblings.nodes[i])
            i += 1
    for s in sorted(covered, key=lambda node: node.serial):   # oldest first, as they were filed
        if not any(s.refs) and s.is_leaf:
            for g, page in enumerate(s.pages):
                if page >= 0:
                    cache.unset_page(s, g, free=True)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class MatchDecisions(Decisions):
    SUBSYSTEM = "block reuse: matching and retention"

    @rule("how many of a request's tokens are looked up in the cache: all but the last, whose logits must come out "
          "of a forward (nano-vllm #144 looked up all of them: a full hit left nothing to compute)")
    def lookup_length(num_tokens: int) -> int:
        return max(0, num_tokens - 1)

    @rule("the admission credit for a request's cached prefix: with only_allocated, matched blocks some request "
          "holds; cached blocks nobody holds are already in the free count (TensorRT-LLM PR #11490 "
          "countReusableBlocks(onlyAllocated))")
    def reusable_credit(matched_refs: list, only_allocated: bool) -> int:
        if not only_allocated:
            return len(matched_refs)
        return sum(1 for refs in matched_refs if refs > 0)

    @rule("the reused length when groups (windows) reuse different lengths: the shortest, which every group has "
          "(TensorRT-LLM PR #10875 / PR #2983 took a per-window or the longest one)")
    def window_reuse_length(lengths: list) -> int:
        return min(lengths)

    hit_length_fixed_point = setting(
        True, "whether a hit's length, once one group shortened it, is checked again over every group until none "
        "shortens it (vLLM HybridKVCacheCoordinator.find_longest_cache_hit's fixed-point loop; PR #45614 and issue "
        "#43559: the common hit and a group's blocks disagreed): in one pass a V2 sliding group's window, moved back "
        "by a shorter full-attention hit, covered blocks that group does not hold, and the request took unwritten "
        "pages for tokens counted as cached")

    @rule("which groups' hits are cut to the reconciled hit length, given whether each group is full attention: "
          "every group (vLLM PR #52828: only the first full-attention group was truncated, a draft model's group "
          "kept its longer hit, its block table no longer matched the hit length and cache_hit_length went to 0)")
    def cut_to_reconciled_hit(group_is_full: tuple) -> tuple:
        return tuple(True for _ in group_is_full)

    recorded_path_checked = setting(
        True, "whether a commit that starts from the blocks a request last matched or stored checks that each is "
        "still filed under the one before it (TensorRT-LLM PR #18095 / #18610, issue #17926: an eviction detached a "
        "live request's tree block and its next commit built on the detached prefix: a segfault upstream, cached "
        "pages no lookup can reach here)")

    @rule("whether a manager may reuse a partly matched block: only when asked and when no group stores compressed "
          "entries (DeepSeek-V4's _supports_partial_reuse = False: a mid-block prefix hands over rows of tokens the "
          "request does not own)")
    def partial_reuse_allowed(enable_partial_reuse: bool, compress_ratios: tuple) -> bool:
        return enable_partial_reuse and all(r == 1 for r in compress_ratios)

    claim_sets_retention = setting(
        True, "whether a matched block takes the priority and duration of the request that reuses it "
        "(claimBlock(block, priority, duration) in loadOrAllocateBlocks; KVCacheManagerEventStreamPriority sees 50 "
        "-> 10); without it a request could not lower or raise a shared prefix's retention")
