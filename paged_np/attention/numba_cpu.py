"""Paged attention on the CPU with Numba: the fast backend (``backend="numba"``).

The NumPy teaching kernel (:mod:`paged_np.attention.numpy_paged`) walks the
block table page by page and keeps an online softmax. This module does the same
arithmetic, but arranged for a 2-core machine whose memory bus is the limit:

1. **Work items.** One item is a tile of up to ``q_tile`` queries of one
   sequence, for one kv head (two for decode, see
   :func:`choose_heads_per_item`), over one range of keys. All ``G = num_heads //
   num_kv_heads`` query heads that share the kv head (GQA) ride in the same
   item as ``q_tile * G`` *rows*, so every K/V page tile is read from memory
   once per item, not once per query head. Decode is ``q_tile = 1``: a row per
   query head, one item per (sequence, pair of kv heads).
2. **Reading the arena in place.** Per kv head a page is a contiguous
   ``[page_size, head_dim]`` tile (HND layout); the kernel reads it where it
   lies, following the block table. Nothing is gathered, and nothing
   allocated grows with the context length. With ``kv_layout="k_transposed"``
   a K tile is ``[head_dim, page_size]`` and the tiles of
   :mod:`paged_np.attention.numba_kt` score it (one vector load: one dimension
   of 16 keys) and weigh the values, in explicit 16-lane vectors.
3. **Split-K (flash-decoding).** With few items (one long sequence, one kv
   head) most cores would idle, so each item's keys are cut into
   ``num_splits`` page-aligned parts that run in parallel. Each part leaves
   its normalised output and log-sum-exp; :func:`_merge_splits` combines
   them exactly, as ``merge_attention_states`` does.
4. **Balance.** Causal prefill items differ in cost (late queries see more
   keys). :func:`plan_items` sorts items by cost and deals them round-robin
   into one contiguous block per thread; each thread then walks its block
   with one set of scratch arrays (no allocation per item).
5. **Long prefill chunks go to BLAS.** A sequence with at least
   :data:`BLAS_MIN_QUERIES` queries is arithmetic-bound, and a hand-written
   loop reaches about a third of what a BLAS matrix product does:
   :mod:`paged_np.attention.numba_prefill` handles it.

Three layers, as everywhere in paged_np: ``paged_attention`` validates, then
:func:`forward` (plain Python) plans and calls the driver here
(:func:`_attend_items`: Python's threads or Numba's, :func:`_run_blocks`, over the item loop
:func:`_run_items` and :func:`_attend_item`), which calls the small helpers of
:mod:`paged_np.attention.numba_kernels`.

How to read it: :func:`forward` (the entry), :func:`plan_items` and the
``choose_*`` functions (the plan, plain NumPy), :func:`_attend_item` (one
item, jitted), then the helpers in :mod:`.numba_kernels`. Where the time of a
decode step goes and what each choice measured is in
``docs/concepts/kernels.md`` (numbers from ``benchmarks/kernel_ablation.py``).

Simplified compared with vLLM/FlashInfer: no hand-written assembly
micro-kernels (the loops are written so LLVM vectorises them), no ALiBi or
soft-capping. 8-bit pages (int8, fp8 e4m3) are read as codes, widened in the
inner loops (:mod:`.numba_widen`) and scaled once per score and weight
(:func:`~paged_np.attention.numba_kernels.online_softmax_scaled`).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numba
import numpy as np
from numba import njit, prange

from ..config import BOUNDSCHECK, JIT_OPTIONS
from ..forks import serial
from .numba_kernels import (
    EMPTY,
    LANES,
    LN2,
    LOG2E,
    SPARE_COLUMNS,
    accumulate_pv,
    mask_scores,
    mask_sink_scores,
    online_softmax,
    online_softmax_scaled,
    pad_block,
    tile_scores,
)
from .numba_kt import accumulate_pv_kt, tile_scores_kt
from .numba_plan import (  # the plan, plain NumPy (re-exported: tests and benchmarks)
    ITEM_KHI,
    ITEM_KLO,
    ITEM_KVH,
    ITEM_NQ,
    ITEM_Q0,
    ITEM_SEQ,
    ITEM_SPLIT,
    make_plan,
)
from .numba_prefill import attend_sequence

#: Keys per softmax block (rounded to whole pages): long enough for vector loops.
BLOCK_KEYS = 128


@njit(**JIT_OPTIONS)
def _load_rows(qsrc, qt, q0, nq, kvh0, G, R, R4, RT):
    """``qt[rt] = `` the query of row ``rt`` (kv head ``rt // R4``); padding rows are zero."""
    D = qt.shape[1]
    for rt in range(RT):
        h, r = rt // R4, rt % R4
        i = min(r // G, nq - 1)  # padding rows: zero queries at the last position
        for d in range(D):
            qt[rt, d] = qsrc[q0 + i, (kvh0 + h) * G + r % G, d] if r < R else 0.0  # [RT, D]


@njit(**JIT_OPTIONS)
def _attend_item(q2, k_pages, v_pages, bt_row, first_pos, q0, nq, kvh0, n_kv, klo, khi, window,
                 out, lse, qt, kt_scratch, row_pos, s, m, l, acc, k_scales, v_scales, ksc, vsc,
                 scratch, q2s, sinks, k_transposed):
    """One work item: ``nq`` queries x ``n_kv * G`` heads against keys ``[klo, khi)``.

    The item covers kv heads ``kvh0 .. kvh0 + n_kv - 1``. Writes the
    normalised output ``out[q0:q0+nq, kvh0*G:(kvh0+n_kv)*G]`` and its
    log-sum-exp (natural log; :data:`EMPTY` for a row that saw no key).
    The rest are per-thread scratch arrays, sized for the largest item, and
    the scales of 8-bit pages (None for float pages: Numba then compiles a
    version without the scaling, its ``is not None`` branches pruned) with
    ``ksc, vsc`` ``[n_kv, KB]``, scratch for one block's scales.

    Attention sinks (``sinks > 0``, only on the item that starts the keys of its
    rows): first a pass over keys ``[0, sinks)`` with the queries ``q2s``, each
    row seeing the sinks its window does not cover (:func:`mask_sink_scores`),
    then the window's keys as always: the two sets never overlap.

    ``k_transposed``: the K pages are ``[num_pages, num_kv_heads, head_dim,
    page_size]`` (``kv_layout="k_transposed"``), scored by :func:`.numba_kt.tile_scores_kt`;
    all else is the same, V pages included. ``kt_scratch``: ``qt`` transposed, and a float32
    K and V page where those tiles widen float16 and 8-bit pages (``(qtt, kw, vw)``).

    A row's arithmetic does not depend on how many keys the item reads past
    the row's own position (its other queries' keys, masked for it): keys go
    in fours from each page's start, a block's softmax runs over its keys
    padded to 16 and sums them in 16 lanes. So a verify step's row has the
    bits of the decode step at its position.
    """
    H, D = q2.shape[1], q2.shape[2]
    P = v_pages.shape[2]  # V pages are [page_size, D] in every layout
    G = H // k_pages.shape[1]
    KB = s.shape[1] - SPARE_COLUMNS  # keys per block: a whole number of pages
    R = nq * G  # rows of one kv head: (query i, head g) -> r = i * G + g
    R4 = (R + 3) // 4 * 4  # the helpers take rows in fours: pad with zero queries
    RT = n_kv * R4  # all rows: kv head h owns rows h*R4 .. h*R4 + R4 - 1
    last_pos = first_pos + nq - 1
    # Plain loops, not slice assignments: each slice-assignment variant costs
    # Numba about a second of compile time (measured), and these are tiny.
    for rt in range(RT):
        row_pos[rt] = first_pos + min((rt % R4) // G, nq - 1)
        m[rt] = EMPTY  # running max (log2 units)
        l[rt] = 0.0  # running sum of weights
        for d in range(D):
            acc[rt, d] = 0.0  # running sum of weight * v   [RT, D]
    PB = KB // P  # pages per block
    qtt, kw, vw = kt_scratch
    # Phase 0: the sinks some row's window leaves out; phase 1: the window.
    first_phase = 0 if sinks > 0 and window > 0 and last_pos - window + 1 > 0 else 1
    for phase in range(first_phase, 2):
        lo_k, hi_k = (0, sinks) if phase == 0 else (klo, khi)
        _load_rows(q2s if phase == 0 else q2, qt, q0, nq, kvh0, G, R, R4, RT)
        if k_transposed:  # the same rows as [D, RT], for tile_scores_kt's broadcasts
            for rt in range(RT):
                for d in range(D):
                    qtt[d, rt] = qt[rt, d]
        page_lo, page_hi = lo_k // P, (hi_k - 1) // P + 1
        for blk in range(page_lo, page_hi, PB):
            blk_hi = min(blk + PB, page_hi)
            key0 = blk * P  # position of the block's first key
            n = min(hi_k, blk_hi * P) - key0  # keys of the block (those < lo_k get masked)
            for j in range(blk, blk_hi):  # scores of every page: s[:RT, :n]
                c = (j - blk) * P
                nxt = bt_row[j + 1] if j + 1 < page_hi else -1  # page to prefetch meanwhile
                for h in range(n_kv):  # the kv heads' tiles of a page lie side by side
                    if k_transposed:
                        tile_scores_kt(qt, qtt, k_pages, bt_row[j], kvh0 + h, s, h * R4,
                                       (h + 1) * R4, c, min(n - c, P), nxt, kw)
                    else:
                        tile_scores(qt, k_pages, bt_row[j], kvh0 + h, s, h * R4,
                                    (h + 1) * R4, c, min(n - c, P), nxt)
                    if k_scales is not None:  # 8-bit: this page's scales, for the softmax
                        for t in range(min(n - c, P)):
                            ksc[h, c + t] = k_scales[bt_row[j], kvh0 + h, t]
                            vsc[h, c + t] = v_scales[bt_row[j], kvh0 + h, t]
            if phase == 0:  # a sink inside a row's window is the window's
                mask_sink_scores(s, row_pos, RT, key0, n, window)
            # Mask only blocks that some row cannot fully see (causal edge, window).
            elif key0 + n - 1 > first_pos or (window > 0 and key0 <= last_pos - window):
                mask_scores(s, row_pos, RT, key0, n, window)
            n16 = pad_block(s, RT, n)  # keys past n masked, up to a multiple of 16
            if k_scales is not None:  # scales each score and weight by its token's scales
                online_softmax_scaled(s, m, l, acc, RT, n16, ksc, vsc, R4, scratch)
            else:
                online_softmax(s, m, l, acc, RT, n16, scratch)
            for j in range(blk, blk_hi):  # acc[:RT] += p[:RT, :n] @ V
                c = (j - blk) * P
                nxt = bt_row[j + 1] if j + 1 < page_hi else -1
                for h in range(n_kv):
                    if k_transposed:
                        accumulate_pv_kt(s, v_pages, bt_row[j], kvh0 + h, acc, h * R4,
                                         (h + 1) * R4, c, min(n - c, P), nxt, vw)
                    else:
                        accumulate_pv(s, v_pages, bt_row[j], kvh0 + h, acc, h * R4,
                                      (h + 1) * R4, c, min(n - c, P), nxt)
    for h in range(n_kv):
        for i in range(nq):
            for g in range(G):
                r = h * R4 + i * G + g
                hq = (kvh0 + h) * G + g  # query head
                inv = np.float32(1.0) / l[r] if l[r] > 0 else np.float32(0.0)
                for d in range(D):
                    out[q0 + i, hq, d] = acc[r, d] * inv
                lse[q0 + i, hq] = (m[r] + np.log2(l[r])) * LN2 if l[r] > 0 else EMPTY


@njit(**JIT_OPTIONS)
def _run_items(q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items, w0, w1,
               max_rows, window, part_out, part_lse, heads_per_item, k_scales, v_scales,
               q2s, sinks, k_transposed):
    """Items ``w0:w1`` of the plan, one after the other, sharing one set of scratch arrays.

    ``max_rows``: the most rows (queries x G) an item has per kv head; each
    item takes ``heads_per_item`` kv heads.

    ``q2``: queries already multiplied by ``scale * log2(e)`` ``[T, H, D]``; ``q2s``
    the same for the ``sinks`` first keys (``q2`` itself when the model has no other).
    Writes ``part_out [S, T, H, D]`` and ``part_lse [S, T, H]``, one slice per
    split part (``S = 1``: the final answer).
    """
    D = q2.shape[2]
    P = v_pages.shape[2]
    KB = max(1, BLOCK_KEYS // P) * P  # keys per block
    RT = (max_rows + 3) // 4 * 4 * heads_per_item
    qt = np.empty((RT, D), np.float32)  # queries of the item   [RT, D]
    qtt = np.empty((D, RT) if k_transposed else (0, 0), np.float32)  # the same, transposed
    wide = (P, D) if k_transposed and k_pages.itemsize != 4 else (0, 0)  # kt: a widened page
    kt_scratch = (qtt, np.empty((1, 1, wide[1], wide[0]), np.float32),   # [1, 1, D, P]
                  np.empty((1, 1, wide[0], wide[1]), np.float32))         # [1, 1, P, D]
    row_pos = np.empty(RT, np.int64)  # each row's query position
    s = np.empty((RT, KB + SPARE_COLUMNS), np.float32)  # scores, then weights
    m = np.empty(RT, np.float32)
    l = np.empty(RT, np.float32)
    acc = np.empty((RT, D), np.float32)
    ksc = np.ones((heads_per_item, KB + SPARE_COLUMNS), np.float32)  # a block's scales
    vsc = np.ones((heads_per_item, KB + SPARE_COLUMNS), np.float32)  # (8-bit pages)
    scratch = np.empty(LANES + RT, np.float32)  # the softmax's lane sums and maxima
    for w in range(w0, w1):
        it = items[w]
        b, q0, nq = it[ITEM_SEQ], it[ITEM_Q0], it[ITEM_NQ]
        if nq == 0:  # padding
            continue
        n_q = query_start_loc[b + 1] - query_start_loc[b]
        first_pos = seq_lens[b] - n_q + (q0 - query_start_loc[b])
        _attend_item(q2, k_pages, v_pages, block_tables[b], first_pos, q0, nq, it[ITEM_KVH],
                     heads_per_item, it[ITEM_KLO], it[ITEM_KHI], window, part_out[it[ITEM_SPLIT]],
                     part_lse[it[ITEM_SPLIT]], qt, kt_scratch, row_pos, s, m, l, acc, k_scales,
                     v_scales, ksc, vsc, scratch, q2s, sinks * (it[ITEM_SPLIT] == 0), k_transposed)


@njit(parallel=True, **JIT_OPTIONS)
def _run_blocks(q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items,
                num_threads, max_rows, window, part_out, part_lse, heads_per_item, k_scales,
                v_scales, q2s, sinks, k_transposed):
    """Block ``th`` of the plan on thread ``th`` of Numba's own workers (OpenMP): see
    :func:`_attend_items` for when (``benchmarks/attention_dispatch.py`` times it)."""
    per_thread = items.shape[0] // num_threads
    for th in prange(num_threads):
        _run_items(q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items,
                   th * per_thread, (th + 1) * per_thread, max_rows, window, part_out,
                   part_lse, heads_per_item, k_scales, v_scales, q2s, sinks, k_transposed)


def _attend_items(q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items,
                  num_threads, max_rows, window, part_out, part_lse, heads_per_item=1,
                  k_scales=None, v_scales=None, threads="python", q2s=None, sinks=0,
                  k_transposed=False):
    """The parallel driver: thread ``th`` runs block ``th`` of the plan.

    ``items`` holds one contiguous block of rows per thread (see
    :func:`plan_items`); every block writes rows of its own. ``threads`` says whose
    threads (the plan counted them for that kind, see
    :func:`~paged_np.attention.numba_plan.choose_num_threads`):

    - ``"python"``: plain Python threads calling the jitted :func:`_run_items`,
      which releases the GIL (``nogil``). Waking one costs about 0.1 ms, and an
      idle one sleeps, so it never takes a core from other threads (BLAS's).
    - ``"numba"``: Numba's own OpenMP workers (:func:`_run_blocks`). When the
      caller's other work runs on them too (the quantized model's weight
      products), they are still awake and a block costs about a microsecond to
      hand over. Alternating them with BLAS's threads is slow: each kind spins
      a while after its call, on the cores the other needs (the float32 model
      measured 15x slower), so that caller asks for ``"python"``.

    In a forked child ``"numba"`` runs the blocks one after the other on the calling
    thread (GNU OpenMP kills a child on its first parallel loop if the parent had
    started OpenMP's threads: :mod:`paged_np.forks`). The bounds-checking build takes
    ``"python"`` (a failed check inside a ``prange`` loop is lost).
    """
    args = (q2, k_pages, v_pages, block_tables, seq_lens, query_start_loc, items)
    tail = (max_rows, window, part_out, part_lse, heads_per_item, k_scales, v_scales,
            q2 if q2s is None else q2s, sinks, k_transposed)
    if threads == "numba" and num_threads > 1 and not BOUNDSCHECK:
        serial(_run_blocks)(*args, num_threads, *tail)  # serial: in a forked child
        return
    per_thread = items.shape[0] // num_threads
    futures = []
    try:
        pool = _pool(num_threads) if num_threads > 1 else None
        for th in range(1, num_threads):
            futures.append(pool.submit(_run_items, *args, th * per_thread,
                                       (th + 1) * per_thread, *tail))
        _run_items(*args, 0, per_thread, *tail)  # block 0 in this thread
    finally:
        # Even when this thread's block raised: the workers still write into
        # part_out/part_lse, so no caller may see (or reuse) them until all stop.
        wait(futures)
    for f in futures:
        f.result()  # a worker's exception, raised here


# One pool per thread count, made on first use. Two threads may ask at once
# (the lock), and a forked child inherits the dict but not the worker threads:
# an executor whose workers are gone waits forever on the first task, so the
# child forgets the parent's pools and makes its own (os.register_at_fork).
_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def _pool(num_threads):
    """A thread pool with ``num_threads - 1`` workers, made once per thread count."""
    with _POOLS_LOCK:
        pool = _POOLS.get(num_threads)
        if pool is None:
            pool = _POOLS[num_threads] = ThreadPoolExecutor(num_threads - 1,
                                                            thread_name_prefix="paged_np")
        return pool


def _forget_pools_after_fork():
    """In a forked child: drop the parent's pools (their threads did not fork)."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()  # the parent may have held it while forking


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


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


def forward(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, scale,
            sliding_window, return_lse, *, plans=None, k_scales=None, v_scales=None,
            attention_sinks=0, q_sinks=None, kv_layout="hnd", **knobs):
    """Backend entry (validated arguments, see the contract in docs/design.md).

    Sequences with at least ``blas_min_queries`` queries go to
    :func:`paged_np.attention.numba_prefill.attend_sequence` (BLAS); the rest
    to the kernel here. ``knobs`` (``num_splits``, ``q_tile``,
    ``heads_per_item``, ``num_threads``, ``blas_min_queries``) override the
    plan's automatic choices, see :func:`make_plan`; ``threads`` (from the
    metadata) says whose threads run the items.

    ``plans``: a dict kept with the step's metadata
    (:class:`paged_np.attention.AttentionMetadata`). The plan depends only on
    the metadata and the shapes, so the first layer makes it and the others
    find it there. ``k_scales, v_scales``: float32 ``[num_pages, num_kv_heads,
    page_size]`` with 8-bit pages (int8 codes, or uint8 fp8 e4m3 bits).
    ``attention_sinks``, ``q_sinks``: the first keys every query sees, and the
    queries that score them (None: ``q``), as in ``paged_attention``.
    ``kv_layout``: ``"hnd"`` or ``"k_transposed"`` (K pages ``[num_pages,
    num_kv_heads, head_dim, page_size]``; V pages are ``[..., page_size,
    head_dim]`` in both).
    """
    T, H, D = q.shape
    out = np.zeros((T, H, D), np.float32)
    lse = np.zeros((T, H), np.float32)
    if T == 0:
        return out, (lse if return_lse else None)
    window = int(sliding_window or 0)
    sinks = int(attention_sinks) if window else 0
    num_kv_heads, page_size = v_pages.shape[1], v_pages.shape[2]
    seq_lens = np.ascontiguousarray(seq_lens, np.int64)
    qsl = np.ascontiguousarray(query_start_loc, np.int64)
    key = (H, num_kv_heads, page_size, D, k_pages.itemsize, window, numba.get_num_threads(),
           kv_layout, tuple(sorted(knobs.items())))
    plan = plans.get(key) if plans is not None else None
    if plan is None:
        plan = make_plan(seq_lens, qsl, H, num_kv_heads, page_size, k_pages.itemsize, D,
                         window, kv_layout=kv_layout, **knobs)
        if plans is not None:
            plans[key] = plan
    # The kernel first: a split-K merge rewrites all T rows, BLAS then fills its own.
    if plan.items is not None:
        _forward_kernel(q, k_pages, v_pages, block_tables, seq_lens, qsl, plan, scale, window,
                        out, lse, k_scales, v_scales, sinks, q_sinks, kv_layout != "hnd")
    for b in plan.blas_seqs:  # long prefill chunks: BLAS
        attend_sequence(q, k_pages, v_pages, block_tables[b], int(seq_lens[b]), int(qsl[b]),
                        int(qsl[b + 1] - qsl[b]), scale, window, out, lse, k_scales, v_scales,
                        sinks, q_sinks, kv_layout)
    return out, (lse if return_lse else None)


def _forward_kernel(q, k_pages, v_pages, block_tables, seq_lens, qsl, plan, scale, window,
                    out, lse, k_scales=None, v_scales=None, sinks=0, q_sinks=None,
                    k_transposed=False):
    """The Numba kernel on the plan's items; writes their rows of out, lse."""
    T, H, D = q.shape
    G = H // k_pages.shape[1]
    if k_pages.dtype == np.float16:  # Numba cannot load float16: pass the bits
        k_pages, v_pages = k_pages.view(np.uint16), v_pages.view(np.uint16)
    q2 = np.multiply(q, np.float32(scale) * LOG2E, dtype=np.float32)  # log2 units
    q2s = q2 if q_sinks is None or not sinks else np.multiply(
        q_sinks, np.float32(scale) * LOG2E, dtype=np.float32)  # the sinks' queries
    S = plan.num_splits
    if S == 1:  # the items write the answer directly
        part_out, part_lse = out[None], lse[None]
    else:
        part_out = np.zeros((S, T, H, D), np.float32)
        part_lse = np.full((S, T, H), EMPTY, np.float32)
    _attend_items(q2, k_pages, v_pages, block_tables, seq_lens, qsl, plan.items,
                  plan.num_threads, plan.q_tile * G, window, part_out, part_lse,
                  plan.heads_per_item, k_scales, v_scales, plan.threads, q2s, sinks,
                  k_transposed)
    if S > 1:
        _merge_splits(part_out, part_lse, out, lse)  # writes every token's rows
