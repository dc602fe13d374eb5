"""BatchMetadata: the block tables and lengths a kernel needs for one batch.

``PagedKVCache.batch(seq_ids)`` builds it once per step; the attention
backends read it, in our padded layout or FlashInfer's CSR one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class BatchMetadata:
    """What a kernel needs for a batch of sequences.

    ``block_tables`` is int32 [B, max_pages], padded with -1; ``seq_lens`` is
    int32 [B] (written tokens plus any pending ``allocate_slots``).
    """

    seq_ids: list
    block_tables: np.ndarray
    seq_lens: np.ndarray
    page_size: int

    @classmethod
    def of(cls, seq_ids: list, seqs: list, page_size: int) -> BatchMetadata:
        """The batch of these :class:`~paged_np.cache.sequence.Sequence` objects: their
        block tables side by side, -1 past each one's end, and their seq_lens."""
        width = max((len(s.block_table) for s in seqs), default=0)
        tables = np.full((len(seqs), width), -1, dtype=np.int32)       # [B, max_pages]
        for b, s in enumerate(seqs):
            tables[b, :len(s.block_table)] = s.block_table
        lens = np.array([s.seq_len for s in seqs], dtype=np.int32)     # [B]
        return cls(seq_ids, tables, lens, page_size)

    def to_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FlashInfer's layout: ``kv_indptr`` int32 [B+1], ``kv_indices`` int32 [nnz],
        ``kv_last_page_len`` int32 [B].

        Sequence ``b``'s pages are ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
        (only the pages its ``seq_len`` reaches); its last page holds
        ``kv_last_page_len[b]`` tokens (0 for an empty sequence).
        """
        ps = self.page_size
        n_pages = (self.seq_lens.astype(np.int64) + ps - 1) // ps  # [B]
        indptr = np.zeros(len(self.seq_lens) + 1, dtype=np.int32)
        np.cumsum(n_pages, out=indptr[1:])
        cols = np.arange(self.block_tables.shape[1])  # [max_pages]
        indices = self.block_tables[cols[None, :] < n_pages[:, None]]  # row-major: in order
        last = np.where(self.seq_lens > 0, (self.seq_lens - 1) % ps + 1, 0).astype(np.int32)
        return indptr, indices.astype(np.int32), last
