"""Long prefill chunks: two BLAS matrix products around a Numba softmax.

Decode is limited by memory, prefill by arithmetic. A prompt of ``T`` tokens
costs ``4 * num_heads * head_dim * T**2 / 2`` floating point operations, and
on a CPU only a BLAS-class matrix product (register-blocked, cache-tiled,
hand-written assembly: OpenBLAS behind NumPy's ``@``) runs that at a good
fraction of the peak. The hand-written loops of
:mod:`paged_np.attention.numba_kernels` reach about a third of it. So for a
long chunk of queries this module does, per (kv head, tile of query positions):

1. **Gather once.** Copy the sequence's K and V pages of that kv head into
   contiguous float32 buffers, V ``[n_keys, head_dim]`` and K as ``K.T``
   ``[head_dim, n_keys]`` (the only place paged_np copies the cache: prefill
   does ``O(T)`` work per key, so the ``O(1)`` copy is cheap; decode never does
   this). With ``kv_layout="k_transposed"`` the K pages already hold ``K.T``
   per page, gathered as they are (:func:`_gather_k`).
2. Then, for each block of ``K_TILE`` keys (FlashAttention-2's loop order: a
   tile of queries stays put while the key blocks stream past it):
   ``S = Q @ K.T`` with BLAS, ``[rows, K_TILE]``, where the ``rows`` are the
   tile's queries times the ``G`` query heads that share the kv head (GQA);
   the keys stop at the tile's last position (causal).
3. The block's softmax: :func:`_mask_invisible` marks the keys each row may
   not see (causal, sliding window; only blocks that hold some), NumPy finds
   each row's max, and :func:`_exp2_rows` (Numba, one thread) turns ``S`` into
   ``P = 2**(S - max)`` in place and sums each row.
4. ``O = O * alpha + P @ V`` with BLAS (:class:`_State`: ``alpha`` shrinks what
   earlier blocks summed when a row's max grows, as in the decode kernel's
   online softmax); after the last block, divide by the sums.

Blocks of 512 keys (``S`` of 1 MiB at G = 4, in L2 between the products)
measured slower than a tile's whole row at 2048 tokens on the bench machine
(0.60x against 0.69x of SDPA, ``benchmarks/prefill_tiles.md``): BLAS runs
long products best. So a block is ``K_TILE = 4096`` keys, which leaves
prompts up to 4K tokens as one block per tile and bounds ``S`` past that. The causal mask
wastes the upper triangle of the last ``Q_TILE`` keys of each tile (about
``Q_TILE / T`` more work than the exact causal half: 6% at 2048 tokens). BLAS and Numba take
turns on the cores, never at the same time.

**Memory: the one place a step allocates with the context.** Per call this
path holds one kv head's gathered K and V (``n_keys * head_dim`` floats
each), against the rule that no step allocates memory growing with the
context, and ``S`` of one key block, which does not grow: for the last
128-query chunk of a 32K-token prompt on a Llama-3-8B-like layer (G = 4,
head_dim 128) the measured peak is 56.8 MiB (112.5 MiB when ``S`` held a
tile's every key). ``benchmarks/prefill_memory.py`` states the bound and
measures it (``benchmarks/prefill_memory.md``); tests/test_prefill_memory.py
checks it.

Simplified compared with FlashAttention on a GPU: no fusion of the three
steps (S goes through the cache between them).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import JIT_OPTIONS
from .numba_kernels import EMPTY, LN2, LOG2E, MASKED, exp2
from .numpy_paged import to_float32

#: Query positions per tile (times G rows): big enough for BLAS to run near its peak.
Q_TILE = 128
#: Keys per block of a tile. Measured (``benchmarks/prefill_tiles.md``), blocks small
#: enough for ``S`` to stay in L2 (512: 1 MiB at G = 4) ran slower than one block per
#: tile up to this many keys (BLAS likes long products); past it the block bounds ``S``.
K_TILE = 4096


@njit(**JIT_OPTIONS)
def _mask_invisible(s, first_pos, G, key0, window):
    """Set ``s[r, c] = MASKED`` where row ``r`` cannot see key ``key0 + c``.

    ``s`` ``[rows, n]``: row ``r`` is query ``first_pos + r // G``; it sees
    keys ``j`` with ``j <= pos`` and (``window == 0`` or ``j > pos - window``),
    one run of columns ``[c_lo, c_hi)``. Only the band outside it is touched.
    """
    rows, n = s.shape
    for r in range(rows):
        pos = first_pos + r // G
        c_lo = max(0, pos - window + 1 - key0) if window > 0 else 0
        s[r, :c_lo] = MASKED
        s[r, max(c_lo, pos - key0 + 1):] = MASKED


@njit(**JIT_OPTIONS)
def _exp2_rows(s, m, l):
    """In place ``s[r] = 2**(s[r] - m[r])`` (masked scores become exactly 0); ``l`` = row sums.

    LLVM vectorises this loop (16 ``exp2`` per AVX-512 pass: 0.15 ns per
    score); the row max ``m`` comes from NumPy's ``max``, because a max
    reduction does not vectorise in Numba (0.5 ns per element against
    NumPy's 0.08). Serial on purpose: right after a BLAS call OpenBLAS's
    threads still spin on the cores, and a parallel loop here measured 30x
    slower than this one.
    """
    rows, n = s.shape
    for r in range(rows):
        mr = m[r]
        total = np.float32(0.0)
        for c in range(n):
            p = exp2(s[r, c] - mr)
            s[r, c] = p
            total += p
        l[r] = total


def _sink_scores(qs, ksk, out, first_pos, G, window):
    """``out[r, j] = qs[r] . ksk[j]``, masked where sink ``j`` is in row ``r``'s window
    (the window's columns score it): ``[rows, sinks]``."""
    np.matmul(qs, ksk.T, out=out)
    pos = first_pos + np.arange(out.shape[0]) // G  # [rows] each row's query position
    out[np.arange(out.shape[1])[None, :] > (pos - window)[:, None]] = MASKED


def _gather_k(k_pages, pages, kvh, scales, kv_layout):
    """``K.T`` of kv head ``kvh`` over ``pages`` (int [n]): float32 ``[head_dim, n * page_size]``.

    hnd pages gather as ``[n_keys, D]`` rows and return their transpose (a view);
    k_transposed pages already are ``[D, page_size]`` tiles: gathered straight into
    ``[D, n, page_size]`` (one copy), the matrix product's operand as it is.
    """
    if kv_layout == "hnd":
        D = k_pages.shape[3]
        return to_float32(k_pages[pages, kvh], scales).reshape(-1, D).T    # [D, n_keys] view
    D = k_pages.shape[2]
    kt = k_pages[pages[None, :], kvh, np.arange(D)[:, None]]             # [D, n, ps] codes
    if scales is not None:  # 8-bit: the scales are per token, [n, ps]
        return to_float32(kt.transpose(1, 2, 0), scales).transpose(2, 0, 1).reshape(D, -1)
    return to_float32(kt, None).reshape(D, -1)                            # [D, n_keys]


def attend_sequence(q, k_pages, v_pages, bt_row, seq_len, t0, n_q, scale, window, out, lse,
                    k_scales=None, v_scales=None, sinks=0, q_sinks=None, kv_layout="hnd"):
    """All heads of queries ``q[t0:t0+n_q]``, the last ``n_q`` positions of one sequence.

    ``k_pages``/``v_pages``: float32 or float16 ``[num_pages, num_kv_heads,
    page_size, head_dim]``, or 8-bit codes with ``k_scales``/``v_scales``
    ``[num_pages, num_kv_heads, page_size]`` (dequantized as they are gathered);
    ``bt_row``: the sequence's block table row. ``kv_layout="k_transposed"``:
    k_pages are ``[num_pages, num_kv_heads, head_dim, page_size]``.
    Writes ``out[t0:t0+n_q]`` ``[n_q, H, D]`` and ``lse[t0:t0+n_q]`` (natural log).

    Attention sinks (``sinks > 0`` with a window): a tile some of whose rows
    lose sink keys from their window scores the sinks first, with ``q_sinks``
    (None: ``q``), in ``S``'s first columns (:func:`_sink_scores`).
    """
    H, D = q.shape[1], q.shape[2]
    num_kv_heads, P = v_pages.shape[1], v_pages.shape[2]
    G = H // num_kv_heads
    first_pos = seq_len - n_q  # position of query t0
    lo0 = max(0, first_pos - window + 1) if window > 0 else 0  # first key any query sees
    page_lo, page_hi = lo0 // P, -(-seq_len // P)
    base = page_lo * P  # position of the gathered buffer's first key
    pages = bt_row[page_lo:page_hi]
    qs = np.float32(scale) * LOG2E  # scores in log2 units, as in the kernel
    rows_max = min(n_q, Q_TILE) * G
    # One buffer for every key block's S (fresh arrays would page-fault each time).
    sinks = sinks if window > 0 and seq_len - window > 0 else 0  # some query loses sinks
    s_buf = np.empty(rows_max * max(min(K_TILE, seq_len - base), sinks), np.float32)
    for kvh in range(num_kv_heads):
        heads = slice(kvh * G, (kvh + 1) * G)
        ks = None if k_scales is None else k_scales[pages, kvh]          # [n_pages, P]
        vs = None if v_scales is None else v_scales[pages, kvh]
        kt = _gather_k(k_pages, pages, kvh, ks, kv_layout)               # [D, n_keys] float32
        vc = to_float32(v_pages[pages, kvh], vs).reshape(-1, D)
        qh = q[t0:t0 + n_q, heads] * qs  # [n_q, G, D] contiguous: rows i*G + g
        if sinks:  # the sinks' keys and values, and the queries that score them
            sink_pages = bt_row[:-(-sinks // P)]
            ksk = _gather_k(k_pages, sink_pages, kvh, None if ks is None else k_scales[
                sink_pages, kvh], kv_layout)[:, :sinks].T                # [sinks, D]
            vsk = to_float32(v_pages[sink_pages, kvh], None if vs is None else v_scales[
                sink_pages, kvh]).reshape(-1, D)[:sinks]
            qhs = qh if q_sinks is None else q_sinks[t0:t0 + n_q, heads] * qs  # [n_q, G, D]
        for i0 in range(0, n_q, Q_TILE):
            i1 = min(n_q, i0 + Q_TILE)
            p0, p1 = first_pos + i0, first_pos + i1 - 1  # positions of the tile's queries
            lo = max(0, p0 - window + 1) if window > 0 else 0
            qt = qh[i0:i1].reshape(-1, D)  # [rows, D], rows = (i1 - i0) * G
            rows = qt.shape[0]
            state = _State(rows, D)
            if sinks and p1 - window + 1 > 0:  # first the sinks some row's window leaves out
                s = s_buf[:rows * sinks].reshape(rows, sinks)
                _sink_scores(qhs[i0:i1].reshape(-1, D), ksk, s, p0, G, window)
                state.fold(s, vsk)
            for j0 in range(lo, p1 + 1, K_TILE):  # then the window's keys, a block at a time
                j1 = min(p1 + 1, j0 + K_TILE)
                s = s_buf[:rows * (j1 - j0)].reshape(rows, j1 - j0)
                np.matmul(qt, kt[:, j0 - base:j1 - base], out=s)  # BLAS
                if j1 - 1 > p0 or (window > 0 and j0 <= p1 - window):  # some key invisible
                    _mask_invisible(s, p0, G, j0, window)
                state.fold(s, vc[j0 - base:j1 - base])
            o, tile_lse = state.finish()
            out[t0 + i0:t0 + i1, heads] = o.reshape(i1 - i0, G, D)
            lse[t0 + i0:t0 + i1, heads] = tile_lse.reshape(i1 - i0, G)


class _State:
    """One query tile's online softmax over key blocks (FlashAttention-2's loop order):
    the running max ``m`` and sum ``l`` of each row (log2 units) and its output ``o``."""

    def __init__(self, rows: int, D: int):
        self.m = np.full(rows, EMPTY, np.float32)
        self.l = np.zeros(rows, np.float32)
        self.o = np.zeros((rows, D), np.float32)

    def fold(self, s, v):
        """Fold a block's scores ``s`` [rows, n] (masked ones :data:`MASKED`) and its values
        ``v`` [n, D] in; ``s`` becomes the block's weights."""
        m_new = np.maximum(self.m, s.max(axis=1))  # [rows]
        block_sum = np.empty_like(m_new)
        _exp2_rows(s, m_new, block_sum)  # s = 2**(s - m_new): the weights P
        alpha = np.exp2(self.m - m_new)  # how much the old sums shrink (0 for EMPTY)
        self.l = self.l * alpha + block_sum
        self.o *= alpha[:, None]
        self.o += s @ v  # [rows, D]   (BLAS)
        self.m = m_new

    def finish(self):
        """The normalised output [rows, D] and log-sum-exp [rows] (natural log)."""
        return self.o / self.l[:, None], (self.m + np.log2(self.l)) * LN2
