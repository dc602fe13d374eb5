"""What a tier below the arena holds: page hash -> entry, and which entry goes first.

A tier (host memory, :mod:`.host_tier`; disk, :mod:`.disk_tier`) keeps whole
pages under their *page hash*, the process-stable SHA-256 chain of their prefix
(:func:`~paged_np.cache.hash_index.chain_hash`). This module is the part both
tiers share: a dict from hash to :class:`TierEntry` and an
:class:`~paged_np.EvictionPolicy` over the entries, the same policies the
arena's prefix index uses (a tier picks its own by name), kept in a min-heap
with lazy deletion as in :mod:`.hash_index`. It knows nothing of K/V: an
entry's ``where`` is the tier's own (a host slot, a file's size).

Every entry in a tier is evictable: a page is copied *out* when it is loaded
back into the arena, so nothing pins it.
"""

from __future__ import annotations

import heapq
from itertools import count

from .eviction import make_policy


class TierEntry:
    """One page a tier holds: its hash and tokens, where it is, the policy's stamps."""

    __slots__ = ("hash", "token_ids", "where", "last_access_time", "hit_count",
                 "creation_time")

    def __init__(self, page_hash: bytes, token_ids: tuple, where, time: int):
        self.hash = page_hash
        self.token_ids = token_ids          # the page's own tokens: a hit compares them too
        self.where = where                  # the tier's: a host slot, or a file's bytes
        self.last_access_time = time
        self.hit_count = 0
        self.creation_time = time

    def __repr__(self):
        return (f"TierEntry({self.hash.hex()[:12]}, where={self.where}, "
                f"hits={self.hit_count}, last_access={self.last_access_time})")


class TierIndex:
    """hash -> :class:`TierEntry`, with ``policy`` choosing the next victim (O(log n))."""

    def __init__(self, policy="lru"):
        self.policy = make_policy(policy)
        self._entries: dict[bytes, TierEntry] = {}
        self._clock = count(1)
        self._heap: list[tuple] = []        # (priority, push, hash); stale when it differs
        self._queued: dict[bytes, tuple] = {}
        self._pushes = count()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self._entries

    def get(self, page_hash: bytes, token_ids=None) -> TierEntry | None:
        """The entry for ``page_hash`` (and these tokens, if given), changing nothing."""
        e = self._entries.get(page_hash)
        if e is None or (token_ids is not None and e.token_ids != tuple(token_ids)):
            return None
        return e

    def hit(self, e: TierEntry) -> None:
        """A lookup found ``e``: it counts as just used."""
        e.hit_count += 1
        e.last_access_time = next(self._clock)
        self._queue(e)

    def add(self, page_hash: bytes, token_ids, where, time: int | None = None) -> TierEntry:
        """File a new entry (the hash must not be held); ``time`` orders entries found on
        disk at start (oldest first), else now."""
        e = TierEntry(page_hash, tuple(token_ids), where, next(self._clock))
        if time is not None:
            e.last_access_time = e.creation_time = time
        self._entries[page_hash] = e
        self._queue(e)
        return e

    def remove(self, page_hash: bytes) -> TierEntry | None:
        """Forget an entry (its heap entry goes stale); returns it, or None."""
        self._queued.pop(page_hash, None)
        return self._entries.pop(page_hash, None)

    def pop_victim(self) -> TierEntry | None:
        """Forget and return the entry the policy ranks first, or None when empty."""
        while self._heap:
            key, push, h = heapq.heappop(self._heap)
            if self._queued.get(h) == (key, push):
                return self.remove(h)
        return None

    def entries(self) -> list[TierEntry]:
        return list(self._entries.values())

    def _queue(self, e: TierEntry) -> None:
        key = self.policy.priority(e)
        old = self._queued.get(e.hash)
        if old is not None and old[0] == key:
            return
        push = next(self._pushes)
        self._queued[e.hash] = (key, push)
        heapq.heappush(self._heap, (key, push, e.hash))
        if len(self._heap) > 2 * len(self._queued) + 64:   # drop stale entries
            self._heap = [(k, n, h) for h, (k, n) in self._queued.items()]
            heapq.heapify(self._heap)

    def check_invariants(self) -> None:
        assert set(self._queued) == set(self._entries), "a tier entry is not in its heap"
        for h, e in self._entries.items():
            assert e.hash == h, "a tier entry is filed under another hash"
            assert self._queued[h][0] == self.policy.priority(e), "stale priority in a tier"
