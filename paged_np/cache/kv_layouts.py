"""``kv_layout="k_transposed"``: K pages stored ``[head_dim, page_size]`` per kv head.

The arena's default layout ("hnd", FlashInfer's HND) stores a page of one kv
head as a ``[page_size, head_dim]`` tile, K and V alike: token ``t``'s key is
the contiguous row ``k[t, :]``. The score of a query against that page is a
dot product per token, and a dot product ends in a *horizontal* sum (the lanes
of a vector register added together), once per key.

vLLM's original key cache, ``[num_blocks, num_kv_heads, head_size/x,
block_size, x]``, transposes the K tile instead. With ``x = 1`` element, as
here, K is ``[head_dim, page_size]``: row ``d`` holds dimension ``d`` of the
page's ``page_size`` consecutive keys. A vector load then reads one dimension
of 16 keys (16 float32 keys of one page are one AVX-512 register), and the
scores of a whole page are ``head_dim`` broadcast multiply-adds::

    hnd:          s[t] = sum_d q[d] * k[t, d]     one horizontal sum per key
    k_transposed: s[:] += q[d] * kT[d, :]         for d in range(head_dim): no sum

V stays ``[page_size, head_dim]``: ``out = p @ v`` already walks V row by row.

The memory is still the arena's one array ``[L, 2, num_pages, Hkv, page_size,
head_dim]``; only the K half's bytes mean something else. :func:`k_view`
reinterprets them (a reshape of contiguous memory, never a copy), so
``arena.layer(i)`` hands the kernels ``k_pages [num_pages, Hkv, head_dim,
page_size]`` and ``v_pages [num_pages, Hkv, page_size, head_dim]``. Whole
pages (copy-on-write, swap-out, the tiers' stores) move as stored, whatever
their layout; token rows ``[n, L, 2, Hkv, D]`` (swap-in, the tiers' loads)
are scattered by :meth:`KTransposedArena.write_slots`, and
:func:`token_rows` reads them back out of stored pages. The 8-bit formats'
scales are per token, ``[.., page_size]``, in both layouts.

This module is the :data:`~paged_np.registry.KV_LAYOUTS` plug-in of the
layout: ``Arena(cfg)`` with ``cfg.kv_layout == "k_transposed"`` builds a
:class:`KTransposedArena`, and nothing imports this module otherwise.
"""

from __future__ import annotations

import numpy as np

from .arena import Arena

__all__ = ["KTransposedArena", "k_view", "token_rows"]


def k_view(k_half):
    """The K half of stored pages, ``[..., page_size, head_dim]`` in the arena's shape,
    as what its bytes hold in the k_transposed layout: ``[..., head_dim, page_size]``.

    A view (the last two axes of every arena, swap or tier array are contiguous),
    so writing into it writes the pages.
    """
    *lead, page_size, head_dim = k_half.shape
    view = k_half.reshape(*lead, head_dim, page_size)
    if not np.may_share_memory(view, k_half):     # never write into a copy
        raise AssertionError("k_view: the K pages' last two axes must be contiguous")
    return view


def token_rows(pages, page, offset, kv_layout: str):
    """Token rows ``[n, L, 2, Hkv, D]`` out of pages stored in ``kv_layout``.

    ``pages`` ``[L, 2, num_pages, Hkv, page_size, D]`` as an arena (or swap space)
    stores them; ``page``, ``offset`` (int [n], or one an int) say which token of
    which page. The rows :meth:`Arena.write_slots` takes, in either layout.
    """
    if kv_layout == "hnd":
        # Advanced indices on axes 2 and 4 with a slice between them put the indexed
        # axis first: [n, L, 2, Hkv, D].
        return pages[:, :, page, :, offset]
    k = k_view(pages[:, 0])[:, page, :, :, offset]       # [L, P, Hkv, D, ps] -> [n, L, Hkv, D]
    v = pages[:, 1][:, page, :, offset]                  # [L, P, Hkv, ps, D] -> [n, L, Hkv, D]
    return np.stack((k, v), axis=2)                      # [n, L, 2, Hkv, D]


class KTransposedArena(Arena):
    """The arena with K pages ``[head_dim, page_size]`` per kv head (see the module)."""

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``(k_pages [num_pages, Hkv, D, page_size], v_pages [num_pages, Hkv, page_size, D])``:
        views of one layer."""
        i = self.check_layer(layer)
        return k_view(self.data[i, 0]), self.data[i, 1]

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Scatter ``k, v`` ([n, Hkv, D]) into ``slots``: a token's key becomes column
        ``offset`` of its page's K tile, its value row ``offset`` of the V tile."""
        i = self.check_layer(layer)
        slots = self.check_slots(slots)
        for name, x in (("k", k), ("v", v)):
            self._check_kv(name, x, slots.shape[0])
        page, offset = slots // self.cfg.page_size, slots % self.cfg.page_size  # [n] each
        if self.scales is not None:  # 8-bit: codes stored as the layout says, scales per token
            from .kv_quant import quantize

            (k, k_scale), (v, v_scale) = quantize(k, self.kv_format), quantize(v, self.kv_format)
            self.scales[i, 0][page, :, offset] = k_scale                 # [n, Hkv]
            self.scales[i, 1][page, :, offset] = v_scale
        # Advanced indices on axes 0 and 3 (K) or 0 and 2 (V), a slice between them:
        # the indexed axis comes first, [n, Hkv, D], like k and v.
        k_view(self.data[i, 0])[page, :, :, offset] = k
        self.data[i, 1][page, :, offset, :] = v

    def write_slots(self, slots, rows: np.ndarray, scales: np.ndarray | None = None) -> None:
        """Store token rows exactly as given (``rows`` [n, L, 2, Hkv, D], ``scales``
        [n, L, 2, Hkv]): K transposed into its pages' columns, V as rows."""
        slots = self.check_slots(slots)
        ps = self.cfg.page_size
        k_pages, v_pages = k_view(self.data[:, 0]), self.data[:, 1]  # [L, P, Hkv, D|ps, ps|D]
        k_rows, v_rows = rows[:, :, 0], rows[:, :, 1]                # [n, L, Hkv, D] each
        if self._whole_pages(slots):        # whole pages (the tiers' loads): page by page
            n = len(slots) // ps
            pages = slots[::ps] // ps
            shape = (n, ps, *k_rows.shape[1:])                       # [k, ps, L, Hkv, D]
            k_pages[:, pages] = k_rows.reshape(shape).transpose(2, 0, 3, 4, 1)  # [L,k,Hkv,D,ps]
            v_pages[:, pages] = v_rows.reshape(shape).transpose(2, 0, 3, 1, 4)  # [L,k,Hkv,ps,D]
            if self.scales is not None:
                self.scales[:, :, pages] = scales.reshape(n, ps, *scales.shape[1:]).transpose(
                    2, 3, 0, 4, 1)
            return
        page, offset = slots // ps, slots % ps                       # [n] each
        # Advanced indices on two axes with slices between: [n, L, Hkv, D], like the rows.
        k_pages[:, page, :, :, offset] = k_rows
        v_pages[:, page, :, offset] = v_rows
        if self.scales is not None:
            self.scales[:, :, page, :, offset] = scales
