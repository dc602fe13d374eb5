"""The hash chain (vLLM): every full page filed under a hash of its whole prefix.

A full page's hash digests its parent page's hash, its own tokens and an
optional extra key, so one hash names the page *and everything before it*::

    h0 = hash_page(ROOT_HASH, tokens[0:16])
    h1 = hash_page(h0,        tokens[16:32])       # covers tokens[0:32]

Two pages holding the same 16 tokens at different places in different prompts
get different hashes, which is what makes prefix reuse safe. A prompt's cached
prefix is found by hashing it one page at a time and looking each hash up in a
dict until one is missing (:meth:`HashIndex.match_prefix`); a hit also compares
the page's tokens, so a hash collision can never hand one prompt another's K/V.

Per indexed page the index keeps one :class:`CachedPage`: its hash, its tokens,
and the stamps an :class:`~paged_np.EvictionPolicy` reads. A page is CACHED
when it is indexed and no sequence holds it; every CACHED page is evictable,
and :meth:`HashIndex.evict` takes the one with the smallest policy priority
from a lazy-deletion min-heap (O(log n)). Pages are released tail-first by
the cache, so under LRU a sequence's later pages go before its prefix.

Compared with vLLM: the same chain (``hash_block_tokens``), the same dict
(``cached_block_hash_to_block``); vLLM keys its dict by hash and keeps several
blocks per hash, we keep one page per hash and let a duplicate go FREE.
"""

from __future__ import annotations

import hashlib
import heapq
from itertools import count

import numpy as np

from ..errors import DTypeError
from .prefix_index import PrefixIndex

ROOT_HASH = b"\x00" * 32  # parent of a sequence's first page


def hash_page(parent: bytes, token_ids, extra_key: bytes | None = None) -> bytes:
    """Prefix hash of one full page: sha256(parent hash, token ids, extra key).

    Deterministic across processes (unlike Python's salted ``hash()``), so a
    cache could be shared between workers. ``extra_key`` separates prompts whose
    KV differ for reasons other than tokens (a LoRA adapter, an image, ...).
    """
    h = hashlib.sha256(parent)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    if extra_key is not None:
        h.update(b"\x01" + extra_key)
    return h.digest()


def chain_hash(token_ids, extra_key: bytes | None, page_size: int) -> bytes:
    """The hash of the last full page of ``token_ids``: the chain over every page before it
    (:data:`ROOT_HASH` for no full page). What an indexed page is named by in every
    process, so the tiers below the arena (:mod:`.tiers`) file it under the same name."""
    parent = ROOT_HASH
    for i in range(len(token_ids) // page_size):
        parent = hash_page(parent, token_ids[i * page_size:(i + 1) * page_size], extra_key)
    return parent


class CachedPage:
    """One indexed page: what the index files it under, and the policy's stamps."""

    __slots__ = ("page_id", "hash", "token_ids", "last_access_time", "hit_count",
                 "creation_time")

    def __init__(self, page_id: int, page_hash: bytes, token_ids: tuple, time: int):
        self.page_id = page_id
        self.hash = page_hash
        self.token_ids = token_ids
        self.last_access_time = time
        self.hit_count = 0
        self.creation_time = None  # set when the page first becomes CACHED

    def __repr__(self):
        return (f"CachedPage({self.page_id}, hits={self.hit_count}, "
                f"last_access={self.last_access_time}, created={self.creation_time})")


class HashIndex(PrefixIndex):
    """vLLM's prefix index: hash -> page, with any eviction policy over CACHED pages.

    The handle a sequence keeps is the list of its full pages' hashes (the
    chain); :meth:`lock` and :meth:`unlock` do nothing, because here a page is
    protected by its reference count alone.

    Example
    -------
    >>> idx = HashIndex(page_size=2)
    >>> handle, added = idx.insert([1, 2, 3, 4], [7, 8], [])
    >>> added, idx.match_prefix([1, 2, 3, 4, 5])[0]
    ([7, 8], [7, 8])
    """

    kind = "hash"

    def __init__(self, page_size: int, policy="lru"):
        super().__init__(page_size, policy)
        self._by_hash: dict[bytes, CachedPage] = {}   # prefix hash -> entry
        self._entry: dict[int, CachedPage] = {}       # page id -> entry, while indexed
        self._clock = count(1)                        # the stamps' one logical clock
        # Min-heap of (priority, push, page) over CACHED pages. _queued[page] is the
        # (priority, push) of its live entry; any other heap entry is stale.
        self._heap: list[tuple] = []
        self._queued: dict[int, tuple] = {}
        self._pushes = count()

    # ------------------------------------------------------------ prefixes
    def match_prefix(self, token_ids, extra_key=None):
        ps = self.page_size
        parent, pages, hashes = ROOT_HASH, [], []
        for i in range(len(token_ids) // ps):
            page_tokens = token_ids[i * ps:(i + 1) * ps]
            parent = hash_page(parent, page_tokens, extra_key)
            e = self._lookup(parent, page_tokens)
            if e is None:
                break
            e.hit_count += 1
            pages.append(e.page_id)
            hashes.append(parent)
        return pages, hashes

    def prefix_length(self, token_ids, extra_key=None, memo=None) -> int:
        ps = self.page_size
        hashes = self.page_hashes(token_ids, extra_key, memo)
        n = 0
        for h in hashes[:len(token_ids) // ps]:
            if self._lookup(h, token_ids[n:n + ps]) is None:
                break
            n += ps
        return n

    def page_hashes(self, token_ids, extra_key=None, memo=None) -> list[bytes]:
        """The hash chain of ``token_ids``'s full pages; ``memo`` keeps it for next time.

        The memo belongs to one request, whose tokens only grow: the hashes it
        holds are extended, never recomputed.
        """
        hashes = [] if memo is None else memo.setdefault("page_hashes", [])
        ps = self.page_size
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), len(token_ids) // ps):
            parent = hash_page(parent, token_ids[i * ps:(i + 1) * ps], extra_key)
            hashes.append(parent)
        return hashes

    def insert(self, token_ids, pages, handle, extra_key=None, seq_id=None):
        ps = self.page_size
        parent = handle[-1] if handle else ROOT_HASH
        chain, added = list(handle), []
        for i, p in enumerate(pages):
            page_tokens = tuple(token_ids[i * ps:(i + 1) * ps])
            parent = hash_page(parent, page_tokens, extra_key)
            chain.append(parent)
            if self.register(p, parent, page_tokens, seq_id):
                added.append(p)
        return chain, added

    def register(self, page: int, page_hash: bytes, token_ids, seq_id=None) -> bool:
        """File one full page under its prefix hash so later prompts find it.

        Returns False (and indexes nothing) when another page already holds
        this hash: the duplicate stays out of the index and goes FREE later.
        """
        if not isinstance(page_hash, bytes):
            raise DTypeError(f"page_hash must be bytes, got {type(page_hash).__name__}")
        if page_hash in self._by_hash or page in self._entry:
            return False
        e = CachedPage(page, page_hash, tuple(token_ids), next(self._clock))
        self._by_hash[page_hash] = self._entry[page] = e
        self._emit("hash", page, seq_id)
        return True

    def lock(self, handle) -> None:
        return None   # a page in use is protected by its reference count

    def unlock(self, handle) -> None:
        return None

    def page_hash(self, page: int) -> bytes | None:
        """The prefix hash of an indexed page, else None."""
        e = self._entry.get(page)
        return None if e is None else e.hash

    def page_key(self, page: int) -> tuple[bytes, tuple] | None:
        """:meth:`PrefixIndex.page_key`: the hash it is filed under and its tokens."""
        e = self._entry.get(page)
        return None if e is None else (e.hash, e.token_ids)

    def lookup(self, page_hash: bytes, token_ids=None) -> int | None:
        """The indexed page with this hash (and these tokens, if given), or None."""
        e = self._lookup(page_hash, token_ids)
        return None if e is None else e.page_id

    # --------------------------------------------------------------- pages
    def holds(self, page: int) -> bool:
        return page in self._entry

    def pages(self) -> list[int]:
        return sorted(self._entry)

    def page_idle(self, page: int) -> None:
        e = self._entry[page]
        e.last_access_time = next(self._clock)    # released now: the young end of LRU
        if e.creation_time is None:
            e.creation_time = e.last_access_time  # FIFO's stamp: first time CACHED
        self._queue(e)

    def page_reused(self, page: int) -> None:
        del self._queued[page]                    # its heap entry is stale from now on

    def mark_used(self, page: int) -> None:
        e = self._entry[page]
        e.last_access_time = next(self._clock)
        self._queue(e)

    def evict(self, num_pages: int, seq_id=None) -> list[int]:
        out: list[int] = []
        while len(out) < num_pages and self._queued:
            key, push, p = heapq.heappop(self._heap)
            if self._queued.get(p) != (key, push):
                continue                              # stale entry
            del self._queued[p]
            self._emit("evict", p, seq_id)            # still indexed: a listener may save it
            e = self._entry.pop(p)
            del self._by_hash[e.hash]                 # its contents are gone: stamps too
            out.append(p)
        return out

    @property
    def num_evictable(self) -> int:
        return len(self._queued)

    def eviction_order(self) -> list[int]:
        return [p for p, _ in sorted(self._queued.items(), key=lambda kv: kv[1])]

    # ----------------------------------------------------------- reporting
    def stats(self) -> dict:
        return {"indexed_pages": len(self._entry)}

    def check_invariants(self, pool=None) -> None:
        for h, e in self._by_hash.items():
            assert e.hash == h, f"hash index points to page {e.page_id}, whose hash differs"
            assert self._entry.get(e.page_id) is e, f"page {e.page_id}: entry map disagrees"
        assert len(self._entry) == len(self._by_hash), (
            "a page has a hash but is not in the index")
        live = {(k, push, p) for p, (k, push) in self._queued.items()}
        assert live <= set(self._heap), "a CACHED page is missing from the eviction heap"
        for p, (key, _) in self._queued.items():
            e = self._entry.get(p)
            assert e is not None, f"CACHED page {p} has no hash"
            assert key == self.policy.priority(e), f"page {p}: stale priority in the heap"
        if pool is not None:
            for p in self._entry:
                idle = pool.ref_count(p) == 0
                assert idle == (p in self._queued), (
                    f"page {p}: ref_count {pool.ref_count(p)} but "
                    f"{'' if p in self._queued else 'not '}in the eviction order")

    def check_sequences(self, seqs) -> None:
        for s in seqs:
            chain = s.prefix_handle
            assert len(chain) == s.num_indexed_pages, f"sequence {s.seq_id!r}: hash chain length"
            for i, p in enumerate(s.block_table):
                e = self._entry.get(p) if p >= 0 else None
                if e is not None:
                    assert i < len(chain) and e.hash == chain[i], (
                        f"sequence {s.seq_id!r}: indexed page {p} has another prefix's hash")

    # ------------------------------------------------------------- helpers
    def _lookup(self, page_hash: bytes, token_ids) -> CachedPage | None:
        e = self._by_hash.get(page_hash)
        if e is None or (token_ids is not None and e.token_ids != tuple(token_ids)):
            return None
        return e

    def _queue(self, e: CachedPage) -> None:
        """(Re)place a CACHED page in the heap under its current priority."""
        key = self.policy.priority(e)
        old = self._queued.get(e.page_id)
        if old is not None and old[0] == key:
            return                                    # FIFO ignores use: same place in line
        push = next(self._pushes)
        self._queued[e.page_id] = (key, push)
        heapq.heappush(self._heap, (key, push, e.page_id))
        if len(self._heap) > 2 * len(self._queued) + 64:  # drop stale entries
            self._heap = [(k, n, p) for p, (k, n) in self._queued.items()]
            heapq.heapify(self._heap)

    def walk(self) -> None:
        """:meth:`PrefixIndex.walk`: None. The chain files each page under its own hash;
        the hash digests the parent's, so the pages' links are not kept to walk."""
        return None
