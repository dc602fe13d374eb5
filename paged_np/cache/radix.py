"""A radix tree of cached token runs (SGLang's RadixAttention), beside the hash chain.

The hash chain (:mod:`.hash_index`) finds a prompt's cached prefix by hashing
it one full page at a time and looking each hash up in a dict. SGLang (Zheng et
al., 2024, "SGLang: Efficient Execution of Structured Language Model Programs")
keeps the same knowledge as a *radix tree*: a trie whose edges carry whole runs
of tokens, so a long shared preamble is one edge, and a node exists only where
two cached sequences part ways::

    root
     └─ [You are a helpful assistant. Q:]             one edge, many pages
          ├─ [What is 2+2? A: 4]                       question 1
          └─ [Name a colour. A:]                       question 2
               ├─ [ red]                               two samples of question 2
               └─ [ blue]

A :class:`~paged_np.cache.radix_node.TreeNode` holds an edge's token run
(``key``), its pages (``value``), ``children``, ``lock_ref`` and stamps.

The operations, one method each (those of
:class:`~paged_np.cache.prefix_index.PrefixIndex`, which the hash chain answers too):

- :meth:`RadixIndex.match_prefix`: walk down as far as the prompt agrees with
  the tree, in whole pages. When the match ends in the middle of an edge the
  edge is *split* there, so the match always ends at a node (which the caller
  then locks).
- :meth:`RadixIndex.insert`: add a sequence's newly full pages below the node
  its path has reached. Runs already in the tree are not stored twice (the
  caller keeps its duplicate page private, as the hash chain does); a new
  sequence that diverges mid-edge splits that edge.
- :meth:`RadixIndex.lock` / :meth:`RadixIndex.unlock`: a live sequence pins
  its whole path (SGLang's ``inc_lock_ref`` / ``dec_lock_ref``).
- :meth:`RadixIndex.evict`: free pages from the unlocked *leaf* the eviction
  policy ranks first (LRU: least recently used), from its end backwards.

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

Differences from SGLang: the tree never owns a page; the page pool keeps the
reference counts and the free list, and asks the tree for a victim when nothing
is free. Eviction trims a leaf one page at a time from its end, so an allocation
frees exactly what it needs. A leaf that only its own sequence uses grows in
place as that sequence decodes, instead of sprouting one child per page.
"""

from __future__ import annotations

import heapq
from itertools import count

from .hash_index import chain_hash
from .prefix_index import PrefixIndex
from .radix_node import TreeNode, replay_eviction


class RadixIndex(PrefixIndex):
    """The tree, plus the accounting the page pool needs.

    A sequence's handle (what it keeps and locks) is the node its path reaches.

    Parameters
    ----------
    page_size : int
        Tokens per page; every key is a whole number of pages.
    policy : {"lru", "fifo", "lfu"}, an EvictionPolicy subclass or object
        Ranks the unlocked leaves; the smallest priority is evicted first.

    Example
    -------
    >>> tree = RadixIndex(page_size=2)
    >>> node, new = tree.insert((1, 2, 3, 4), [7, 8])
    >>> tree.match_prefix([1, 2, 3, 4, 5])[0] == [7, 8]
    True
    >>> tree.insert((1, 2, 9, 9), [7, 5])[1] == [5]   # diverges after one page: splits the edge
    True
    >>> tree.num_nodes, tree.depth
    (3, 2)
    """

    kind = "radix"
    no_sliding_window = ("pages the window releases would stay pinned under the live "
                         "sequence's locked path; use prefix_cache='hash'")

    def __init__(self, page_size: int, policy="lru"):
        super().__init__(page_size, policy)
        self._ids = count()
        self._clock = count(1)
        self._roots: dict[bytes | None, TreeNode] = {}   # one tree per extra_key
        self._page_node: dict[int, TreeNode] = {}        # page id -> node holding it
        self._num_evictable = 0                          # pages in unlocked nodes
        # Min-heap of (priority, id, push, node) over unlocked leaves, lazily
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
        return page in self._page_node

    def pages(self) -> list[int]:
        return sorted(self._page_node)

    def node_of(self, page: int) -> TreeNode | None:
        return self._page_node.get(page)

    @property
    def num_evictable(self) -> int:
        return self._num_evictable

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

    def stats(self) -> dict:
        return {"indexed_pages": len(self._page_node), "radix_nodes": self.num_nodes,
                "radix_depth": self.depth,
                "radix_locked_nodes": sum(1 for n in self.nodes() if n.lock_ref > 0)}

    # --------------------------------------------------------------- operations
    def match_prefix(self, token_ids, extra_key: bytes | None = None):
        """Longest cached prefix of ``token_ids`` in whole pages.

        Returns ``(pages, node)``: the page ids of the match, in order, and the
        node where it ends (the root when nothing matches). A match that ends
        mid-edge splits the edge so that ``node`` ends exactly there. Every
        node on the path counts as just accessed, and as hit. Locks nothing.
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
            m = child.common_pages(token_ids, i, ps)   # >= 1: the first page matched
            if m < len(child.value):
                child = self._split(child, m)
            child.last_access_time = now
            child.hit_count += 1
            self._pushed_if_leaf(child)
            pages.extend(child.value)
            i += m * ps
            node = child
        return pages, node

    def prefix_length(self, token_ids, extra_key: bytes | None = None, memo=None) -> int:
        """Tokens :meth:`match_prefix` would match, without splitting or touching anything.

        For schedulers that rank waiting requests by their cached prefix. The
        tree keeps nothing in ``memo``: walking it is already cheap.
        """
        ps = self.page_size
        node = self._roots.get(extra_key)
        i = 0
        while node is not None and len(token_ids) - i >= ps:
            child = node.children.get(tuple(token_ids[i:i + ps]))
            if child is None:
                break
            m = child.common_pages(token_ids, i, ps)
            i += m * ps
            node = child if m == len(child.value) else None
        return i

    def insert(self, key, value, node: TreeNode | None = None, extra_key: bytes | None = None,
               seq_id=None):
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
                    node.children[tuple(rest_k[:ps])] = child
                    node = child
                    # A fresh node is unlocked until the caller locks it: count its pages.
                    self._num_evictable += len(rest_v)
                for p in rest_v:
                    self._page_node[p] = node
                    self._emit("insert", p, seq_id)
                node.last_access_time = now
                self._pushed_if_leaf(node)                 # evictable until someone locks it
                added.extend(rest_v)
                break
            m = child.common_pages(key, i, ps)
            if m < len(child.value):
                child = self._split(child, m)
            child.last_access_time = now
            self._pushed_if_leaf(child)
            i += m * ps
            node = child
        return node, added

    def lock(self, node: TreeNode) -> None:
        """A live sequence now uses the path root..node: pin it."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self._num_evictable -= len(node.value)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """A live sequence no longer uses the path root..node; it counts as just accessed."""
        now = next(self._clock)
        while node.parent is not None:
            node.lock_ref -= 1
            node.last_access_time = now
            if node.lock_ref == 0:
                self._num_evictable += len(node.value)
                self._pushed_if_leaf(node)
            node = node.parent

    def mark_used(self, page: int) -> None:
        """The path root..(the node holding ``page``) counts as just used."""
        now = next(self._clock)
        for n in self.path(self._page_node[page]):
            n.last_access_time = now
            self._pushed_if_leaf(n)

    def page_idle(self, page: int) -> None:
        return None   # a tree page is evictable when its node is unlocked, not by ref count

    def page_reused(self, page: int) -> None:
        return None

    def evict(self, num_pages: int, seq_id=None) -> list[int]:
        """Free up to ``num_pages`` pages, taking each from the end of the unlocked
        leaf the policy ranks first; a leaf left empty is removed, and its
        parent may become the next candidate. Returns the freed page ids.
        """
        out: list[int] = []
        while len(out) < num_pages and self._leaves:
            key, _, _, node = heapq.heappop(self._leaves)
            if not self._is_evictable_leaf(node) or self.policy.priority(node) != key:
                continue                                   # stale entry
            take = min(num_pages - len(out), len(node.value))
            ps = self.page_size
            for _ in range(take):
                self._emit("evict", node.value[-1], seq_id)   # still held: may be saved
                p = node.value.pop()
                del self._page_node[p]
                out.append(p)
            del node.key[len(node.value) * ps:]
            self._num_evictable -= take
            if node.value:
                self._push(node)                           # the rest of it, same priority
            else:
                parent = node.parent
                del parent.children[parent.child_key(node)]
                node.parent = None                         # detached: stale in the heap
                self._pushed_if_leaf(parent)
        return out

    def eviction_order(self) -> list[int]:
        """Evictable pages in the order :meth:`evict` would take them (O(n log n), for
        drawings): :func:`~.radix_node.replay_eviction` over the nodes."""
        return replay_eviction(self.nodes(), self.policy.priority)

    def page_key(self, page: int) -> tuple[bytes, tuple] | None:
        """:meth:`PrefixIndex.page_key`: the hash chain of the tokens root..``page``."""
        node = self._page_node.get(page)
        if node is None:
            return None
        ps, top = self.page_size, self.path(node)[0].parent
        key = next(k for k, r in self._roots.items() if r is top)   # the tree's extra_key
        tokens = self.tokens_to(node)
        end = len(tokens) - len(node.key) + (node.value.index(page) + 1) * ps
        return chain_hash(tokens[:end], key, ps), tuple(tokens[end - ps:end])

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
        upper.hit_count, upper.creation_time = child.hit_count, child.creation_time
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
        prio = self.policy.priority
        heapq.heappush(self._leaves, (prio(node), node.id, next(self._pushes), node))
        if len(self._leaves) > 4 * len(self._page_node) + 64:    # drop stale entries
            self._leaves = [(prio(n), n.id, next(self._pushes), n) for n in self.nodes()
                            if self._is_evictable_leaf(n) and n.value]
            heapq.heapify(self._leaves)

    # --------------------------------------------------------------- invariants
    def check_invariants(self, pool=None) -> None:
        """Raise AssertionError naming the first broken invariant of the tree (O(nodes)).

        With ``pool``: no unlocked node holds a page in use (eviction could take it).
        """
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
                if pool is not None:
                    assert all(pool.ref_count(p) == 0 for p in node.value), (
                        f"unlocked node {node.id} holds a page in use: eviction could take it")
            if self._is_evictable_leaf(node):
                key = self.policy.priority(node)
                assert any(e[3] is node and e[0] == key for e in self._leaves), (
                    f"evictable leaf {node.id} missing from heap")
        assert len(seen) == len(self._page_node), "page map holds a page no node holds"
        assert evictable == self._num_evictable, (
            f"num_evictable is {self._num_evictable}, the nodes say {evictable}")

    def check_sequences(self, seqs) -> None:
        """Every sequence's path spells its full pages, holds its tree pages, and is locked."""
        ps = self.page_size
        locks: dict[int, int] = {}
        for s in seqs:
            node = s.prefix_handle
            path = self.path(node)
            top = path[0].parent if path else node
            assert top is self.root(s.extra_key), f"sequence {s.seq_id!r}: its node left the tree"
            assert list(self.tokens_to(node)) == s.token_ids[:s.num_indexed_pages * ps], (
                f"sequence {s.seq_id!r}: its tree path spells other tokens")
            path_pages = [p for n in path for p in n.value]
            for i, p in enumerate(s.block_table):
                if p >= 0 and self.holds(p):
                    assert i < len(path_pages) and path_pages[i] == p, (
                        f"sequence {s.seq_id!r}: holds tree page {p} off its own path")
            for n in path:
                locks[n.id] = locks.get(n.id, 0) + 1
        for n in self.nodes():
            assert n.lock_ref == locks.get(n.id, 0), (
                f"node {n.id}: lock_ref {n.lock_ref}, but {locks.get(n.id, 0)} live "
                "sequences pass through it")

    def walk(self) -> list:
        """:meth:`PrefixIndex.walk`: every node below a root, parents before children."""
        return [n.record() for n in self.nodes()]
