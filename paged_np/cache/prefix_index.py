"""PrefixIndex: what a prefix cache must answer, whatever its data structure.

Two data structures find the cached prefix of a prompt:

- the hash chain (:class:`~paged_np.cache.hash_index.HashIndex`, vLLM): every
  full page is filed under a hash of all the tokens up to its end;
- the radix tree (:class:`~paged_np.cache.radix.RadixIndex`, SGLang): a trie
  whose edges carry whole runs of tokens.

Both implement this one interface (SGLang's ``BasePrefixCache`` idea), so the
page pool and :class:`~paged_np.PagedKVCache` never ask which one they hold;
:func:`make_prefix_index` is the only place that reads ``CacheConfig.prefix_cache``
(a name of :data:`paged_np.registry.PREFIX_INDEXES`, where a third index is registered).

Who owns what: the index knows which pages hold which tokens and which of
them may be evicted; the page pool (:mod:`.page_pool`) owns the reference
counts and the free list, and asks the index for a victim when nothing is
free. A live sequence keeps the opaque *handle* that :meth:`match_prefix`
and :meth:`insert` return (a list of page hashes, or a tree node) and hands it
back to :meth:`insert`, :meth:`lock` and :meth:`unlock`.

The operations, one method each, with the same names in both indexes:

==========================  ===================================================
``match_prefix``            longest cached prefix of a prompt: ``(pages, handle)``
``prefix_length``           the same length, changing nothing (for schedulers)
``insert``                  a sequence's newly full pages join the index
``lock`` / ``unlock``       a live sequence uses the prefix behind a handle
``evict``                   give up ``n`` evictable pages, policy order
``num_evictable``           pages :meth:`evict` could give up now
``holds`` / ``pages``       whether / which pages the index holds
``eviction_order``          evictable pages, next victim first (for drawings)
``mark_used``               a CACHED page counts as just used
``page_idle``               the pool dropped a held page's last reference
``page_reused``             a prefix hit took an idle page back into use
``stats``                   counters for ``cache.stats()``
``check_invariants``        the index alone, or against the pool's ref counts
``check_sequences``         live sequences' handles agree with the index
``walk``                    the index as a tree of :class:`IndexNode` (for views)
``page_key``                a held page's name in every process (for the tiers)
==========================  ===================================================

Events: each index records its own (``hash``/``insert`` when a page joins,
``evict`` when one leaves) through ``listener(kind, page_id, seq_id)``, with
the sequence that caused it passed in explicitly. ``evict`` is recorded while
the page is still held and its K/V still there, so a listener may ask its
:meth:`~PrefixIndex.page_key` and copy it out (the tiers below the arena do).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from ..registry import PREFIX_INDEXES


class PrefixIndex(ABC):
    """The interface between the page pool / cache and a prefix cache's data structure."""

    #: ``"hash"`` or ``"radix"``: what ``cache.stats()["prefix_cache"]`` reports.
    kind = "base"
    #: Why this index cannot serve a sliding-window model, or "" when it can. A window
    #: releases a live sequence's oldest pages; an index must be able to let them go.
    no_sliding_window = ""

    def __init__(self, page_size: int, policy):
        from .eviction import make_policy

        self.page_size = page_size
        self.policy = make_policy(policy)
        #: Called as ``listener(kind, page_id, seq_id)`` for every event the index records.
        self.listener: Callable[[str, int, object], None] | None = None

    # ------------------------------------------------------------ prefixes
    @abstractmethod
    def match_prefix(self, token_ids, extra_key: bytes | None = None):
        """Longest cached prefix of ``token_ids`` in whole pages: ``(pages, handle)``.

        Counts a hit on every entry matched. Takes no reference and no lock:
        the caller takes them (``pool.touch`` per page, :meth:`lock` on handle).
        """

    @abstractmethod
    def prefix_length(self, token_ids, extra_key: bytes | None = None, memo=None) -> int:
        """Tokens :meth:`match_prefix` would match, changing nothing in the index.

        ``memo`` is an optional dict kept per request between calls; an index may
        keep work there (the hash chain keeps the prompt's page hashes), so a
        scheduler asking every step about a prompt that only grows pays once.
        """

    @abstractmethod
    def insert(self, token_ids, pages, handle, extra_key: bytes | None = None, seq_id=None):
        """Index full pages ``pages`` holding ``token_ids`` right after ``handle``'s prefix.

        Returns ``(handle, added)``: the handle of the longer prefix and the pages
        the index took (a page whose tokens it already holds stays private).
        """

    @abstractmethod
    def lock(self, handle) -> None:
        """A live sequence now uses the prefix behind ``handle``: never evict it."""

    @abstractmethod
    def unlock(self, handle) -> None:
        """A live sequence no longer uses the prefix behind ``handle``."""

    # --------------------------------------------------------------- pages
    @abstractmethod
    def holds(self, page: int) -> bool:
        """Whether the index holds this page (CACHED when no sequence does)."""

    @abstractmethod
    def pages(self) -> list[int]:
        """Every page the index holds, ascending."""

    @abstractmethod
    def page_idle(self, page: int) -> None:
        """The pool dropped the last reference to a page the index holds."""

    @abstractmethod
    def page_reused(self, page: int) -> None:
        """A prefix hit took an idle page back into use."""

    @abstractmethod
    def mark_used(self, page: int) -> None:
        """A CACHED page counts as just used (LRU moves it to the young end)."""

    @abstractmethod
    def evict(self, num_pages: int, seq_id=None) -> list[int]:
        """Drop up to ``num_pages`` evictable pages in the policy's order; return them."""

    @property
    @abstractmethod
    def num_evictable(self) -> int:
        """Pages :meth:`evict` could give up now."""

    @abstractmethod
    def eviction_order(self) -> list[int]:
        """Evictable pages in the order :meth:`evict` takes them. O(n log n): for drawings."""

    # ----------------------------------------------------------- reporting
    @abstractmethod
    def stats(self) -> dict:
        """Counters merged into ``cache.stats()`` (``indexed_pages`` and index-specific ones)."""

    @abstractmethod
    def check_invariants(self, pool=None) -> None:
        """Raise AssertionError naming the first broken invariant; with ``pool``,
        also check the index against its reference counts."""

    @abstractmethod
    def check_sequences(self, seqs) -> None:
        """Check live sequences (:class:`~paged_np.cache.sequence.Sequence`) against the index."""

    def _emit(self, kind: str, page: int, seq_id) -> None:
        if self.listener is not None:
            self.listener(kind, page, seq_id)

    def walk(self) -> list[IndexNode] | None:
        """The index as a tree, for views and drawings: one :class:`IndexNode` per node
        below a root, parents before children (copies: changing them changes nothing).

        None when the index keeps no tree (the default, and the hash chain's answer);
        ``[]`` for a tree with nothing cached yet. O(nodes).
        """
        return None

    def page_key(self, page: int) -> tuple[bytes, tuple] | None:
        """``(hash, token_ids)`` of a held page: the name of its contents in every process
        (the SHA-256 chain of its prefix, :func:`~paged_np.cache.hash_index.chain_hash`)
        and its own tokens. The tiers below the arena (:mod:`paged_np.cache.tiers`) file
        a page under it. None: not held, or an index that cannot say (then its pages
        are never kept below the arena)."""
        return None


@dataclass(frozen=True)
class IndexNode:
    """One node of a prefix index's tree, as :meth:`PrefixIndex.walk` reports it.

    ``id``: the node's name for its life (creation order); ``parent``: its
    parent's id, None right below a root; ``tokens``: the run on the edge from
    the parent; ``pages``: the page ids holding that run, in order;
    ``lock_ref``: live sequences whose path passes through it (0: evictable).
    """

    id: int
    parent: int | None
    tokens: tuple
    pages: tuple
    lock_ref: int

def make_prefix_index(cfg) -> PrefixIndex:
    """A fresh index of the class ``cfg.prefix_cache`` names, ranked by ``cfg.eviction_policy``.

    ``"hash"``: vLLM's page-hash chain; ``"radix"``: SGLang's radix tree; or
    any class registered in :data:`~paged_np.registry.PREFIX_INDEXES`
    (imported only when chosen).
    """
    return PREFIX_INDEXES.load(cfg.prefix_cache)(cfg.page_size, cfg.eviction_policy)
