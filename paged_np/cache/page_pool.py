"""The page pool: who holds each page, which pages are free, which are cached.

This is the allocator behind the paged KV cache (vLLM's ``BlockPool``). It
knows nothing about tensors: a page is just an id ``0 <= id < num_pages``.
Per page it keeps

- ``ref_count``: how many block tables hold the page;
- the prefix hash and the token ids of its contents, once the page is full and
  *indexed* (registered in the hash -> page map, so later prompts can find it).

and overall a free list (a stack), the hash index (a dict) and an eviction
policy object holding the CACHED pages. Each page is in exactly one state:

==========  ===================  ====================================
state       ref_count            where it lives
==========  ===================  ====================================
FREE        0                    the free list, no hash
IN_USE      >= 1                 one or more block tables
CACHED      0                    the eviction policy, indexed by hash
==========  ===================  ====================================

With ``prefix_cache="radix"`` the hash index and the eviction policy are
replaced by a :class:`~paged_np.cache.radix.RadixCache` (``pool.tree``): a
page is CACHED when ``ref_count == 0`` and a tree node holds it, and an
allocation that finds no FREE page takes one from the tree's least recently
used unlocked leaf. The ref counts and the free list stay here either way.

Every operation is O(1) (O(log n) under the heap-based FIFO/LFU policies):
no ``list.remove``, no scan over all pages. ``benchmarks/pool_ops.py`` checks
that the cost per operation stays flat from 1K to 1M pages.
"""

from __future__ import annotations

from typing import Callable

from ..checks import check_int, check_positive_int
from ..errors import DTypeError, InvalidArgument, OutOfPages, StalePage
from .eviction import make_policy
from .radix import RadixCache

FREE, IN_USE, CACHED = "free", "in_use", "cached"


class PagePool:
    """Free list, reference counts, prefix-hash index and eviction policy.

    Parameters
    ----------
    num_pages : int
        Pages in the arena.
    page_size : int
        Token slots per page (the pool only reports it; it never looks inside).
    eviction_policy : {"lru", "fifo", "lfu"}, an EvictionPolicy subclass or an empty instance
        Which CACHED page an allocation evicts when no page is FREE (see
        :mod:`paged_np.cache.eviction` to write your own). Hash chain only.
    prefix_cache : {"hash", "radix"}
        Index cached pages by a hash chain (vLLM) or a radix tree (SGLang).

    Example
    -------
    >>> pool = PagePool(4, 16)
    >>> p = pool.allocate(); pool.ref_count(p)
    1
    >>> pool.free(p); pool.num_free
    4
    """

    def __init__(self, num_pages: int, page_size: int, eviction_policy="lru",
                 prefix_cache: str = "hash"):
        from ..config import _check_prefix_cache

        self.num_pages = check_positive_int("PagePool.num_pages", num_pages)
        self.page_size = check_positive_int("PagePool.page_size", page_size)
        _check_prefix_cache(prefix_cache, eviction_policy, "PagePool")
        self.policy = make_policy(eviction_policy)
        self.prefix_cache = prefix_cache
        #: The radix tree indexing CACHED pages when prefix_cache == "radix", else None.
        self.tree = RadixCache(self.page_size) if prefix_cache == "radix" else None
        self._num_tree_cached = 0  # radix: pages with ref_count 0 that the tree holds
        self._ref = [0] * self.num_pages  # ref_count per page
        # Stack of FREE pages; popping from the end hands out page 0 first.
        self._free = list(range(self.num_pages - 1, -1, -1))
        self._hash: list[bytes | None] = [None] * self.num_pages  # set while indexed
        self._tokens: list[tuple | None] = [None] * self.num_pages  # contents of indexed pages
        self._index: dict[bytes, int] = {}  # prefix hash -> page id
        self.num_evictions = 0
        #: Called as ``listener(kind, page_id)`` on allocate / evict / hit / cache / free.
        self.listener: Callable[[str, int], None] | None = None

    # ------------------------------------------------------------------ queries
    @property
    def eviction_policy(self) -> str:
        return self.policy.name

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return self._num_tree_cached if self.tree is not None else len(self.policy)

    @property
    def num_in_use(self) -> int:
        return self.num_pages - len(self._free) - self.num_cached

    @property
    def num_available(self) -> int:
        """Pages an allocation can get now: FREE ones, then CACHED ones by eviction.

        With the radix tree, a CACHED page in a locked node (a sliding window
        released it under a live sequence's path) cannot be evicted yet.
        """
        if self.tree is not None:
            return len(self._free) + self.tree.evictable_pages
        return len(self._free) + len(self.policy)

    def ref_count(self, page_id: int) -> int:
        return self._ref[self._check_id(page_id)]

    def state(self, page_id: int) -> str:
        """``"free"``, ``"in_use"`` or ``"cached"``."""
        p = self._check_id(page_id)
        if self._ref[p] > 0:
            return IN_USE
        if self.tree is not None:
            return CACHED if self.tree.holds(p) else FREE
        return CACHED if p in self.policy else FREE

    def page_hash(self, page_id: int) -> bytes | None:
        """The prefix hash of an indexed page, else None."""
        return self._hash[self._check_id(page_id)]

    def lookup(self, page_hash: bytes, token_ids=None) -> int | None:
        """The indexed page with this hash (and these tokens, if given), or None.

        Comparing the tokens too guards against a hash collision handing one
        prompt another prompt's KV.
        """
        p = self._index.get(page_hash)
        if p is None or (token_ids is not None and self._tokens[p] != tuple(token_ids)):
            return None
        return p

    def eviction_order(self) -> list[int]:
        """Evictable CACHED pages, next victim first (O(n), for drawings and tests)."""
        if self.tree is not None:
            return self.tree.eviction_order()
        return self.policy.order()

    # ---------------------------------------------------------------- mutations
    def allocate(self) -> int:
        """Take one page: a FREE one, else evict the policy's victim. ref_count becomes 1.

        Raises ``OutOfPages`` (changing nothing) when no page is FREE or CACHED.
        """
        if self._free:
            p = self._free.pop()
        elif self.tree is not None and self.tree.evictable_pages:
            (p,) = self.tree.evict(1)  # the end of the least recently used unlocked leaf
            self._num_tree_cached -= 1
            self.num_evictions += 1
            self._emit("evict", p)
        elif self.tree is None and len(self.policy):
            p = self.policy.pop_victim()  # only ref_count == 0 pages live there
            self._drop_hash(p)
            self.num_evictions += 1
            self._emit("evict", p)
        else:
            raise OutOfPages(f"no free or cached page left (num_pages={self.num_pages})")
        self._ref[p] = 1
        self._emit("allocate", p)
        return p

    def allocate_many(self, n: int) -> list[int]:
        """Take ``n`` pages, all or nothing."""
        if n > self.num_available:
            raise OutOfPages(
                f"need {n} pages, only {self.num_available} free or cached "
                f"(num_pages={self.num_pages})"
            )
        return [self.allocate() for _ in range(n)]

    def free(self, page_id: int) -> None:
        """Drop one reference. At zero an indexed page becomes CACHED, others FREE.

        Raises ``StalePage`` if the page holds no reference.
        """
        p = self._check_id(page_id)
        if self._ref[p] == 0:
            raise StalePage(f"page_id {p} is not in use (freed twice?)")
        self._ref[p] -= 1
        if self._ref[p] == 0:
            if self.tree is not None and self.tree.holds(p):
                self._num_tree_cached += 1  # the tree decides when it goes
                self._emit("cache", p)
            elif self._hash[p] is not None:
                self.policy.add(p)  # the young end of the eviction order
                self._emit("cache", p)
            else:
                self._free.append(p)
                self._emit("free", p)

    def share(self, page_id: int) -> None:
        """One more block table holds an IN_USE page (a fork)."""
        p = self._check_id(page_id)
        if self._ref[p] == 0:
            raise StalePage(f"page_id {p} is not in use: it cannot be shared")
        self._ref[p] += 1

    def acquire(self, page_id: int) -> None:
        """Prefix hit: take a reference on an indexed page, CACHED or IN_USE.

        A CACHED page leaves the eviction policy (it is IN_USE again).
        """
        p = self._check_id(page_id)
        if self.tree is not None:
            if not self.tree.holds(p):
                raise StalePage(f"page_id {p} is not in the radix tree: there is nothing to hit")
            if self._ref[p] == 0:
                self._num_tree_cached -= 1
            self._ref[p] += 1
            self._emit("hit", p)
            return
        if self._hash[p] is None:
            raise StalePage(f"page_id {p} is not indexed: there is nothing to hit")
        if self._ref[p] == 0:
            self.policy.remove(p)
        self._ref[p] += 1
        self.policy.record_hit(p)
        self._emit("hit", p)

    def register(self, page_id: int, page_hash: bytes, token_ids) -> bool:
        """Index a full IN_USE page under its prefix hash so later prompts find it.

        Returns False (and indexes nothing) when another page already holds
        this hash: the duplicate stays out of the index and goes FREE later.
        """
        p = self._check_id(page_id)
        if self.tree is not None:
            raise InvalidArgument("register is the hash chain's; the radix tree indexes by insert")
        if self._ref[p] == 0:
            raise StalePage(f"page_id {p} is not in use: only held pages are registered")
        if not isinstance(page_hash, bytes):
            raise DTypeError(f"page_hash must be bytes, got {type(page_hash).__name__}")
        if page_hash in self._index or self._hash[p] is not None:
            return False
        self._index[page_hash] = p
        self._hash[p] = page_hash
        self._tokens[p] = tuple(token_ids)
        return True

    def touch(self, page_id: int) -> None:
        """Mark a CACHED page as just used: it moves to the far end of the eviction order."""
        p = self._check_id(page_id)
        if self.state(p) != CACHED:
            raise StalePage(f"page_id {p} is not cached: only cached pages can be touched")
        if self.tree is not None:
            self.tree.touch(self.tree.node_of(p))  # the whole path counts as used
        else:
            self.policy.touch(p)

    # ------------------------------------------------------------------ helpers
    def _drop_hash(self, p: int) -> None:
        del self._index[self._hash[p]]
        self._hash[p] = None
        self._tokens[p] = None
        self.policy.forget(p)

    def _emit(self, kind: str, p: int) -> None:
        if self.listener is not None:
            self.listener(kind, p)

    def _check_id(self, page_id) -> int:
        return check_int("page_id", page_id, 0, self.num_pages)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(num_pages))."""
        n = self.num_pages
        free = set(self._free)
        assert len(free) == len(self._free), "free list holds a page twice"
        if self.tree is not None:
            self._check_radix(free)
            return
        cached = set(self.policy.order())
        assert len(cached) == len(self.policy), "eviction policy holds a page twice"
        assert not (free & cached), "a page is both FREE and CACHED"
        in_use = {p for p in range(n) if self._ref[p] > 0}
        assert not (in_use & (free | cached)), "a page with ref_count > 0 is FREE or CACHED"
        assert len(free) + len(cached) + len(in_use) == n, "page conservation: pages lost"
        assert all(r >= 0 for r in self._ref), "negative ref_count"
        for p in free:
            assert self._hash[p] is None, f"FREE page {p} still has a hash"
        for p in cached:
            assert self._hash[p] is not None, f"CACHED page {p} has no hash"
        for h, p in self._index.items():
            assert self._hash[p] == h, f"hash index points to page {p}, whose hash differs"
        assert sum(h is not None for h in self._hash) == len(self._index), (
            "a page has a hash but is not in the index"
        )

    def _check_radix(self, free: set) -> None:
        tree = self.tree
        tree.check_invariants()
        held = set(tree._page_node)
        assert not (free & held), "a FREE page is still in the radix tree"
        cached = {p for p in held if self._ref[p] == 0}
        assert len(cached) == self._num_tree_cached, (
            f"num_cached is {self._num_tree_cached}, the tree holds {len(cached)} idle pages")
        in_use = {p for p in range(self.num_pages) if self._ref[p] > 0}
        assert not (in_use & free), "a page with ref_count > 0 is FREE"
        assert len(free) + len(cached) + len(in_use) == self.num_pages, (
            "page conservation: pages lost")
        for node in tree.nodes():
            if node.lock_ref == 0:
                assert all(self._ref[p] == 0 for p in node.value), (
                    f"unlocked node {node.id} holds a page in use: eviction could take it")
        assert all(h is None for h in self._hash), "radix pool: a page has a hash"
