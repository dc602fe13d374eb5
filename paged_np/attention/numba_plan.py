"""The plan of a numba paged-attention call: who computes what, decided in plain NumPy.

Before any arithmetic, :func:`make_plan` cuts a call into work items
(:func:`plan_items`) and picks the knobs from the shapes and the bytes to
read: how many kv heads an item takes (:func:`choose_heads_per_item`), how
many split-K parts (:func:`choose_num_splits`), how many threads
(:func:`choose_num_threads`). The kernels in :mod:`.numba_cpu` only follow it.
A :class:`Plan` depends on the step's metadata, not on the layer, so the
first layer of a step makes it and the rest reuse it.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

#: A sequence with this many queries (a long prefill chunk) goes to BLAS.
BLAS_MIN_QUERIES = 128
#: Sequences with at most this many queries (decode; a speculative verify step) are
#: planned as decode is, so each query computes as a one-query decode would (see
#: :func:`make_plan`).
DECODE_QUERIES = 16
#: Query rows per prefill item (q_tile * G); decode items have G rows.
PREFILL_ROWS = 64
#: Split-K is used when there are fewer items than this many per thread.
ITEMS_PER_THREAD = 4
#: A split-K part covers at least this many pages (smaller parts cost more to merge).
MIN_PAGES_PER_SPLIT = 8
#: A second Python thread joins only for at least this many bytes of K/V per thread
#: (see :func:`choose_num_threads`); split-K plans with this count of threads too.
MIN_BYTES_PER_THREAD = 2 << 20
#: A second of Numba's threads joins for at least this many bytes of K/V per thread, as
#: the queries read them.
MIN_BYTES_PER_NUMBA_THREAD = 64 << 10
#: A decode or verify step whose keys are not split cuts each sequence's queries into
#: tiles enough for this many items per thread (see :func:`choose_verify_tile`).
TILE_ITEMS_PER_THREAD = 2

#: Columns of the plan (one row per work item), read by the kernel's item loop.
ITEM_SEQ, ITEM_Q0, ITEM_NQ, ITEM_KVH, ITEM_KLO, ITEM_KHI, ITEM_SPLIT = range(7)


def plan_items(seq_lens, query_start_loc, n_q, page_size, num_kv_heads, q_tile, num_splits,
               window, num_threads, heads_per_item=1):
    """Work items, ordered so that each thread's contiguous block costs about the same.

    Plain NumPy (a few dozen items for a decode step; nothing to compile).
    ``n_q`` ``[B]``: queries per sequence the kernel handles (0: none).
    ``num_splits``: the split-K parts of every tile, or a function from each tile's
    page count (int64 ``[tiles]``) to its own number of parts.
    Returns int64 ``[num_threads * per_thread, 7]``: sequence, first query
    token, number of queries, first kv head (the item takes ``heads_per_item``
    of them, which must divide ``num_kv_heads``), keys ``[lo, hi)`` and split
    part. Rows with 0 queries are padding.
    """
    n_tiles = -(-n_q // q_tile)  # [B] query tiles per sequence
    b = np.repeat(np.arange(len(n_q)), n_tiles)  # [tiles] sequence of each tile
    first_tile = np.repeat(np.cumsum(n_tiles) - n_tiles, n_tiles)
    i0 = (np.arange(len(b)) - first_tile) * q_tile  # [tiles] first query, within the sequence
    nq = np.minimum(q_tile, n_q[b] - i0)
    p_first = seq_lens[b] - n_q[b] + i0  # position of the tile's first query
    lo = np.maximum(0, p_first - window + 1) if window > 0 else np.zeros_like(p_first)
    hi = p_first + nq  # one past the last query's position
    page_lo = lo // page_size
    pages = (hi - 1) // page_size + 1 - page_lo  # [tiles] pages each tile reads
    splits = np.broadcast_to(num_splits(pages) if callable(num_splits) else num_splits,
                             pages.shape)  # [tiles] parts of each tile
    num_splits = int(splits.max()) if len(splits) else 1
    per = -(-pages // splits)  # [tiles] pages per part (parts past a tile's own are empty)
    # Every (tile, split part, group of kv heads) is an item: fill a [tiles, S, Hkv/hpi, 7] grid.
    t3 = (slice(None), None, None)  # a [tiles] column broadcast over (S, kv head groups)
    split = np.arange(num_splits)[None, :, None]
    grid = np.empty((len(b), num_splits, num_kv_heads // heads_per_item, 7), np.int64)
    grid[..., ITEM_SEQ] = b[t3]
    grid[..., ITEM_Q0] = (query_start_loc[b] + i0)[t3]
    grid[..., ITEM_KVH] = np.arange(0, num_kv_heads, heads_per_item)
    grid[..., ITEM_SPLIT] = split
    grid[..., ITEM_KLO] = np.maximum(lo[t3], (page_lo[t3] + split * per[t3]) * page_size)
    grid[..., ITEM_KHI] = np.minimum(hi[t3], (page_lo[t3] + (split + 1) * per[t3]) * page_size)
    # An empty part (no keys in its range) is padding: 0 queries.
    grid[..., ITEM_NQ] = np.where((grid[..., ITEM_KHI] > grid[..., ITEM_KLO])
                                  & (split < splits[t3]), nq[t3], 0)
    items = grid.reshape(-1, 7)  # [n, 7]
    # Deal the items, most expensive first, round-robin into one block per thread.
    cost = items[:, ITEM_NQ] * np.maximum(items[:, ITEM_KHI] - items[:, ITEM_KLO], 0) + 64
    order = np.argsort(-cost, kind="stable")
    per_thread = -(-len(items) // num_threads)
    dealt = np.zeros((per_thread * num_threads, 7), np.int64)  # padding: 0 queries
    j = np.arange(len(items))
    dealt[(j % num_threads) * per_thread + j // num_threads] = items[order]
    return dealt


def choose_heads_per_item(n_tiles: int, num_kv_heads: int, q_tile: int, num_threads: int) -> int:
    """Decode items take two kv heads when that still leaves every thread a few items.

    A page's tiles of kv heads ``h`` and ``h + 1`` lie side by side in the
    arena (``[num_pages, num_kv_heads, page_size, head_dim]``), so one item
    reading both streams 16 KiB runs instead of two 8 KiB ones
    (``benchmarks/kernel_ablation.py`` times both). Prefill items
    (``q_tile > 1``) already have rows enough.
    """
    pairs = n_tiles * (num_kv_heads // 2)
    if q_tile == 1 and num_kv_heads % 2 == 0 and pairs >= ITEMS_PER_THREAD * num_threads:
        return 2
    return 1


def choose_num_splits(n_items: int, max_pages, num_threads: int):
    """Split-K factor: enough parts to give every thread a few items (1 on one thread).
    ``max_pages`` an int, or an array (one factor each)."""
    target = ITEMS_PER_THREAD * num_threads
    want = -(-target // max(n_items, 1))  # ceil
    parts = np.maximum(1, np.minimum(want, np.asarray(max_pages) // MIN_PAGES_PER_SPLIT))
    if num_threads == 1 or n_items >= target:
        parts = np.ones_like(parts)
    parts = np.where(np.asarray(max_pages) < 2 * MIN_PAGES_PER_SPLIT, 1, parts)
    return int(parts) if parts.ndim == 0 else parts


def choose_num_threads(work_bytes: int, max_threads: int, threads: str = "python") -> int:
    """Threads worth waking for ``work_bytes`` of K/V to read: one per
    :data:`MIN_BYTES_PER_THREAD` (Python threads) or :data:`MIN_BYTES_PER_NUMBA_THREAD`.

    Handing a block of items to a pool thread and waiting for it costs about
    0.1 ms here (a Python thread wakes, takes the GIL, calls the kernel):
    more than the whole attention of a small layer (SmolLM2-135M at batch 1
    reads ~0.5 MB a layer, ~0.05 ms). Such calls run on the calling thread.
    Numba's OpenMP workers, still spinning after the layer's weight products,
    take a block in about a microsecond: two beat one from about 24 keys of
    SmolLM2-135M (``benchmarks/attention_dispatch.py``).
    """
    per = MIN_BYTES_PER_NUMBA_THREAD if threads == "numba" else MIN_BYTES_PER_THREAD
    return max(1, min(max_threads, work_bytes // per))


def choose_verify_tile(n_q_max: int, n_items: int, num_threads: int, max_tile: int) -> int:
    """Queries per item for an unsplit decode or verify step: few enough tiles that each
    item still has rows to spare, enough for :data:`TILE_ITEMS_PER_THREAD` items a thread.

    SmolLM2-135M's verify step (9 queries, 3 kv heads, context 300) on 2 of Numba's
    threads, AVX2-only EPYC: tiles of 5 queries (6 items) took 108 us a layer, one tile
    per kv head (3 items: one thread takes two) 129 us, tiles of 1 query 187 us (each
    item re-reads the keys), one thread 188 us (``python benchmarks/attention_dispatch.py``).
    """
    tiles = -(-TILE_ITEMS_PER_THREAD * num_threads // max(n_items, 1))  # per sequence
    return max(1, min(max_tile, -(-n_q_max // tiles)))


class Plan(NamedTuple):
    """How one call's work is cut: made by :func:`make_plan`, reusable by every layer of a step."""

    blas_seqs: np.ndarray          # sequences whose long prefill chunk goes to BLAS
    items: np.ndarray | None       # the kernel's work items (plan_items); None: no kernel work
    q_tile: int
    num_splits: int
    heads_per_item: int
    num_threads: int
    threads: str = "python"        # whose threads run the items (config.ATTENTION_THREADS)


def make_plan(seq_lens, qsl, num_heads, num_kv_heads, page_size, kv_itemsize, head_dim,
              window, *, num_splits=None, q_tile=None, heads_per_item=None,
              num_threads=None, blas_min_queries=None, threads="python",
              kv_layout="hnd") -> Plan:
    """Everything :func:`forward` decides before any arithmetic (plain NumPy).

    The knobs override the automatic choices (tests force split-K, pairs of
    kv heads or threads with them); ``None`` picks them from the shapes, the
    bytes to read and ``numba.get_num_threads()``. ``threads``: whose threads
    run the items (``config.ATTENTION_THREADS``), which sets what one costs to wake.
    ``blas_min_queries=None``: :data:`BLAS_MIN_QUERIES`, except for float32 pages in
    the ``k_transposed`` layout, whose vector tiles run causal prefill faster than
    the BLAS path (``benchmarks/prefill_tiles.md``): there the kernel takes it all.
    """
    if blas_min_queries is None:
        kernel_prefills = kv_layout != "hnd" and kv_itemsize == 4 and head_dim % 16 == 0
        blas_min_queries = np.iinfo(np.int64).max if kernel_prefills else BLAS_MIN_QUERIES
    n_q = np.diff(qsl)
    in_kernel = n_q < blas_min_queries
    blas_seqs = np.flatnonzero(~in_kernel)
    if not (in_kernel.any() and n_q[in_kernel].max() > 0):
        return Plan(blas_seqs, None, 1, 1, 1, 1, threads)
    n_q = np.where(in_kernel, n_q, 0)
    G = num_heads // num_kv_heads
    keys = np.minimum(seq_lens, window + n_q) if window else seq_lens
    kv_bytes = num_kv_heads * head_dim * kv_itemsize * 2  # K and V bytes of one key
    if q_tile is None and n_q.max() <= DECODE_QUERIES:  # decode, or verify drafts
        # Splits follow from the sequences alone, as if each brought one query (a
        # sequence's K/V come from memory once; its other queries find them in cache),
        # so a query is computed alike whether its sequence has 1 query in the step or
        # 9 drafts: the bits of its output do not depend on the batch (greedy
        # speculative decoding leans on that).
        seqs = int((n_q > 0).sum())
        max_threads = numba.get_num_threads()
        one_query_bytes = int(keys[n_q > 0].sum()) * kv_bytes
        split_threads = num_threads or choose_num_threads(one_query_bytes, max_threads)
        if heads_per_item is None:
            heads_per_item = choose_heads_per_item(seqs, num_kv_heads, 1, split_threads)
        n_items = seqs * num_kv_heads // heads_per_item
        if num_splits is None:  # each query's parts from its own pages
            def num_splits(pages):
                return choose_num_splits(n_items, pages, split_threads)
        longest = np.array([-(-int(seq_lens[n_q > 0].max()) // page_size)])
        unsplit = (num_splits(longest)[0] if callable(num_splits) else num_splits) == 1
        # Threads only run items: any number keeps the bits. Numba's count the keys each
        # query reads, over every query; Python's (0.1 ms each) only decode's reads.
        if num_threads is None:
            work = int((n_q * keys).sum()) * kv_bytes if threads == "numba" else one_query_bytes
            num_threads = choose_num_threads(work, max_threads, threads)
        # An item of several queries keeps decode's bits (the kernel's grouping does not
        # depend on the keys after a row's own, nor on the other rows) unless its keys
        # are split or windowed: those parts start where the item's first query says.
        if unsplit and not window:
            q_tile = choose_verify_tile(int(n_q.max()), n_items, num_threads,
                                        max(1, PREFILL_ROWS // G))
            num_splits = 1
        else:
            q_tile = 1
    else:
        if q_tile is None:  # prefill: ~PREFILL_ROWS rows
            q_tile = max(1, PREFILL_ROWS // G)
        n_tiles_each = (n_q + q_tile - 1) // q_tile  # [B]
        n_tiles = int(n_tiles_each.sum())
        work = int((n_tiles_each * keys).sum()) * kv_bytes  # K/V bytes the tiles read
        split_threads = num_threads or choose_num_threads(work, numba.get_num_threads())
        if num_threads is None:
            num_threads = choose_num_threads(work, numba.get_num_threads(), threads)
        if heads_per_item is None:
            heads_per_item = choose_heads_per_item(n_tiles, num_kv_heads, q_tile, num_threads)
        if num_splits is None:
            max_pages = int(-(-int(seq_lens[n_q > 0].max()) // page_size))
            num_splits = choose_num_splits(n_tiles * num_kv_heads // heads_per_item,
                                           max_pages, split_threads)
    items = plan_items(seq_lens, qsl, n_q, page_size, num_kv_heads, int(q_tile),
                       num_splits if callable(num_splits) else int(num_splits), window,
                       int(num_threads), int(heads_per_item))
    num_splits = int(items[:, ITEM_SPLIT].max()) + 1 if len(items) else 1
    return Plan(blas_seqs, items, int(q_tile), num_splits, int(heads_per_item),
                int(num_threads), threads)
