"""Eviction policies: which CACHED page gives up its contents first.

A page is CACHED when no sequence holds it any more (``ref_count == 0``) but its
KV is full and hashed, so a later prompt with the same prefix can reuse it.
When an allocation finds no FREE page, the pool asks the policy for a victim
among the CACHED pages, forgets that page's hash and hands it out again.

Every policy holds exactly the CACHED pages. :class:`EvictionPolicy` is the
abstract base that declares what the pool asks of a policy:

- ``add(page)``: the page just became CACHED (its last reference was dropped);
- ``remove(page)``: the page left the CACHED set because a prefix hit took it;
- ``touch(page)``: the page was just used (reorders LRU and LFU);
- ``pop_victim()``: take the page to evict now out of the set and return it;
- ``len(policy)`` and ``page in policy``: how many pages it holds, and which;
- ``order()``: the held pages, next victim first (for drawings and checks);

plus two hooks with empty defaults, ``record_hit(page)`` and ``forget(page)``,
for policies that keep a history. To write a fourth policy, subclass
:class:`EvictionPolicy`, implement those seven methods and pass the class as
``CacheConfig(eviction_policy=MyPolicy)`` (or an instance to :class:`PagePool`).
The pool never calls ``pop_victim`` on an empty policy, never ``add`` for a page
the policy holds, and never ``remove`` or ``touch`` for one it does not.

Read :class:`LRUPolicy` first: it is the one vLLM uses, and the shortest.

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
from abc import ABC, abstractmethod
from collections import OrderedDict
from itertools import count


class EvictionPolicy(ABC):
    """The interface between the page pool and a policy: the CACHED pages, in some order.

    Subclasses implement the abstract methods below; ``record_hit`` and
    ``forget`` are optional hooks (no-ops here). ``name`` is what
    ``PagePool.eviction_policy`` reports.
    """

    name = "base"

    @abstractmethod
    def add(self, page: int) -> None:
        """The page became CACHED (ref_count dropped to 0 and it is indexed)."""

    @abstractmethod
    def remove(self, page: int) -> None:
        """A prefix hit took the CACHED page back into use: stop holding it."""

    @abstractmethod
    def touch(self, page: int) -> None:
        """The CACHED page was just used; a recency policy moves it to the young end."""

    @abstractmethod
    def pop_victim(self) -> int:
        """Stop holding one page and return it: the page to evict (never called when empty)."""

    @abstractmethod
    def __len__(self) -> int:
        """How many pages the policy holds (the pool's ``num_cached``)."""

    @abstractmethod
    def __contains__(self, page: int) -> bool:
        """Whether the policy holds this page (i.e. the page is CACHED)."""

    @abstractmethod
    def order(self) -> list[int]:
        """The held pages, next victim first. May be O(n): for drawings and checks."""

    def record_hit(self, page: int) -> None:
        """A prefix hit reused this page (CACHED or still IN_USE). Optional hook."""
        return None

    def forget(self, page: int) -> None:
        """The page's contents were dropped (it went FREE): forget its history. Optional hook."""
        return None


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


def make_policy(policy) -> EvictionPolicy:
    """Return the policy object a pool uses.

    ``policy`` is a name in ``{"lru", "fifo", "lfu"}`` or a subclass of
    :class:`EvictionPolicy` (a fresh object of it is made), or an empty
    :class:`EvictionPolicy` object (used as it is).
    """
    from ..errors import InvalidArgument

    if isinstance(policy, EvictionPolicy):
        if len(policy):
            raise InvalidArgument(
                f"eviction_policy: a policy object must be empty, this one holds {len(policy)}"
                " pages")
        return policy
    if isinstance(policy, type) and issubclass(policy, EvictionPolicy):
        return policy()
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise InvalidArgument(
        f"eviction_policy must be one of {tuple(POLICIES)} or an EvictionPolicy subclass,"
        f" got {policy!r}")
