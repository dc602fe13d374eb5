"""Eviction policies: which cached entry gives up its pages first.

A page is CACHED when no sequence holds it any more (``ref_count == 0``) but
its K/V is full and indexed, so a later prompt with the same prefix can reuse
it. When an allocation finds no FREE page, the pool asks the prefix index for a
victim, and the index asks the policy which of its *evictable entries* goes:

- the hash chain (:mod:`.hash_index`): an entry is one CACHED page;
- the radix tree (:mod:`.radix`): an entry is one unlocked leaf, which gives
  its pages from its end.

As in SGLang, a policy is one method: :meth:`EvictionPolicy.priority` maps an
entry to a sortable key, and the entry with the *smallest* key is evicted
first. Every entry exposes three stamps, all read from its index's one
monotonic counter (a logical clock, not wall time):

==================  ==========================================================
``last_access_time``  the last time it was released, matched or marked used
``hit_count``         prefix hits that reused it since its contents were made
``creation_time``     when its contents entered the cache (hash chain: the
                      first time the page became CACHED; tree: when the node
                      was inserted)
==================  ==========================================================

So the three classic policies are three one-line subclasses, and a fourth is
a fifth line::

    class MRUPolicy(pnp.EvictionPolicy):        # most recently used goes first
        name = "mru"
        def priority(self, entry):
            return -entry.last_access_time

    pnp.CacheConfig(num_pages=64, eviction_policy=MRUPolicy)   # hash or radix
    pnp.registry.EVICTION_POLICIES.register("mru", MRUPolicy)  # or by name, everywhere

A policy holds no state: the index keeps its evictable entries in a binary
min-heap of ``(priority, ...)`` with *lazy deletion* (an entry that was hit,
locked or re-stamped since it was pushed is skipped when it surfaces and
pushed again with its new key when it changes). Every operation is
O(log n) in the number of evictable entries; nothing scans all pages. The
priority must be a pure function of the entry's stamps: the heap re-computes
it to tell a live entry from a stale one.

vLLM uses LRU (its ``FreeKVCacheBlockQueue`` is a doubly-linked list, O(1);
our heap costs a log factor for the generality). SGLang's radix cache uses LRU
by default and offers LFU and FIFO the same way as here. FIFO and LFU are here
for comparison in the notebooks and ``python -m paged_np simulate``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class EvictionPolicy(ABC):
    """One priority method: the entry with the smallest key is evicted first.

    ``name`` is what ``PagePool.eviction_policy`` reports. An object of a policy
    can be shared by several caches: it keeps no state.
    """

    name = "base"

    @abstractmethod
    def priority(self, entry):
        """A sortable key for an evictable entry (smallest goes first).

        ``entry`` has ``last_access_time``, ``hit_count`` and ``creation_time``
        (ints from one logical clock). Keep it a pure function of those.
        """


class LRUPolicy(EvictionPolicy):
    """Least recently used: the entry released (or marked used) longest ago goes first."""

    name = "lru"

    def priority(self, entry):
        return entry.last_access_time


class FIFOPolicy(EvictionPolicy):
    """First in, first out: by the time the contents entered the cache.

    A hit does not refresh an entry: released again, it keeps its place in
    line. The stamp dies with the contents (on eviction), so a reused page
    starts a new life.
    """

    name = "fifo"

    def priority(self, entry):
        return entry.creation_time


class LFUPolicy(EvictionPolicy):
    """Least frequently used: fewest prefix hits first, ties broken by recency (LRU)."""

    name = "lfu"

    def priority(self, entry):
        return (entry.hit_count, entry.last_access_time)


def make_policy(policy) -> EvictionPolicy:
    """Return the policy object an index uses.

    ``policy`` is a name of :data:`paged_np.registry.EVICTION_POLICIES` (``"lru"``,
    ``"fifo"``, ``"lfu"`` or one registered from outside), a subclass of
    :class:`EvictionPolicy` (a fresh object of it is made) or an
    :class:`EvictionPolicy` object (used as it is).
    """
    from ..registry import EVICTION_POLICIES

    if isinstance(policy, EvictionPolicy):
        return policy
    if isinstance(policy, str):
        policy = EVICTION_POLICIES.load(policy)      # a name it does not know: refused
    if isinstance(policy, type) and issubclass(policy, EvictionPolicy):
        return policy()
    from ..errors import InvalidArgument

    raise InvalidArgument(f"eviction_policy must be one of {EVICTION_POLICIES.names()} or an "
                          f"EvictionPolicy subclass or object, got {policy!r}")
