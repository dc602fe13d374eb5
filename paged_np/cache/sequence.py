"""One sequence's view of the cache: its tokens, block table and hash chain.

A ``Sequence`` is plain bookkeeping (vLLM's ``Request`` + ``KVCacheBlocks``):

- ``token_ids``: tokens whose KV is written in the cache;
- ``block_table``: logical page ``i`` -> page id, so token ``t`` lives in slot
  ``block_table[t // page_size] * page_size + t % page_size``;
- ``page_hashes``: the prefix hash of each *full* page, a chain in which every
  hash covers all the tokens before it;
- ``num_pending``: tokens given slots by ``allocate_slots`` but not yet
  appended (their KV is being written this step);
- with ``prefix_cache="radix"`` instead of ``page_hashes``: ``radix_node``,
  the tree node its full pages reach (the sequence holds a lock on the path
  from the root to it), and ``radix_pages``, how many full pages that path covers.

The hash chain is what makes prefix caching safe: two pages holding the same
16 tokens at different places in different prompts have different hashes,
because each hash also digests its parent's hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

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


@dataclass
class Sequence:
    """Bookkeeping of one sequence in a :class:`~paged_np.PagedKVCache`."""

    seq_id: object
    extra_key: bytes | None = None
    token_ids: list = field(default_factory=list)
    block_table: list = field(default_factory=list)
    page_hashes: list = field(default_factory=list)
    num_pending: int = 0
    radix_node: object = None
    radix_pages: int = 0

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is written."""
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Written tokens plus those of a pending ``allocate_slots``: what the kernel reads."""
        return len(self.token_ids) + self.num_pending

    def last_hash(self) -> bytes:
        return self.page_hashes[-1] if self.page_hashes else ROOT_HASH

    def copy(self, seq_id) -> Sequence:
        """A fork: same tokens, same pages (the caller takes the references)."""
        return Sequence(seq_id, self.extra_key, list(self.token_ids), list(self.block_table),
                        list(self.page_hashes), 0, self.radix_node, self.radix_pages)
