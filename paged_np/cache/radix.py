"""A radix tree of cached token runs (SGLang's RadixAttention), beside the hash chain.

The hash chain (:mod:`.sequence`, :mod:`.page_pool`) finds a prompt's cached
prefix by hashing it one full page at a time and looking each hash up in a
dict. SGLang (Zheng et al., 2024, "SGLang: Efficient Execution of Structured
Language Model Programs") keeps the same knowledge as a *radix tree*: a trie
whose edges carry whole runs of tokens, so a long shared preamble is one edge,
and a node exists only where two cached sequences part ways::

    root
     └─ [You are a helpful assistant. Q:]             one edge, many pages
          ├─ [What is 2+2? A: 4]                       question 1
          └─ [Name a colour. A:]                       question 2
               ├─ [ red]                               two samples of question 2
               └─ [ blue]

Each :class:`TreeNode` (fields named as in the paper) holds

- ``key``: the token run on the edge from its parent (a list, so a leaf can grow);
- ``value``: the pages holding that run's K/V, ``len(key) // page_size`` of
  them, in order;
- ``children``: child nodes keyed by the first *page* of their key (its first
  ``page_size`` tokens; with ``page_size == 1`` simply the first token);
- ``lock_ref``: how many live sequences use this node, i.e. whose path from
  the root passes through it. A locked node is never evicted;
- ``last_access_time``: a logical clock, bumped on every match, insert and
  release that walks through the node. Leaf eviction is LRU on it;
- ``parent``.

The operations, one method each:

- :meth:`RadixCache.match_prefix`: walk down as far as the prompt agrees with
  the tree, in whole pages. When the match ends in the middle of an edge the
  edge is *split* there, so the match always ends at a node (which the caller
  then locks).
- :meth:`RadixCache.insert`: add a sequence's newly full pages below the node
  its path has reached. Runs already in the tree are not stored twice (the
  caller keeps its duplicate page private, as the hash chain does); a new
  sequence that diverges mid-edge splits that edge.
- :meth:`RadixCache.inc_lock_ref` / :meth:`RadixCache.dec_lock_ref` (also
  :meth:`lock` / :meth:`unlock`): a live sequence pins its whole path.
- :meth:`RadixCache.evict`: free pages from the least recently used unlocked
  *leaf*, from its end backwards.

Why a tree evicts leaves first: a node's K/V is only reachable through its
parent's. Evicting an inner node would strand its whole subtree (no prompt can
match past the hole, yet those pages would still occupy memory), so the only
pages worth keeping are prefix-closed: evict the deepest, least recently used
tokens and a parent becomes a leaf, and a candidate, only when all its
children are gone. The hash chain meets the same problem differently: it
frees a sequence's pages tail-first so that LRU order is *usually*
prefix-closed, but a popular prefix page and an orphaned suffix page are just
two entries in one list there.

Granularity: with ``page_size > 1`` a match is a whole number of pages (a
partly matching page is recomputed, as in SGLang's paged radix cache and in
vLLM); with ``page_size == 1`` it is token-granular.

Differences from SGLang: the tree never owns a page outright; the page pool
(:mod:`.page_pool`) keeps the reference counts and the free list, and the
tree is the pool's index of which pages hold which tokens (``CacheConfig
(prefix_cache="radix")``). Eviction trims one page at a time from a leaf's
end instead of dropping whole leaves, so an allocation frees exactly what it
needs, as the hash chain's per-page LRU does. A leaf that only its own
sequence uses grows in place as that sequence decodes, instead of sprouting
one child per page.
"""

from __future__ import annotations

import heapq
from itertools import count


class TreeNode:
    """One node of the radix tree: an edge's token run and the pages holding it."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time", "id")

    def __init__(self, parent, key: list, value: list, node_id: int, time: int):
        self.children: dict[tuple, TreeNode] = {}   # first page of child.key -> child
        self.parent: TreeNode | None = parent
        self.key: list = key                        # token ids on the edge from parent
        self.value: list = value                    # page ids, len(key) // page_size
        self.lock_ref = 0                           # live sequences whose path passes here
        self.last_access_time = time
        self.id = node_id                           # creation order: stable names for drawings

    def __repr__(self):
        return (f"TreeNode(id={self.id}, tokens={len(self.key)}, pages={self.value}, "
                f"lock_ref={self.lock_ref}, children={len(self.children)})")


class RadixCache:
    """The tree, plus the accounting the page pool needs.

    Parameters
    ----------
    page_size : int
        Tokens per page; every key is a whole number of pages.

    Example
    -------
    >>> tree = RadixCache(page_size=2)
    >>> node, new = tree.insert((1, 2, 3, 4), [7, 8])
    >>> tree.match_prefix([1, 2, 3, 4, 5])[0] == [7, 8]
    True
    >>> tree.insert((1, 2, 9, 9), [7, 5])[1] == [5]   # diverges after one page: splits the edge
    True
    >>> tree.num_nodes, tree.depth
    (3, 2)
    """

    def __init__(self, page_size: int):
        self.page_size = page_size
        self._ids = count()
        self._clock = count(1)
        self._roots: dict[bytes | None, TreeNode] = {}   # one tree per extra_key
        self._page_node: dict[int, TreeNode] = {}        # page id -> node holding it
        #: Pages in unlocked nodes: what eviction can free right now.
        self.evictable_pages = 0
        self.num_evictions = 0
        # Min-heap of (last_access_time, id, node) over unlocked leaves, lazily
        # cleaned: an entry whose node has changed since it was pushed is skipped.
        self._leaves: list[tuple] = []
        self._pushes = count()                           # heap tie-breaker after the id

    # ------------------------------------------------------------------ queries
    def root(self, extra_key: bytes | None = None) -> TreeNode:
        """The root of the tree for ``extra_key`` (prompts under different keys never share)."""
        r = self._roots.get(extra_key)
        if r is None:
            r = self._roots[extra_key] = TreeNode(None, [], [], next(self._ids), 0)
            r.lock_ref = 1                          # a root is never evicted
        return r

    def holds(self, page: int) -> bool:
        """Whether a node of the tree holds this page."""
        return page in self._page_node

    def node_of(self, page: int) -> TreeNode | None:
        return self._page_node.get(page)

    @property
    def num_pages(self) -> int:
        """Pages the tree holds (in use or idle)."""
        return len(self._page_node)

    def nodes(self):
        """Every non-root node, parents before children (for stats and drawings)."""
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            if node.parent is not None:
                yield node
            stack.extend(sorted(node.children.values(), key=lambda n: -n.id))

    @property
    def num_nodes(self) -> int:
        return sum(1 for _ in self.nodes())

    @property
    def depth(self) -> int:
        """Edges on the longest root-to-leaf path (0 for an empty tree)."""
        best = 0
        stack = [(r, 0) for r in self._roots.values()]
        while stack:
            node, d = stack.pop()
            best = max(best, d)
            stack.extend((c, d + 1) for c in node.children.values())
        return best

    @property
    def num_locked_nodes(self) -> int:
        return sum(1 for n in self.nodes() if n.lock_ref > 0)

    def path(self, node: TreeNode) -> list[TreeNode]:
        """Nodes from just below the root down to ``node``."""
        out = []
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def tokens_to(self, node: TreeNode) -> tuple:
        """The token run from the root to ``node`` (what a sequence ending there holds)."""
        return tuple(t for n in self.path(node) for t in n.key)

    # --------------------------------------------------------------- operations
    def match_prefix(self, token_ids, extra_key: bytes | None = None):
        """Longest cached prefix of ``token_ids`` in whole pages.

        Returns ``(pages, node)``: the page ids of the match, in order, and the
        node where it ends (the root when nothing matches). A match that ends
        mid-edge splits the edge so that ``node`` ends exactly there. Every
        node on the path counts as just accessed. Locks nothing.
        """
        ps = self.page_size
        node = self.root(extra_key)
        pages: list[int] = []
        i = 0
        now = next(self._clock)
        while len(token_ids) - i >= ps:
            child = node.children.get(tuple(token_ids[i:i + ps]))
            if child is None:
                break
            m = _common_pages(child.key, token_ids, i, ps)   # >= 1: the first page matched
            if m < len(child.value):
                child = self._split(child, m)
            child.last_access_time = now
            self._pushed_if_leaf(child)
            pages.extend(child.value)
            i += m * ps
            node = child
        return pages, node

    def prefix_length(self, token_ids, extra_key: bytes | None = None) -> int:
        """Tokens :meth:`match_prefix` would match, without splitting or touching anything.

        For schedulers that rank waiting requests by their cached prefix.
        """
        ps = self.page_size
        node = self._roots.get(extra_key)
        i = 0
        while node is not None and len(token_ids) - i >= ps:
            child = node.children.get(tuple(token_ids[i:i + ps]))
            if child is None:
                break
            m = _common_pages(child.key, token_ids, i, ps)
            i += m * ps
            node = child if m == len(child.value) else None
        return i

    def insert(self, key, value, node: TreeNode | None = None, extra_key: bytes | None = None):
        """Cache the token run ``key`` (held in pages ``value``) below ``node``.

        ``node`` is where ``key`` starts (the root of ``extra_key``'s tree when
        None); the caller holds a lock on it. Returns ``(last, added)``: the
        node where ``key`` ends and the pages of ``value`` the tree took. A page
        whose tokens the tree already holds is not taken (the caller keeps it
        private); an edge that agrees with ``key`` only partly is split.
        """
        ps = self.page_size
        key = list(key)
        value = list(value)
        node = self.root(extra_key) if node is None else node
        now = next(self._clock)
        added: list[int] = []
        i = 0
        while i < len(key):
            child = node.children.get(tuple(key[i:i + ps]))
            if child is None:
                rest_k, rest_v = key[i:], value[i // ps:]
                if i == 0 and node.parent is not None and not node.children and node.lock_ref == 1:
                    # The caller's own leaf (its lock is the only one): grow it in place.
                    node.key.extend(rest_k)
                    node.value.extend(rest_v)
                else:
                    child = TreeNode(node, rest_k, rest_v, next(self._ids), now)
                    child.lock_ref = 0
                    node.children[tuple(rest_k[:ps])] = child
                    node = child
                    # A fresh node is unlocked until the caller locks it: count its pages.
                    self.evictable_pages += len(rest_v)
                for p in rest_v:
                    self._page_node[p] = node
                node.last_access_time = now
                self._pushed_if_leaf(node)                 # evictable until someone locks it
                added.extend(rest_v)
                break
            m = _common_pages(child.key, key, i, ps)
            if m < len(child.value):
                child = self._split(child, m)
            child.last_access_time = now
            self._pushed_if_leaf(child)
            i += m * ps
            node = child
        return node, added

    def inc_lock_ref(self, node: TreeNode) -> None:
        """A live sequence now uses the path root..node: pin it."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self.evictable_pages -= len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """A live sequence no longer uses the path root..node; it counts as just accessed."""
        now = next(self._clock)
        while node.parent is not None:
            node.lock_ref -= 1
            node.last_access_time = now
            if node.lock_ref == 0:
                self.evictable_pages += len(node.value)
                self._pushed_if_leaf(node)
            node = node.parent

    lock = inc_lock_ref
    unlock = dec_lock_ref

    def touch(self, node: TreeNode) -> None:
        """Mark the path root..node as just used (it moves to the young end of LRU)."""
        now = next(self._clock)
        for n in self.path(node):
            n.last_access_time = now
            self._pushed_if_leaf(n)

    def evict(self, num_pages: int) -> list[int]:
        """Free up to ``num_pages`` pages, taking each from the end of the least
        recently used unlocked leaf; a leaf left empty is removed, and its
        parent may become the next candidate. Returns the freed page ids.
        """
        out: list[int] = []
        while len(out) < num_pages and self._leaves:
            t, _, _, node = heapq.heappop(self._leaves)
            if not self._is_evictable_leaf(node) or node.last_access_time != t:
                continue                                   # stale entry
            take = min(num_pages - len(out), len(node.value))
            ps = self.page_size
            for _ in range(take):
                p = node.value.pop()
                del self._page_node[p]
                out.append(p)
            del node.key[len(node.value) * ps:]
            self.evictable_pages -= take
            self.num_evictions += take
            if node.value:
                self._push(node)                           # the rest of it, same age
            else:
                parent = node.parent
                del parent.children[_first_page(node, ps, parent)]
                node.parent = None                         # detached: stale in the heap
                self._pushed_if_leaf(parent)
        return out

    def eviction_order(self) -> list[int]:
        """Evictable pages in the order :meth:`evict` would take them (O(n log n), for drawings).

        Replays eviction on counters instead of the tree: the LRU unlocked leaf
        gives its pages from the end, then its parent joins the candidates once
        its last child is gone.
        """
        left = {}                                          # node id -> children not yet evicted
        heap = []
        for n in self.nodes():
            if n.lock_ref == 0:
                left[n.id] = len(n.children)
                if not n.children:
                    heap.append((n.last_access_time, n.id, n))
        heapq.heapify(heap)
        out: list[int] = []
        while heap:
            _, _, n = heapq.heappop(heap)
            out.extend(reversed(n.value))
            parent = n.parent
            if parent.parent is not None and parent.lock_ref == 0:
                left[parent.id] -= 1
                if left[parent.id] == 0:
                    heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return out

    # ------------------------------------------------------------------ helpers
    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut ``child``'s edge after ``m`` pages; returns the new upper node.

        The lower part keeps the original node object, so a sequence whose path
        ends at ``child`` still ends at the same (now shorter) node.
        """
        ps = self.page_size
        parent = child.parent
        upper = TreeNode(parent, child.key[:m * ps], child.value[:m], next(self._ids),
                         child.last_access_time)
        upper.lock_ref = child.lock_ref                # the same sequences pass through both
        parent.children[tuple(upper.key[:ps])] = upper
        child.key = child.key[m * ps:]
        child.value = child.value[m:]
        child.parent = upper
        upper.children[tuple(child.key[:ps])] = child
        for p in upper.value:
            self._page_node[p] = upper
        return upper

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return node.parent is not None and not node.children and node.lock_ref == 0

    def _pushed_if_leaf(self, node: TreeNode) -> None:
        if self._is_evictable_leaf(node) and node.value:
            self._push(node)

    def _push(self, node: TreeNode) -> None:
        heapq.heappush(self._leaves, (node.last_access_time, node.id, next(self._pushes), node))
        if len(self._leaves) > 4 * len(self._page_node) + 64:    # drop stale entries
            self._leaves = [(n.last_access_time, n.id, next(self._pushes), n) for n in self.nodes()
                            if self._is_evictable_leaf(n) and n.value]
            heapq.heapify(self._leaves)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant of the tree (O(nodes))."""
        ps = self.page_size
        seen: dict[int, TreeNode] = {}
        evictable = 0
        for root in self._roots.values():
            assert root.parent is None and not root.key and not root.value, "root holds tokens"
        for node in self.nodes():
            assert node.value, f"node {node.id} holds no page"
            assert len(node.key) == len(node.value) * ps, (
                f"node {node.id}: {len(node.key)} tokens for {len(node.value)} pages")
            assert node.parent.children.get(tuple(node.key[:ps])) is node, (
                f"node {node.id} is not its parent's child under its first page")
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), (
                f"node {node.id}: lock_ref below its children's: a locked path has a hole")
            assert node.lock_ref >= 0, f"node {node.id}: negative lock_ref"
            for p in node.value:
                assert p not in seen, f"page {p} is in two nodes"
                seen[p] = node
                assert self._page_node.get(p) is node, f"page {p}: page map points elsewhere"
            if node.lock_ref == 0:
                evictable += len(node.value)
            if self._is_evictable_leaf(node):
                assert any(e[3] is node and e[0] == node.last_access_time
                           for e in self._leaves), f"evictable leaf {node.id} missing from heap"
        assert len(seen) == len(self._page_node), "page map holds a page no node holds"
        assert evictable == self.evictable_pages, (
            f"evictable_pages is {self.evictable_pages}, the nodes say {evictable}")


def _common_pages(key: tuple, tokens, start: int, ps: int) -> int:
    """Whole pages on which ``key`` agrees with ``tokens[start:]``."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == list(tokens[start:start + n]):      # the common case: the whole edge agrees
        return n // ps
    j = 0
    while j < n and key[j] == tokens[start + j]:
        j += 1
    return j // ps


def _first_page(node: TreeNode, ps: int, parent: TreeNode) -> tuple:
    """The key ``parent.children`` files ``node`` under (found even if ``node.key`` is empty)."""
    for k, c in parent.children.items():
        if c is node:
            return k
    raise AssertionError(f"node {node.id} is not a child of its parent")
