"""One node of the radix tree (:mod:`.radix`): an edge's token run and its pages.

Each :class:`TreeNode` (fields named as in the SGLang paper) holds

- ``key``: the token run on the edge from its parent (a list, so a leaf can grow);
- ``value``: the pages holding that run's K/V, ``len(key) // page_size`` of
  them, in order;
- ``children``: child nodes keyed by the first *page* of their key (its first
  ``page_size`` tokens; with ``page_size == 1`` simply the first token);
- ``lock_ref``: how many live sequences use this node, i.e. whose path from
  the root passes through it. A locked node is never evicted;
- ``last_access_time``, ``hit_count``, ``creation_time``: stamps from the
  tree's one logical clock (bumped on every match, insert and release that
  walks through the node), which the :class:`~paged_np.EvictionPolicy` reads:
  LRU evicts the unlocked leaf with the oldest ``last_access_time``;
- ``parent``, and ``id`` (creation order: stable names for drawings).
"""

from __future__ import annotations

import heapq

from .prefix_index import IndexNode


class TreeNode:
    """One node of the radix tree: an edge's token run and the pages holding it."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time",
                 "hit_count", "creation_time", "id")

    def __init__(self, parent, key: list, value: list, node_id: int, time: int):
        self.children: dict[tuple, TreeNode] = {}   # first page of child.key -> child
        self.parent: TreeNode | None = parent
        self.key: list = key                        # token ids on the edge from parent
        self.value: list = value                    # page ids, len(key) // page_size
        self.lock_ref = 0                           # live sequences whose path passes here
        self.last_access_time = time                # the policy's stamps (one clock)
        self.hit_count = 0
        self.creation_time = time
        self.id = node_id

    def common_pages(self, tokens, start: int, ps: int) -> int:
        """Whole pages on which this edge's ``key`` agrees with ``tokens[start:]``."""
        key = self.key
        n = min(len(key), len(tokens) - start)
        if key[:n] == list(tokens[start:start + n]):  # the common case: the whole edge agrees
            return n // ps
        j = 0
        while j < n and key[j] == tokens[start + j]:
            j += 1
        return j // ps

    def child_key(self, child: TreeNode) -> tuple:
        """The key ``self.children`` files ``child`` under (found even if its key is empty)."""
        for k, c in self.children.items():
            if c is child:
                return k
        raise AssertionError(f"node {child.id} is not a child of node {self.id}")

    def __repr__(self):
        return (f"TreeNode(id={self.id}, tokens={len(self.key)}, pages={self.value}, "
                f"lock_ref={self.lock_ref}, children={len(self.children)})")

    def record(self) -> IndexNode:
        """This node as :meth:`~paged_np.cache.prefix_index.PrefixIndex.walk` reports it."""
        below_root = self.parent is None or self.parent.parent is None
        return IndexNode(self.id, None if below_root else self.parent.id, tuple(self.key),
                         tuple(self.value), self.lock_ref)


def replay_eviction(nodes, priority) -> list[int]:
    """The pages eviction would take, in order, from ``nodes`` (a tree's, parents first),
    without touching the tree (for drawings: :meth:`RadixIndex.eviction_order`).

    Replays eviction on counters: the first-ranked unlocked leaf gives its pages
    from the end, then its parent joins the candidates once its last child is gone.
    """
    left = {}                                          # node id -> children not yet evicted
    heap = []
    for n in nodes:
        if n.lock_ref == 0:
            left[n.id] = len(n.children)
            if not n.children:
                heap.append((priority(n), n.id, n))
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, _, n = heapq.heappop(heap)
        out.extend(reversed(n.value))
        parent = n.parent
        if parent.parent is not None and parent.lock_ref == 0:
            left[parent.id] -= 1
            if left[parent.id] == 0:
                heapq.heappush(heap, (priority(parent), parent.id, parent))
    return out
