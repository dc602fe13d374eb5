"""The memory model: where every token's K/V lives and who may reuse it.

Read in this order:

1. :mod:`.arena` -- one preallocated NumPy array per layer, cut into pages;
2. :mod:`.prefix_index` -- what a prefix cache answers (match, insert, lock,
   evict), whatever its data structure;
3. :mod:`.eviction` -- the policies (LRU, FIFO, LFU): one priority method each;
4. :mod:`.hash_index` -- vLLM's page-hash chain, the default prefix index;
5. :mod:`.radix` (and :mod:`.radix_node`) -- SGLang's radix tree, the other
   one (``CacheConfig(prefix_cache="radix")``); :mod:`.indexes` picks between them;
6. :mod:`.page_pool` -- free pages and reference counts;
7. :mod:`.sequence` -- one sequence's block table and prefix handle;
8. :mod:`.kv_cache` -- :class:`PagedKVCache`, the public face of all of the
   above (with :mod:`.batch`, the metadata a kernel reads).

Nothing here imports the engine, the models, the simulation or the drawings:
the cache is the core the rest is built on.
"""

from .arena import Arena
from .batch import BatchMetadata
from .eviction import EvictionPolicy, FIFOPolicy, LFUPolicy, LRUPolicy, make_policy
from .hash_index import CachedPage, HashIndex, hash_page
from .kv_cache import Event, PagedKVCache
from .page_pool import PagePool
from .prefix_index import PrefixIndex, make_prefix_index
from .radix import RadixCache
from .radix_node import TreeNode
from .sequence import Sequence

__all__ = [
    "Arena", "BatchMetadata", "CachedPage", "Event", "EvictionPolicy", "FIFOPolicy",
    "HashIndex", "LFUPolicy", "LRUPolicy", "PagePool", "PagedKVCache", "PrefixIndex",
    "RadixCache", "Sequence", "TreeNode", "hash_page", "make_policy", "make_prefix_index",
]
