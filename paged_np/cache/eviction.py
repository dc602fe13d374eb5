"""Eviction policies: which CACHED page gives up its contents first.

A page is CACHED when no sequence holds it any more (``ref_count == 0``) but its
KV is full and hashed, so a later prompt with the same prefix can reuse it.
When an allocation finds no FREE page, the pool asks the policy for a victim
among the CACHED pages, forgets that page's hash and hands it out again.

Every policy holds exactly the CACHED pages and answers four questions:

- ``add(page)``: the page just became CACHED (its last reference was dropped);
- ``remove(page)``: the page left the CACHED set because a prefix hit took it;
- ``touch(page)``: the page was just used (reorders LRU and LFU);
- ``pop_victim()``: the page to evict now.

Costs: LRU is O(1) per operation (an ``OrderedDict`` is a hash map threaded
through a doubly-linked list: ``move_to_end`` and ``popitem(last=False)`` are
constant time). FIFO and LFU keep a binary heap, O(log n) per operation, with
lazy deletion: a removed page's heap entry stays behind and is skipped when it
reaches the top. No policy ever scans all pages.

vLLM uses LRU (its ``FreeKVCacheBlockQueue`` is the same linked list). FIFO and
LFU are here for comparison in the notebooks and ``python -m paged_np simulate``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from itertools import count


class EvictionPolicy:
    """What every policy offers. Hooks that a policy does not need are no-ops."""

    name = "base"

    def record_hit(self, page: int) -> None:
        """A prefix hit reused this page (CACHED or still IN_USE)."""

    def forget(self, page: int) -> None:
        """The page's contents were dropped (it went FREE): forget its history."""


class LRUPolicy(EvictionPolicy):
    """Least recently used: the page released (or touched) longest ago goes first."""

    name = "lru"

    def __init__(self):
        self._order: OrderedDict[int, None] = OrderedDict()  # oldest first

    def add(self, page: int) -> None:
        self._order[page] = None  # appended at the young end

    def remove(self, page: int) -> None:
        del self._order[page]

    def touch(self, page: int) -> None:
        self._order.move_to_end(page)

    def pop_victim(self) -> int:
        page, _ = self._order.popitem(last=False)
        return page

    def __contains__(self, page: int) -> bool:
        return page in self._order

    def __len__(self) -> int:
        return len(self._order)

    def order(self) -> list[int]:
        """CACHED pages in eviction order (next victim first). O(n): for drawings."""
        return list(self._order)


class _LazyHeapPolicy(EvictionPolicy):
    """A min-heap of ``(key, page)`` with lazy deletion; subclasses choose the key.

    ``self._key[page]`` is the live key of each CACHED page. A heap entry whose
    key no longer matches (the page was removed or re-keyed) is stale and is
    dropped when it surfaces. The heap is rebuilt when stale entries outnumber
    live ones, so its size stays O(number of CACHED pages).
    """

    name = "heap"

    def __init__(self):
        self._heap: list[tuple] = []
        self._key: dict[int, tuple] = {}

    def _push(self, page: int, key: tuple) -> None:
        self._key[page] = key
        heapq.heappush(self._heap, (key, page))
        if len(self._heap) > 2 * len(self._key) + 64:
            self._heap = [(k, p) for p, k in self._key.items()]
            heapq.heapify(self._heap)

    def remove(self, page: int) -> None:
        del self._key[page]

    def pop_victim(self) -> int:
        while True:
            key, page = heapq.heappop(self._heap)
            if self._key.get(page) == key:
                del self._key[page]
                return page

    def __contains__(self, page: int) -> bool:
        return page in self._key

    def __len__(self) -> int:
        return len(self._key)

    def order(self) -> list[int]:
        """CACHED pages in eviction order (next victim first). O(n log n): for drawings."""
        return [p for _, p in sorted((k, p) for p, k in self._key.items())]


class FIFOPolicy(_LazyHeapPolicy):
    """First in, first out: by the time a page was *first* cached.

    A hit does not refresh the page: if it is released again it keeps its
    original place in line. The stamp is forgotten when the page is evicted
    (its contents are gone), so a reused page starts a new life.
    """

    name = "fifo"

    def __init__(self):
        super().__init__()
        self._first_cached: dict[int, int] = {}
        self._clock = count()

    def add(self, page: int) -> None:
        stamp = self._first_cached.setdefault(page, next(self._clock))
        self._push(page, (stamp,))

    def touch(self, page: int) -> None:
        pass  # FIFO ignores use

    def pop_victim(self) -> int:
        page = super().pop_victim()
        del self._first_cached[page]
        return page

    def forget(self, page: int) -> None:
        self._first_cached.pop(page, None)


class LFUPolicy(_LazyHeapPolicy):
    """Least frequently used: fewest prefix hits first, ties broken by recency (LRU).

    The hit count belongs to the page's contents: it grows on every prefix hit
    and is forgotten when the page is evicted.
    """

    name = "lfu"

    def __init__(self):
        super().__init__()
        self._hits: dict[int, int] = {}
        self._clock = count()

    def add(self, page: int) -> None:
        self._push(page, (self._hits.get(page, 0), next(self._clock)))

    def touch(self, page: int) -> None:
        self._push(page, (self._hits.get(page, 0), next(self._clock)))

    def record_hit(self, page: int) -> None:
        self._hits[page] = self._hits.get(page, 0) + 1

    def pop_victim(self) -> int:
        page = super().pop_victim()
        self._hits.pop(page, None)
        return page

    def forget(self, page: int) -> None:
        self._hits.pop(page, None)


POLICIES = {"lru": LRUPolicy, "fifo": FIFOPolicy, "lfu": LFUPolicy}


def make_policy(name: str):
    """Return a fresh policy object for ``name`` in ``{"lru", "fifo", "lfu"}``."""
    from ..errors import InvalidArgument

    if name not in POLICIES:
        raise InvalidArgument(f"eviction_policy must be one of {tuple(POLICIES)}, got {name!r}")
    return POLICIES[name]()
