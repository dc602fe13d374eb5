"""The memory model: where every token's K/V lives and who may reuse it.

Read in this order:

1. :mod:`.arena` -- one preallocated NumPy array per layer, cut into pages;
2. :mod:`.prefix_index` -- what a prefix cache answers (match, insert, lock,
   evict), whatever its data structure;
3. :mod:`.eviction` -- the policies (LRU, FIFO, LFU): one priority method each;
4. :mod:`.hash_index` -- vLLM's page-hash chain, the default prefix index;
5. :mod:`.radix` (and :mod:`.radix_node`) -- SGLang's radix tree, the other
   one (``CacheConfig(prefix_cache="radix")``), a plug-in loaded by name
   (:data:`paged_np.registry.PREFIX_INDEXES`);
6. :mod:`.page_pool` -- free pages and reference counts;
7. :mod:`.sequence` -- one sequence's block table and prefix handle;
8. :mod:`.kv_cache` -- :class:`PagedKVCache`, the public face of all of the
   above (with :mod:`.batch`, the metadata a kernel reads).

Nothing here imports the engine, the models, the simulation or the drawings:
the cache is the core the rest is built on.
"""

from ..lazy import lazy_exports

_EXPORTS = {
    "Arena": ".arena", "BatchMetadata": ".batch", "Event": ".events",
    "EvictionPolicy": ".eviction", "FIFOPolicy": ".eviction", "LFUPolicy": ".eviction",
    "LRUPolicy": ".eviction", "make_policy": ".eviction",
    "CachedPage": ".hash_index", "HashIndex": ".hash_index", "hash_page": ".hash_index",
    "make_prefix_index": ".prefix_index", "PrefixIndex": ".prefix_index",
    "PagedKVCache": ".kv_cache", "PagePool": ".page_pool",
    "RadixIndex": ".radix", "RadixCache": ".radix",
    "TreeNode": ".radix_node", "Sequence": ".sequence",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
