"""Host swap space for preempted sequences (vLLM's CPU swap space).

With ``preemption_mode="swap"`` the scheduler copies a victim's pages here
before freeing them, and copies them back when the victim is admitted again
(pages still found in the cache by prefix are not even copied). The scheduler
asks the cache for room first (``can_allocate``), so :meth:`SwapArena.swap_in`
runs only when the pages are there.

The bytes move as they are, through the cache's page API
(``cache.read_pages`` out, ``cache.write_slots`` back): with an 8-bit
``kv_cache_dtype`` the codes and their scales go out and come back together,
so a swapped sequence reads exactly what it wrote (nothing is quantized twice).
Pages go out as stored, in the cache's ``kv_layout``, and come back as token rows
(:func:`paged_np.cache.kv_layouts.token_rows` reads them in either layout).
It is the ``"swap"`` entry of :data:`paged_np.registry.PREEMPTION_MODES`,
loaded only when that mode is chosen.
"""

from __future__ import annotations

import numpy as np

from ..cache.kv_layouts import token_rows


class SwapArena:
    """Host memory for preempted sequences' pages.

    Same layout as the cache's arena, ``[num_layers, 2, swap_pages, Hkv,
    page_size, D]``, with its own free list.
    """

    def __init__(self, cache, num_pages: int):
        shape = list(cache.cfg.arena_shape)
        shape[2] = num_pages
        self.data = np.zeros(shape, dtype=cache.cfg.dtype)
        # The scales of 8-bit pages, [num_layers, 2, swap_pages, Hkv, page_size], or None.
        self.scales = np.ones(shape[:-1], np.float32) if cache.cfg.quantized else None
        self.page_size = cache.page_size
        self.kv_layout = cache.cfg.kv_layout
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def num_pages(self) -> int:
        return self.data.shape[2]

    @property
    def num_free(self) -> int:
        return len(self._free)

    def swap_out(self, cache, req) -> list | None:
        """Copy the pages of ``req``'s computed tokens to the host; None if no room."""
        n_pages = -(-req.num_computed_tokens // self.page_size)
        pages = cache.block_table(req.seq_id)[:n_pages]             # [n_pages] page ids
        if n_pages > len(self._free) or (pages < 0).any():
            return None
        host = [self._free.pop() for _ in range(n_pages)]
        data, scales = cache.read_pages(pages)              # [L, 2, n, Hkv, ps, (D)] copies
        self.data[:, :, host] = data                        # every layer, K and V
        if self.scales is not None:
            self.scales[:, :, host] = scales                # and their scales
        return host

    def swap_in(self, cache, req, start: int) -> None:
        """Write positions ``[start, num_swapped_tokens)`` back into the cache.

        The caller has checked ``cache.can_allocate`` for these tokens.
        """
        end = req.num_swapped_tokens
        slots = cache.allocate_slots(req.seq_id, end - start)       # [n] int64
        pos = np.arange(start, end)                                 # [n] positions
        host = np.asarray(req.swap_pages)[pos // self.page_size]    # [n] host pages
        off = pos % self.page_size                                  # [n]
        # Every layer, K and V, in one copy: the rows index as [n, L, 2, Hkv, (D)].
        scales = None if self.scales is None else self.scales[:, :, host, :, off]
        cache.write_slots(slots, token_rows(self.data, host, off, self.kv_layout), scales)
        cache.append_tokens(req.seq_id, req.tokens(start, end))

    def release(self, req) -> None:
        """Give ``req``'s host pages back to the free list."""
        self._free.extend(req.swap_pages or ())
        req.swap_pages = None
        req.num_swapped_tokens = 0
