"""Paged attention on the CPU with Numba: the fast backend (``backend="numba"``).

The NumPy teaching kernel (:mod:`paged_np.attention.numpy_paged`) walks the
block table page by page and keeps an online softmax. This module does the same
arithmetic, but arranged for a 2-core machine whose memory bus is the limit:

1. **Work items.** One item is a tile of up to ``q_tile`` queries of one
   sequence, for one kv head, over one range of keys. All ``G = num_heads //
   num_kv_heads`` query heads that share the kv head (GQA) ride in the same
   item as ``q_tile * G`` *rows*, so every K/V page tile is read from memory
   once per item, not once per query head. Decode is ``q_tile = 1``: a row per
   query head, one item per (sequence, kv head).
2. **Reading the arena in place.** Per kv head a page is a contiguous
   ``[page_size, head_dim]`` tile (HND layout); the kernel reads it where it
   lies, following the block table. Nothing is gathered, and nothing
   allocated grows with the context length.
3. **Split-K (flash-decoding).** With few items (one long sequence, one kv
   head) most cores would idle, so each item's keys are cut into
   ``num_splits`` page-aligned parts that run in parallel. Each part leaves an
   unnormalised state ``(max, sum, acc)``; :func:`_merge_splits` combines them
   exactly with log-sum-exp weights, as ``merge_attention_states`` does.
4. **Balance.** Causal prefill items differ in cost (late queries see more
   keys). :func:`_plan` sorts items by cost and deals them round-robin into
   one contiguous block per thread, because ``prange`` hands each thread a
   contiguous block of iterations.

Three layers, as everywhere in paged_np: ``paged_attention`` validates, then
:func:`forward` (plain Python) plans and calls the ``@njit(parallel=True)``
drivers here, which call the small helpers of
:mod:`paged_np.attention.numba_kernels`.

Simplified compared with vLLM/FlashInfer: no BLAS micro-kernels (the loops are
written so LLVM vectorises them), no FP8, no ALiBi or soft-capping.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ..config import JIT_OPTIONS, JIT_PARALLEL_OPTIONS
from .numba_kernels import (
    EMPTY,
    LN2,
    LOG2E,
    accumulate_pv,
    exp2,
    mask_scores,
    online_softmax,
    tile_f32,
    tile_scores,
)

#: Query rows per prefill item (q_tile * G); decode items have G rows.
PREFILL_ROWS = 64
#: Split-K is used when there are fewer items than this many per thread.
ITEMS_PER_THREAD = 4
#: A split-K part covers at least this many pages (smaller parts cost more to merge).
MIN_PAGES_PER_SPLIT = 8

# Columns of the plan (one row per work item).
_B, _Q0, _NQ, _KVH, _KLO, _KHI, _SPLIT = range(7)


@njit(**JIT_OPTIONS)
def _plan(seq_lens, query_start_loc, page_size, num_kv_heads, q_tile, num_splits, window,
          num_threads):
    """Work items, ordered so that ``prange``'s contiguous blocks balance.

    Returns int64 ``[n_items, 7]``: sequence, first query token, number of
    queries, kv head, keys ``[lo, hi)`` and split index. Rows with 0 queries
    are padding.
    """
    B = seq_lens.shape[0]
    n_tiles = 0
    for b in range(B):
        n_q = query_start_loc[b + 1] - query_start_loc[b]
        n_tiles += (n_q + q_tile - 1) // q_tile
    items = np.zeros((n_tiles * num_kv_heads * num_splits, 7), np.int64)
    cost = np.zeros(items.shape[0], np.float64)
    n = 0
    for b in range(B):
        n_q = query_start_loc[b + 1] - query_start_loc[b]
        for i0 in range(0, n_q, q_tile):
            nq = min(q_tile, n_q - i0)
            p_first = seq_lens[b] - n_q + i0  # position of the tile's first query
            lo = max(0, p_first - window + 1) if window > 0 else 0
            hi = p_first + nq  # one past the last query's position
            page_lo = lo // page_size
            n_pages = (hi - 1) // page_size + 1 - page_lo
            per = (n_pages + num_splits - 1) // num_splits  # pages per split
            for split in range(num_splits):
                klo = max(lo, (page_lo + split * per) * page_size)
                khi = min(hi, (page_lo + (split + 1) * per) * page_size)
                for kvh in range(num_kv_heads):
                    row = items[n]
                    row[_B], row[_Q0] = b, query_start_loc[b] + i0
                    row[_KVH], row[_SPLIT] = kvh, split
                    row[_NQ] = nq if khi > klo else 0  # an empty part is padding
                    row[_KLO], row[_KHI] = klo, khi
                    cost[n] = nq * max(khi - klo, 0) + 64.0
                    n += 1
    # Deal the items, most expensive first, round-robin into one block per thread.
    order = np.argsort(-cost)
    per_thread = (n + num_threads - 1) // num_threads
    dealt = np.zeros((per_thread * num_threads, 7), np.int64)  # padding: 0 queries
    for j in range(n):
        dealt[(j % num_threads) * per_thread + j // num_threads] = items[order[j]]
    return dealt


@njit(**JIT_PARALLEL_OPTIONS)
def _attend_items(q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items,
                  window, part_acc, part_m, part_l):
    """Run every planned item; each leaves its unnormalised softmax state.

    ``q2``: queries already multiplied by ``scale * log2(e)`` ``[T, H, D]``.
    Writes ``part_acc [S, T, H, D]``, ``part_m``, ``part_l [S, T, H]``.
    """
    H, D = q2.shape[1], q2.shape[2]
    page_size = k_pages.shape[2]
    G = H // k_pages.shape[1]  # query heads per kv head
    for w in prange(items.shape[0]):
        it = items[w]
        b, q0, nq, kvh = it[_B], it[_Q0], it[_NQ], it[_KVH]
        klo, khi, split = it[_KLO], it[_KHI], it[_SPLIT]
        if nq == 0:
            continue
        R = nq * G  # rows: (query i, head g) -> r = i * G + g
        n_q = query_start_loc[b + 1] - query_start_loc[b]
        first_pos = seq_lens[b] - n_q + (q0 - query_start_loc[b])
        qt = np.empty((R, D), np.float32)  # [R, D]
        row_pos = np.empty(R, np.int64)  # [R] each row's query position
        for i in range(nq):
            for g in range(G):
                qt[i * G + g] = q2[q0 + i, kvh * G + g]
                row_pos[i * G + g] = first_pos + i
        s = np.empty((R, page_size), np.float32)  # scores, then weights
        m = np.full(R, EMPTY, np.float32)  # running max (log2 units)
        l = np.zeros(R, np.float32)  # running sum of weights
        acc = np.zeros((R, D), np.float32)  # running sum of weight * v
        kbuf = np.empty((page_size, D), np.float32)  # float16 pages widen here
        vbuf = np.empty((page_size, D), np.float32)
        last_pos = first_pos + nq - 1
        for page in range(klo // page_size, (khi - 1) // page_size + 1):
            pid = block_tables[b, page]
            key0 = page * page_size  # position of the page's first token
            nk = min(khi - key0, page_size)  # tokens of this page inside [.., khi)
            k = tile_f32(k_pages[pid, kvh], kbuf, nk)  # [page_size, D], rows < nk valid
            v = tile_f32(v_pages[pid, kvh], vbuf, nk)
            tile_scores(qt, k, s, R, nk)  # s[:R, :nk]
            # Mask only tiles that some row cannot fully see (causal edge, window).
            if key0 + nk - 1 > first_pos or (window > 0 and key0 <= last_pos - window):
                mask_scores(s, row_pos, R, key0, nk, window)
            online_softmax(s, m, l, acc, R, nk)
            accumulate_pv(s, v, acc, R, nk)
        for i in range(nq):
            for g in range(G):
                r = i * G + g
                part_acc[split, q0 + i, kvh * G + g] = acc[r]
                part_m[split, q0 + i, kvh * G + g] = m[r]
                part_l[split, q0 + i, kvh * G + g] = l[r]


@njit(**JIT_PARALLEL_OPTIONS)
def _merge_splits(part_acc, part_m, part_l, out, lse):
    """Combine the split states of every (token, head): ``out = acc / sum``.

    With maxima ``m_s`` and ``M = max_s m_s``, part ``s`` is weighted by
    ``2**(m_s - M)``; ``lse = (M + log2(sum)) * ln 2`` turns log2 units back
    into natural log.
    """
    S, T, H, D = part_acc.shape
    for th in prange(T * H):
        t, h = th // H, th % H
        M = EMPTY
        for s in range(S):
            M = max(M, part_m[s, t, h])
        total = np.float32(0.0)
        for s in range(S):
            total += part_l[s, t, h] * exp2(part_m[s, t, h] - M)
        inv = np.float32(1.0) / total if total > 0 else np.float32(0.0)
        o = out[t, h]  # [D]
        o[:] = 0.0
        for s in range(S):
            wgt = exp2(part_m[s, t, h] - M) * inv
            a = part_acc[s, t, h]
            for d in range(D):
                o[d] += wgt * a[d]
        lse[t, h] = (M + np.log2(total)) * LN2 if total > 0 else EMPTY


def choose_num_splits(n_items: int, max_pages: int, num_threads: int) -> int:
    """Split-K factor: enough parts to give every thread a few items."""
    target = ITEMS_PER_THREAD * num_threads
    if n_items >= target or max_pages < 2 * MIN_PAGES_PER_SPLIT:
        return 1
    want = -(-target // max(n_items, 1))  # ceil
    return max(1, min(want, max_pages // MIN_PAGES_PER_SPLIT))


def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
            sliding_window, return_lse, *, num_splits=None, q_tile=None):
    """Backend entry (validated arguments, see the contract in DESIGN.md).

    ``num_splits`` and ``q_tile`` override the automatic choices (tests use
    them to force split-K); ``None`` picks them from the shapes and
    ``numba.get_num_threads()``.
    """
    T, H, D = q.shape
    num_kv_heads, page_size = k_pages.shape[1], k_pages.shape[2]
    G = H // num_kv_heads
    out = np.zeros((T, H, D), np.float32)
    lse = np.zeros((T, H), np.float32)
    if T == 0:
        return out, (lse if return_lse else None)
    if k_pages.dtype == np.float16:  # Numba cannot load float16: pass the bits
        k_pages, v_pages = k_pages.view(np.uint16), v_pages.view(np.uint16)
    seq_lens = np.ascontiguousarray(seq_lens, np.int64)
    qsl = np.ascontiguousarray(query_start_loc, np.int64)
    n_q = np.diff(qsl)
    if q_tile is None:  # decode: one query per item; prefill: ~PREFILL_ROWS rows
        q_tile = 1 if n_q.max() <= 1 else max(1, PREFILL_ROWS // G)
    threads = numba.get_num_threads()
    if num_splits is None:
        n_items = int(((n_q + q_tile - 1) // q_tile).sum()) * num_kv_heads
        max_pages = int(-(-int(seq_lens.max()) // page_size))
        num_splits = choose_num_splits(n_items, max_pages, threads)
    window = int(sliding_window or 0)
    items = _plan(seq_lens, qsl, page_size, num_kv_heads, int(q_tile), int(num_splits),
                  window, threads)
    q2 = np.multiply(q, np.float32(scale) * LOG2E, dtype=np.float32)  # log2 units
    part_acc = np.zeros((num_splits, T, H, D), np.float32)
    part_m = np.full((num_splits, T, H), EMPTY, np.float32)
    part_l = np.zeros((num_splits, T, H), np.float32)
    _attend_items(q2, k_pages, v_pages, block_tables, seq_lens, qsl, items, window,
                  part_acc, part_m, part_l)
    _merge_splits(part_acc, part_m, part_l, out, lse)
    return out, (lse if return_lse else None)
