"""One sequence's view of the cache: its tokens, block table and prefix handle.

A ``Sequence`` is plain bookkeeping (vLLM's ``Request`` + ``KVCacheBlocks``):

- ``token_ids``: tokens whose KV is written in the cache;
- ``block_table``: logical page ``i`` -> page id, so token ``t`` lives in slot
  ``block_table[t // page_size] * page_size + t % page_size``;
- ``num_pending``: tokens given slots by ``allocate_slots`` but not yet
  appended (their KV is being written this step);
- ``prefix_handle``: what the prefix index (:mod:`.prefix_index`) returned for
  this sequence's full pages, opaque to the cache: the hash chain of those
  pages (:mod:`.hash_index`), or the radix tree node their path reaches
  (:mod:`.radix`), whose path the sequence keeps locked;
- ``num_indexed_pages``: how many full pages the index has been shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sequence:
    """Bookkeeping of one sequence in a :class:`~paged_np.PagedKVCache`."""

    seq_id: object
    extra_key: bytes | None = None
    token_ids: list = field(default_factory=list)
    block_table: list = field(default_factory=list)
    num_pending: int = 0
    prefix_handle: object = None
    num_indexed_pages: int = 0

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is written."""
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Written tokens plus those of a pending ``allocate_slots``: what the kernel reads."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_released_pages(self) -> int:
        """-1 entries of the block table (pages given back by a sliding window): one run,
        at the start or right after the attention sinks' pages."""
        return self.block_table.count(-1)

    def held_pages(self) -> list:
        """The page ids the sequence holds (its block table without the released -1s)."""
        bt = self.block_table
        return [p for p in bt if p >= 0] if -1 in bt else list(bt)

    def copy(self, seq_id) -> Sequence:
        """A fork: same tokens, same pages, same handle (the caller takes the references
        and the lock; an index never changes a handle in place, so sharing it is safe)."""
        return Sequence(seq_id, self.extra_key, list(self.token_ids), list(self.block_table),
                        0, self.prefix_handle, self.num_indexed_pages)


def slots_of(block_table: list, start: int, n: int, page_size: int) -> np.ndarray:
    """Slots (int64 [n]) of positions ``[start, start + n)`` under ``block_table``."""
    bt, ps = block_table, page_size
    if n <= 8:  # decode: a few tokens, where plain Python beats NumPy's call overhead
        return np.array([bt[t // ps] * ps + t % ps for t in range(start, start + n)],
                        dtype=np.int64)
    pos = np.arange(start, start + n, dtype=np.int64)  # [n] token positions
    pages = np.asarray(bt, dtype=np.int64)[pos // ps]  # [n] page ids
    return pages * ps + pos % ps  # [n] slots
