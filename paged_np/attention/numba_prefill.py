"""Long prefill chunks: two BLAS matrix products around a Numba softmax.

Decode is limited by memory, prefill by arithmetic. A prompt of ``T`` tokens
costs ``4 * num_heads * head_dim * T**2 / 2`` floating point operations, and
on a CPU only a BLAS-class matrix product (register-blocked, cache-tiled,
hand-written assembly: OpenBLAS behind NumPy's ``@``) runs that at a good
fraction of the peak. The hand-written loops of
:mod:`paged_np.attention.numba_kernels` reach about a third of it. So for a
long chunk of queries this module does, per (kv head, tile of query positions):

1. **Gather once.** Copy the sequence's K and V pages of that kv head into a
   contiguous ``[n_keys, head_dim]`` float32 buffer (the only place paged_np
   copies the cache: prefill does ``O(T)`` work per key, so the ``O(1)``
   copy is cheap; decode never does this).
2. ``S = Q @ K.T`` with BLAS: ``[rows, n_keys]``, where the ``rows`` are the
   tile's queries times the ``G`` query heads that share the kv head (GQA),
   and the keys stop at the tile's last position (causal).
3. :func:`_masked_softmax` (Numba, parallel over rows): each row keeps its
   visible keys (causal, sliding window), ``P = 2**(S - max)``, and its sum.
4. ``O = P @ V`` with BLAS, then divide by the sums.

This is the textbook, non-streaming attention, tile by tile: the tile's ``S``
exists in full (``Q_TILE * G * n_keys`` floats, a few MiB), which is why it
runs only in prefill, where memory ``O(chunk)`` is allowed. The causal mask
wastes the upper triangle of the last ``Q_TILE`` keys of each tile (about
``Q_TILE / T`` of the work). BLAS and Numba take turns on the cores: never at
the same time.

Simplified compared with FlashAttention on a GPU: no fusion of the three
steps (S goes through the cache), no skipping of fully masked key blocks
inside a tile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..config import JIT_PARALLEL_OPTIONS
from .numba_kernels import EMPTY, LN2, LOG2E, exp2

#: Query positions per tile (times G rows): big enough for BLAS to run near
#: its peak, small enough that ``S`` stays in the last-level cache.
Q_TILE = 256


@njit(**JIT_PARALLEL_OPTIONS)
def _masked_softmax(s, first_pos, G, key0, window, m, l):
    """In place: ``s[r] -> 2**(s[r] - m[r])`` on the keys row ``r`` sees, 0 elsewhere.

    ``s`` ``[rows, n]`` holds scores in log2 units of keys ``key0 ..
    key0+n-1``; row ``r`` is query ``first_pos + r // G``. It sees keys ``j``
    with ``j <= pos`` and (``window == 0`` or ``j > pos - window``): one
    contiguous run of columns ``[c_lo, c_hi)``. Writes each row's max ``m``
    and sum of weights ``l``.
    """
    rows, n = s.shape
    for r in prange(rows):
        pos = first_pos + r // G
        c_hi = min(n, pos - key0 + 1)
        c_lo = max(0, pos - window + 1 - key0) if window > 0 else 0
        mx = EMPTY
        for c in range(c_lo, c_hi):
            mx = max(mx, s[r, c])
        total = np.float32(0.0)
        for c in range(c_lo, c_hi):
            p = exp2(s[r, c] - mx)
            s[r, c] = p
            total += p
        s[r, :c_lo] = 0.0  # invisible keys weigh nothing
        s[r, max(c_lo, c_hi):] = 0.0
        m[r], l[r] = mx, total


def attend_sequence(q, k_pages, v_pages, bt_row, seq_len, t0, n_q, scale, window, out, lse):
    """All heads of queries ``q[t0:t0+n_q]``, the last ``n_q`` positions of one sequence.

    ``k_pages``/``v_pages``: float32 or float16 ``[num_pages, num_kv_heads,
    page_size, head_dim]``; ``bt_row``: the sequence's block table row.
    Writes ``out[t0:t0+n_q]`` ``[n_q, H, D]`` and ``lse[t0:t0+n_q]`` (natural log).
    """
    H, D = q.shape[1], q.shape[2]
    num_kv_heads, P = k_pages.shape[1], k_pages.shape[2]
    G = H // num_kv_heads
    first_pos = seq_len - n_q  # position of query t0
    lo0 = max(0, first_pos - window + 1) if window > 0 else 0  # first key any query sees
    page_lo, page_hi = lo0 // P, -(-seq_len // P)
    base = page_lo * P  # position of the gathered buffer's first key
    pages = bt_row[page_lo:page_hi]
    qs = np.float32(scale) * LOG2E  # scores in log2 units, as in the kernel
    for kvh in range(num_kv_heads):
        heads = slice(kvh * G, (kvh + 1) * G)
        kc = k_pages[pages, kvh].reshape(-1, D).astype(np.float32, copy=False)  # [n_keys, D]
        vc = v_pages[pages, kvh].reshape(-1, D).astype(np.float32, copy=False)
        for i0 in range(0, n_q, Q_TILE):
            i1 = min(n_q, i0 + Q_TILE)
            p0, p1 = first_pos + i0, first_pos + i1 - 1  # positions of the tile's queries
            lo = max(0, p0 - window + 1) if window > 0 else 0
            keys = slice(lo - base, p1 + 1 - base)  # [lo, p1] in buffer rows
            qt = (q[t0 + i0:t0 + i1, heads] * qs).reshape(-1, D)  # [(i1-i0) * G, D]
            s = qt @ kc[keys].T  # [rows, n_keys]   (BLAS)
            m = np.empty(s.shape[0], np.float32)
            l = np.empty(s.shape[0], np.float32)
            _masked_softmax(s, p0, G, lo, window, m, l)
            o = s @ vc[keys]  # [rows, D]   (BLAS)
            o /= l[:, None]
            out[t0 + i0:t0 + i1, heads] = o.reshape(i1 - i0, G, D)
            lse[t0 + i0:t0 + i1, heads] = ((m + np.log2(l)) * LN2).reshape(i1 - i0, G)
