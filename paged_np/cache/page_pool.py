"""The page pool: who holds each page and which pages are free.

This is the allocator behind the paged KV cache (vLLM's ``BlockPool``). It
knows nothing about tensors or tokens: a page is just an id
``0 <= id < num_pages``. It keeps a reference count per page (how many block
tables hold it) and a free list (a stack), and it is handed a prefix index
(:mod:`.prefix_index`: the hash chain or the radix tree) that knows which pages
hold reusable K/V. Each page is in exactly one state:

==========  ===================  ======================================
state       ref_count            where it lives
==========  ===================  ======================================
FREE        0                    the free list; the index does not hold it
IN_USE      >= 1                 one or more block tables
CACHED      0                    the index holds it: a later prompt may hit it
==========  ===================  ======================================

When no page is FREE, :meth:`PagePool.allocate` asks the index to evict one
(the index's eviction policy picks it). The pool tells the index when a page
it holds goes idle (last reference dropped) or is reused by a prefix hit;
that is all the index needs to keep its eviction order.

Every operation is O(1) here plus the index's O(log n) heap: no
``list.remove``, no scan over all pages. ``benchmarks/pool_ops.py`` times
each operation at 1K to 1M pages and writes ``benchmarks/pool_ops.md``.
"""

from __future__ import annotations

from typing import Callable

from ..checks import check_int, check_positive_int
from ..errors import DTypeError, OutOfPages, StalePage
from ..registry import PREFIX_INDEXES
from .prefix_index import PrefixIndex

FREE, IN_USE, CACHED = "free", "in_use", "cached"


class PagePool:
    """Free list and reference counts; the prefix index it is handed holds CACHED pages.

    Parameters
    ----------
    num_pages : int
        Pages in the arena.
    page_size : int
        Token slots per page (the pool only reports it; it never looks inside).
    prefix_index : PrefixIndex, optional
        The index of cached pages (built by
        :func:`~paged_np.cache.prefix_index.make_prefix_index`); a hash chain with
        LRU eviction when omitted. The pool asks it for victims.

    Notes
    -----
    Events: ``listener(kind, page_id, seq_id)`` is called on allocate, hit,
    cache and free, with the ``seq_id`` the caller passed.

    Example
    -------
    >>> pool = PagePool(4, 16)
    >>> p = pool.allocate(); pool.ref_count(p)
    1
    >>> pool.free(p); pool.num_free
    4
    """

    def __init__(self, num_pages: int, page_size: int, prefix_index: PrefixIndex | None = None):
        self.num_pages = check_positive_int("PagePool.num_pages", num_pages)
        self.page_size = check_positive_int("PagePool.page_size", page_size)
        if prefix_index is not None and not isinstance(prefix_index, PrefixIndex):
            raise DTypeError(
                f"prefix_index must be a PrefixIndex, got {type(prefix_index).__name__}")
        if prefix_index is None:                          # the default index, vLLM's
            prefix_index = PREFIX_INDEXES.load("hash")(page_size)
        self.prefix_index = prefix_index
        self._ref = [0] * self.num_pages  # ref_count per page
        # Stack of FREE pages; popping from the end hands out page 0 first.
        self._free = list(range(self.num_pages - 1, -1, -1))
        self._num_cached = 0  # pages with ref_count 0 that the index holds
        self.num_evictions = 0
        self.listener: Callable[[str, int, object], None] | None = None

    # ------------------------------------------------------------------ queries
    @property
    def eviction_policy(self) -> str:
        """The name of the index's eviction policy."""
        return self.prefix_index.policy.name

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return self._num_cached

    @property
    def num_in_use(self) -> int:
        return self.num_pages - len(self._free) - self._num_cached

    @property
    def num_available(self) -> int:
        """Pages an allocation can get now: FREE ones, then evictable CACHED ones.

        With the radix tree, a CACHED page in a locked node (a sliding window
        released it under a live sequence's path) cannot be evicted yet.
        """
        return len(self._free) + self.prefix_index.num_evictable

    def ref_count(self, page_id: int) -> int:
        """How many block tables hold the page."""
        return self._ref[self._check_id(page_id)]

    def state(self, page_id: int) -> str:
        """``"free"``, ``"in_use"`` or ``"cached"``."""
        p = self._check_id(page_id)
        if self._ref[p] > 0:
            return IN_USE
        return CACHED if self.prefix_index.holds(p) else FREE

    def eviction_order(self) -> list[int]:
        """Pages :meth:`allocate` would evict, next victim first (O(n log n), for drawings)."""
        return self.prefix_index.eviction_order()

    # ---------------------------------------------------------------- mutations
    def allocate(self, seq_id=None) -> int:
        """Take one page for ``seq_id``: a FREE one, else the index's next victim.

        ref_count becomes 1. Raises ``OutOfPages`` (changing nothing) when no
        page is FREE or evictable.
        """
        if self._free:
            p = self._free.pop()
        else:
            victims = self.prefix_index.evict(1, seq_id)  # records its own "evict"
            if not victims:
                raise OutOfPages(f"no free or cached page left (num_pages={self.num_pages})")
            (p,) = victims
            self._num_cached -= 1
            self.num_evictions += 1
        self._ref[p] = 1
        self._emit("allocate", p, seq_id)
        return p

    def allocate_many(self, n: int, seq_id=None) -> list[int]:
        """Take ``n`` pages, all or nothing."""
        if n > self.num_available:
            raise OutOfPages(
                f"need {n} pages, only {self.num_available} free or cached "
                f"(num_pages={self.num_pages})"
            )
        return [self.allocate(seq_id) for _ in range(n)]

    def free(self, page_id: int, seq_id=None) -> None:
        """``seq_id`` drops one reference. At zero a page the index holds becomes CACHED,
        any other FREE.

        Raises ``StalePage`` if the page holds no reference.
        """
        p = self._check_id(page_id)
        if self._ref[p] == 0:
            raise StalePage(f"page_id {p} is not in use (freed twice?)")
        self._ref[p] -= 1
        if self._ref[p] == 0:
            if self.prefix_index.holds(p):
                self._num_cached += 1
                self.prefix_index.page_idle(p)  # the index decides when it goes
                self._emit("cache", p, seq_id)
            else:
                self._free.append(p)
                self._emit("free", p, seq_id)

    def share(self, page_id: int) -> None:
        """One more block table holds an IN_USE page (a fork)."""
        p = self._check_id(page_id)
        if self._ref[p] == 0:
            raise StalePage(f"page_id {p} is not in use: it cannot be shared")
        self._ref[p] += 1

    def touch(self, page_id: int, seq_id=None) -> None:
        """Prefix hit: ``seq_id`` takes a reference on a page the index holds (vLLM's ``touch``).

        The page may be CACHED (it is IN_USE again, out of the eviction order)
        or already IN_USE by another sequence. Raises ``StalePage`` for a page
        the index does not hold.
        """
        p = self._check_id(page_id)
        if not self.prefix_index.holds(p):
            raise StalePage(f"page_id {p} is not indexed: there is nothing to hit")
        if self._ref[p] == 0:
            self._num_cached -= 1
            self.prefix_index.page_reused(p)
        self._ref[p] += 1
        self._emit("hit", p, seq_id)

    # ------------------------------------------------------------------ helpers
    def _emit(self, kind: str, p: int, seq_id) -> None:
        if self.listener is not None:
            self.listener(kind, p, seq_id)

    def _check_id(self, page_id) -> int:
        return check_int("page_id", page_id, 0, self.num_pages)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(num_pages)),
        then check the index, alone and against these reference counts."""
        n = self.num_pages
        free = set(self._free)
        assert len(free) == len(self._free), "free list holds a page twice"
        assert all(r >= 0 for r in self._ref), "negative ref_count"
        index = self.prefix_index
        held = set(index.pages())
        assert not (free & held), "a page is both FREE and CACHED (the index holds a FREE page)"
        in_use = {p for p in range(n) if self._ref[p] > 0}
        assert not (in_use & free), "a page with ref_count > 0 is FREE"
        cached = held - in_use
        assert len(cached) == self._num_cached, (
            f"num_cached is {self._num_cached}, the index holds {len(cached)} idle pages")
        assert len(free) + len(cached) + len(in_use) == n, "page conservation: pages lost"
        index.check_invariants(self)
