"""The memory model: where every token's K/V lives and who may reuse it.

Read in this order:

1. :mod:`.arena` -- one preallocated NumPy array per layer, cut into pages;
2. :mod:`.eviction` -- the policies (LRU, FIFO, LFU) that pick which cached page goes;
3. :mod:`.page_pool` -- free pages, reference counts and the prefix index;
4. :mod:`.sequence` -- one sequence's block table and its page-hash chain;
5. :mod:`.kv_cache` -- :class:`PagedKVCache`, the public face of all of the above;
6. :mod:`.radix` -- SGLang's radix tree, the alternative to the hash chain
   (``CacheConfig(prefix_cache="radix")``).

Nothing here imports the engine, the models, the simulation or the drawings:
the cache is the core the rest is built on.
"""

from .arena import Arena
from .eviction import EvictionPolicy, FIFOPolicy, LFUPolicy, LRUPolicy, make_policy
from .kv_cache import BatchMetadata, Event, PagedKVCache
from .page_pool import PagePool
from .radix import RadixCache, TreeNode
from .sequence import Sequence, hash_page

__all__ = [
    "Arena", "BatchMetadata", "Event", "EvictionPolicy", "FIFOPolicy", "LFUPolicy",
    "LRUPolicy", "PagePool", "PagedKVCache", "RadixCache", "Sequence", "TreeNode", "hash_page",
    "make_policy",
]
