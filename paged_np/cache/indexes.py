"""The one place that picks a prefix index from ``CacheConfig.prefix_cache``.

Everything else (the page pool, :class:`~paged_np.PagedKVCache`, the engine)
talks to the :class:`~paged_np.cache.prefix_index.PrefixIndex` interface and
never asks which index it holds.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from .hash_index import HashIndex
from .prefix_index import PrefixIndex
from .radix import RadixCache

#: ``CacheConfig.prefix_cache`` name -> index class. A third index is one line here.
PREFIX_INDEXES: dict[str, type[PrefixIndex]] = {"hash": HashIndex, "radix": RadixCache}


def make_prefix_index(cfg) -> PrefixIndex:
    """The prefix index ``cfg`` asks for, with ``cfg.eviction_policy`` ranking its entries.

    ``"hash"``: vLLM's page-hash chain (:class:`HashIndex`); ``"radix"``:
    SGLang's radix tree (:class:`RadixCache`). Each call makes a fresh index.
    """
    cls = PREFIX_INDEXES.get(cfg.prefix_cache)
    if cls is None:
        raise InvalidArgument(
            f"prefix_cache must be one of {tuple(PREFIX_INDEXES)}, got {cfg.prefix_cache!r}")
    return cls(cfg.page_size, cfg.eviction_policy)
