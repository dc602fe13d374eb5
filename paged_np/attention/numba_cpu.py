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
    mask_scores,
    online_softmax,
    prefetch_tile,
    tile_scores,
)
from .numba_prefill import attend_sequence

#: Keys per softmax block (rounded to whole pages): long enough for vector loops.
BLOCK_KEYS = 128
#: A sequence with this many queries (a long prefill chunk) goes to BLAS.
BLAS_MIN_QUERIES = 128
#: Query rows per prefill item (q_tile * G); decode items have G rows.
PREFILL_ROWS = 64
#: Split-K is used when there are fewer items than this many per thread.
ITEMS_PER_THREAD = 4
#: A split-K part covers at least this many pages (smaller parts cost more to merge).
MIN_PAGES_PER_SPLIT = 8

# Columns of the plan (one row per work item).
_B, _Q0, _NQ, _KVH, _KLO, _KHI, _SPLIT = range(7)


@njit(**JIT_OPTIONS)
def _plan(seq_lens, query_start_loc, in_kernel, page_size, num_kv_heads, q_tile, num_splits,
          window, num_threads):
    """Work items, ordered so that ``prange``'s contiguous blocks balance.

    Returns int64 ``[n_items, 7]``: sequence, first query token, number of
    queries, kv head, keys ``[lo, hi)`` and split index. Rows with 0 queries
    are padding.
    """
    B = seq_lens.shape[0]
    n_tiles = 0
    for b in range(B):
        n_q = query_start_loc[b + 1] - query_start_loc[b] if in_kernel[b] else 0
        n_tiles += (n_q + q_tile - 1) // q_tile
    items = np.zeros((n_tiles * num_kv_heads * num_splits, 7), np.int64)
    cost = np.zeros(items.shape[0], np.float64)
    n = 0
    for b in range(B):
        if not in_kernel[b]:  # a long prefill chunk: numba_prefill does it
            continue
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


@njit(**JIT_OPTIONS)
def _attend_item(q2, k_pages, v_pages, bt_row, first_pos, q0, nq, kvh, klo, khi, window,
                 out, lse, qt, row_pos, s, m, l, acc):
    """One work item: ``nq`` queries x ``G`` heads against keys ``[klo, khi)``.

    Writes the normalised output ``out[q0:q0+nq, kvh*G:(kvh+1)*G]`` and its
    log-sum-exp (natural log; :data:`EMPTY` for a row that saw no key).
    The rest are per-thread scratch arrays, sized for the largest item.
    """
    H, D = q2.shape[1], q2.shape[2]
    P = k_pages.shape[2]
    G = H // k_pages.shape[1]
    KB = s.shape[1]  # keys per block: a whole number of pages
    R = nq * G  # rows: (query i, head g) -> r = i * G + g
    R4 = (R + 3) // 4 * 4  # the helpers take rows in fours: pad with zero queries
    last_pos = first_pos + nq - 1
    for i in range(nq):
        for g in range(G):
            qt[i * G + g] = q2[q0 + i, kvh * G + g]  # [D]
            row_pos[i * G + g] = first_pos + i
    qt[R:R4] = 0.0
    row_pos[R:R4] = last_pos
    m[:R4] = EMPTY  # running max (log2 units)
    l[:R4] = 0.0  # running sum of weights
    acc[:R4] = 0.0  # running sum of weight * v   [R4, D]
    page_lo, page_hi = klo // P, (khi - 1) // P + 1
    PB = KB // P  # pages per block
    for j in range(page_lo, min(page_lo + PB, page_hi)):  # the first block's K
        prefetch_tile(k_pages, bt_row[j], kvh)
    for blk in range(page_lo, page_hi, PB):
        blk_hi = min(blk + PB, page_hi)
        key0 = blk * P  # position of the block's first key
        n = min(khi, blk_hi * P) - key0  # keys of the block (those < klo get masked)
        for j in range(blk, blk_hi):  # scores of every page: s[:R4, :n]
            prefetch_tile(v_pages, bt_row[j], kvh)  # read after the softmax
            c = (j - blk) * P
            tile_scores(qt, k_pages, bt_row[j], kvh, s, R4, c, min(n - c, P))
        # Mask only blocks that some row cannot fully see (causal edge, window).
        if key0 + n - 1 > first_pos or (window > 0 and key0 <= last_pos - window):
            mask_scores(s, row_pos, R4, key0, n, window)
        online_softmax(s, m, l, acc, R4, n)
        for j in range(blk, blk_hi):  # acc[:R4] += p[:R4, :n] @ V
            if j + PB < page_hi:  # K of the same page slot, one block ahead
                prefetch_tile(k_pages, bt_row[j + PB], kvh)
            c = (j - blk) * P
            accumulate_pv(s, v_pages, bt_row[j], kvh, acc, R4, c, min(n - c, P))
    for i in range(nq):
        for g in range(G):
            r = i * G + g
            inv = np.float32(1.0) / l[r] if l[r] > 0 else np.float32(0.0)
            for d in range(D):
                out[q0 + i, kvh * G + g, d] = acc[r, d] * inv
            lse[q0 + i, kvh * G + g] = (m[r] + np.log2(l[r])) * LN2 if l[r] > 0 else EMPTY


@njit(**JIT_PARALLEL_OPTIONS)
def _attend_items(q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items,
                  num_threads, max_rows, window, part_out, part_lse):
    """Run every planned item: one ``prange`` iteration per thread.

    ``q2``: queries already multiplied by ``scale * log2(e)`` ``[T, H, D]``.
    ``items`` holds one contiguous block of rows per thread (see :func:`_plan`),
    so each thread allocates its scratch once and reuses it for all its items.
    Writes ``part_out [S, T, H, D]`` and ``part_lse [S, T, H]``, one slice per
    split part (``S = 1``: the final answer).
    """
    D = q2.shape[2]
    P = k_pages.shape[2]
    KB = max(1, BLOCK_KEYS // P) * P  # keys per block
    R4 = (max_rows + 3) // 4 * 4
    per_thread = items.shape[0] // num_threads
    for th in prange(num_threads):
        qt = np.empty((R4, D), np.float32)  # queries of the item   [R4, D]
        row_pos = np.empty(R4, np.int64)  # each row's query position
        s = np.empty((R4, KB), np.float32)  # scores, then weights  [R4, KB]
        m = np.empty(R4, np.float32)
        l = np.empty(R4, np.float32)
        acc = np.empty((R4, D), np.float32)
        for w in range(th * per_thread, (th + 1) * per_thread):
            it = items[w]
            b, q0, nq = it[_B], it[_Q0], it[_NQ]
            if nq == 0:  # padding
                continue
            n_q = query_start_loc[b + 1] - query_start_loc[b]
            first_pos = seq_lens[b] - n_q + (q0 - query_start_loc[b])
            _attend_item(q2, k_pages, v_pages, block_tables[b], first_pos, q0, nq, it[_KVH],
                         it[_KLO], it[_KHI], window, part_out[it[_SPLIT]],
                         part_lse[it[_SPLIT]], qt, row_pos, s, m, l, acc)


@njit(**JIT_OPTIONS)
def _merge_splits(part_out, part_lse, out, lse):
    """Combine the split parts of every (token, head), exactly.

    Part ``s`` weighs ``exp(lse_s - M) / sum`` with ``M = max_s lse_s``; an
    empty part has ``lse = EMPTY`` and weight 0. Serial: split-K only runs
    when there are few tokens.
    """
    S, T, H, D = part_out.shape
    for t in range(T):
        for h in range(H):
            M = EMPTY
            for s in range(S):
                M = max(M, part_lse[s, t, h])
            total = np.float32(0.0)
            for s in range(S):
                total += np.exp(part_lse[s, t, h] - M)
            o = out[t, h]  # [D]
            o[:] = 0.0
            for s in range(S):
                wgt = np.exp(part_lse[s, t, h] - M) / total
                a = part_out[s, t, h]
                for d in range(D):
                    o[d] += wgt * a[d]
            lse[t, h] = M + np.log(total)


def choose_num_splits(n_items: int, max_pages: int, num_threads: int) -> int:
    """Split-K factor: enough parts to give every thread a few items."""
    target = ITEMS_PER_THREAD * num_threads
    if n_items >= target or max_pages < 2 * MIN_PAGES_PER_SPLIT:
        return 1
    want = -(-target // max(n_items, 1))  # ceil
    return max(1, min(want, max_pages // MIN_PAGES_PER_SPLIT))


def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
            sliding_window, return_lse, *, num_splits=None, q_tile=None,
            blas_min_queries=BLAS_MIN_QUERIES):
    """Backend entry (validated arguments, see the contract in DESIGN.md).

    Sequences with at least ``blas_min_queries`` queries go to
    :func:`paged_np.attention.numba_prefill.attend_sequence` (BLAS); the rest
    to the kernel here. ``num_splits`` and ``q_tile`` override the kernel's
    automatic choices (tests use them to force split-K); ``None`` picks them
    from the shapes and ``numba.get_num_threads()``.
    """
    T, H, D = q.shape
    out = np.zeros((T, H, D), np.float32)
    lse = np.zeros((T, H), np.float32)
    if T == 0:
        return out, (lse if return_lse else None)
    window = int(sliding_window or 0)
    seq_lens = np.ascontiguousarray(seq_lens, np.int64)
    qsl = np.ascontiguousarray(query_start_loc, np.int64)
    n_q = np.diff(qsl)
    in_kernel = n_q < blas_min_queries
    if in_kernel.any() and n_q[in_kernel].max() > 0:
        _forward_kernel(q, k_pages, v_pages, block_tables, seq_lens, qsl, np.where(
            in_kernel, n_q, 0), scale, window, num_splits, q_tile, out, lse)
    for b in np.flatnonzero(~in_kernel):  # long prefill chunks: BLAS
        attend_sequence(q, k_pages, v_pages, block_tables[b], int(seq_lens[b]), int(qsl[b]),
                        int(n_q[b]), scale, window, out, lse)
    return out, (lse if return_lse else None)


def _forward_kernel(q, k_pages, v_pages, block_tables, seq_lens, qsl, n_q, scale, window,
                    num_splits, q_tile, out, lse):
    """The Numba kernel on the sequences with ``n_q > 0``; writes their rows of out, lse."""
    T, H, D = q.shape
    num_kv_heads, page_size = k_pages.shape[1], k_pages.shape[2]
    G = H // num_kv_heads
    in_kernel = n_q > 0
    if k_pages.dtype == np.float16:  # Numba cannot load float16: pass the bits
        k_pages, v_pages = k_pages.view(np.uint16), v_pages.view(np.uint16)
    if q_tile is None:  # decode: one query per item; prefill: ~PREFILL_ROWS rows
        q_tile = 1 if n_q.max() <= 1 else max(1, PREFILL_ROWS // G)
    threads = numba.get_num_threads()
    if num_splits is None:
        n_items = int(((n_q + q_tile - 1) // q_tile).sum()) * num_kv_heads
        max_pages = int(-(-int(seq_lens[in_kernel].max()) // page_size))
        num_splits = choose_num_splits(n_items, max_pages, threads)
    items = _plan(seq_lens, qsl, in_kernel, page_size, num_kv_heads, int(q_tile),
                  int(num_splits), window, threads)
    q2 = np.multiply(q, np.float32(scale) * LOG2E, dtype=np.float32)  # log2 units
    if num_splits == 1:  # the items write the answer directly
        part_out, part_lse = out[None], lse[None]
    else:
        part_out = np.zeros((num_splits, T, H, D), np.float32)
        part_lse = np.full((num_splits, T, H), EMPTY, np.float32)
    _attend_items(q2, k_pages, v_pages, block_tables, seq_lens, qsl, items, threads,
                  int(q_tile) * G, window, part_out, part_lse)
    if num_splits > 1:
        _merge_splits(part_out, part_lse, out, lse)  # every token: runs first
