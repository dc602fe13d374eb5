"""The host tier: a bounded pool of pages in host memory, keyed by page hash.

When the arena's prefix index evicts a cached page, the tiers
(:mod:`.tiers`) may copy its K/V here before the page is reused; a later
prompt that misses the arena but finds the page here gets it copied back
instead of recomputed. This is vLLM's CPU offloading (``OffloadingConnector``),
SGLang HiCache's host tier and LMCache's local CPU backend.

The pool is one preallocated array, page-major so that a page is one
contiguous block (what the disk tier writes as it is)::

    data.shape   == (capacity, num_layers, 2, num_kv_heads, page_size, head_dim)
    scales.shape == (capacity, num_layers, 2, num_kv_heads, page_size)   # 8-bit pages

``capacity = memory // bytes_per_page``, so the pool never holds more than
its budget. Which page it drops when full is its own
:class:`~paged_np.EvictionPolicy` (:mod:`.tier_index`), and a dropped page is
handed to ``on_evict`` first (the disk tier below, when there is one).

Compared with vLLM: no asynchronous copies (the copy is a NumPy assignment on
the engine's thread), no pinned memory, one page per block.
"""

from __future__ import annotations

import numpy as np

from ..checks import parse_bytes
from .tier_index import TierIndex


class HostPool:
    """Up to ``memory`` bytes of pages shaped like ``cfg``'s (a :class:`CacheConfig`).

    Example
    -------
    >>> import numpy as np, paged_np as pnp
    >>> cfg = pnp.CacheConfig(num_pages=4, page_size=2, head_dim=4)
    >>> pool = HostPool(cfg, 3 * cfg.bytes_per_page)
    >>> page = np.ones(pool.page_shape, np.float32)
    >>> pool.store(b"h" * 32, (1, 2), page, None)
    True
    >>> pool.load(b"h" * 32, (1, 2))[0].sum() == page.sum(), pool.capacity
    (True, 3)
    """

    name = "host"

    def __init__(self, cfg, memory, policy="lru"):
        self.bytes_per_page = cfg.bytes_per_page
        self.memory = parse_bytes(memory, "host_cache_memory")
        self.capacity = self.memory // self.bytes_per_page       # whole pages only
        shape = cfg.arena_shape
        #: One page as stored: [L, 2, Hkv, page_size, D] (and its scales [L, 2, Hkv, ps]).
        self.page_shape = (shape[0], 2, *shape[3:])
        # np.zeros asks the OS for zeroed pages lazily: an unused budget costs no RAM.
        self.data = np.zeros((self.capacity, *self.page_shape), cfg.dtype)
        self.scales = (np.ones((self.capacity, *self.page_shape[:-1]), np.float32)
                       if cfg.quantized else None)
        self.index = TierIndex(policy)
        self._free = list(range(self.capacity - 1, -1, -1))
        self.hits = self.stores = self.evictions = 0

    # ----------------------------------------------------------------- pages
    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self.index

    def load(self, page_hash: bytes, token_ids) -> tuple | None:
        """The page filed under ``page_hash`` holding ``token_ids``: ``(data [L, 2, Hkv,
        ps, D], scales or None)``, views valid until the next :meth:`store` (copy them
        first); None when it is not here."""
        e = self.index.get(page_hash, token_ids)
        if e is None:
            return None
        self.index.hit(e)
        self.hits += 1
        s = e.where
        return self.data[s], None if self.scales is None else self.scales[s]

    def store(self, page_hash: bytes, token_ids, data, scales, on_evict=None) -> bool:
        """Keep a copy of one page (``data`` [L, 2, Hkv, ps, D] as stored, ``scales``).

        When the pool is full the policy's victim goes first, through
        ``on_evict(hash, token_ids, data, scales)`` (views, valid during the call).
        False when the page is here already or the pool holds no page at all.
        """
        if self.capacity == 0 or page_hash in self.index:
            return False
        if not self._free:
            victim = self.index.pop_victim()
            self.evictions += 1
            s = victim.where
            if on_evict is not None:
                on_evict(victim.hash, victim.token_ids, self.data[s],
                         None if self.scales is None else self.scales[s])
            self._free.append(s)
        s = self._free.pop()
        self.data[s] = data
        if self.scales is not None:
            self.scales[s] = scales
        self.index.add(page_hash, token_ids, s)
        self.stores += 1
        return True

    def drop(self, page_hash: bytes) -> None:
        """Forget a page (its slot is free again)."""
        e = self.index.remove(page_hash)
        if e is not None:
            self._free.append(e.where)

    # ------------------------------------------------------------- reporting
    @property
    def num_pages(self) -> int:
        return len(self.index)

    def stats(self) -> dict:
        return {"pages": self.num_pages, "capacity_pages": self.capacity,
                "bytes": self.num_pages * self.bytes_per_page, "capacity_bytes": self.memory,
                "hits": self.hits, "stores": self.stores, "evictions": self.evictions,
                "faults": 0}

    def check_invariants(self) -> None:
        self.index.check_invariants()
        slots = [e.where for e in self.index.entries()]
        assert len(set(slots)) == len(slots), "two host pages share a slot"
        assert not set(slots) & set(self._free), "a held host slot is on the free list"
        assert len(slots) + len(self._free) == self.capacity, "host slots lost"
        assert self.num_pages * self.bytes_per_page <= self.memory, "host tier over budget"
