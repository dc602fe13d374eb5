"""The ``numba.cuda`` kernels behind ``backend="cuda"``: attention, write, copy.

Import :mod:`paged_np.attention.numba_cuda` rather than this module: it checks
that ``numba.cuda`` is usable, plans the launch and validates every index
before a kernel sees it (a GPU does not check bounds either).

How the attention kernel maps onto a GPU
----------------------------------------
One thread block computes ``ROWS`` *rows* against one kv head, where a row is
a pair (query token, query head). The rows of a sequence are numbered
``row = i * group + g`` (query ``i``, head ``g`` of the GQA group), so:

- decode (one query per sequence): a block holds the whole GQA group of one
  sequence and kv head, and every K/V tile it loads serves all those heads;
- prefill (many queries): a block holds a tile of consecutive queries (times
  their heads), and walks the keys that the last of them can see.

The keys are walked in tiles of ``TILE_N`` token positions. A tile may span
several pages (page size 1) or part of one (page size 64): the block table is
read once per key, into shared memory, so the kernel never cares. Per tile::

    1. page id + in-page offset of each key      -> page_s, off_s   (shared)
    2. K, V rows of the tile, as float32          -> k_s, v_s        (shared)
       (float16 widened; 8-bit codes: int8 converted or fp8 looked up in
       ``lut``, times the token's scale)
    3. thread (r, n) computes score s[r, n] = q[r] . k[n]   (q pre-scaled)
       row max and row sum over the TILE_N lanes of a row: warp shuffles
       (the TILE_N lanes of a row are adjacent in one warp)
       online softmax: m_new = max(m, max_n s), l = l * exp(m - m_new) + sum p
    4. thread t owns output columns d = t, t + THREADS: acc[r, d] rescaled by
       alpha[r] = exp(m_old - m_new), then += sum_n p[r, n] * v[n, d]

The running max starts at a finite sentinel (``-1e30``), never ``-inf``, so
``exp(m_old - m_new)`` is never ``exp(-inf - -inf) = nan``. Keys outside a
row's causal/sliding window get probability exactly 0, and K/V values of
positions past ``seq_len`` are never loaded (they may be NaN garbage).

Attention sinks: with ``sinks > 0`` the block walks the sink keys the window
leaves out (``[0, min(sinks, kv_lo))``) before the window's, as if they stood
just before it: tile key ``n`` is position ``n`` below ``n_sink``, else
``kv_lo + n - n_sink``. A row scores a sink outside its own window with the
sinks' query ``qs`` (staged beside ``q``), anything else with ``q``.

Split-K: for decode with few sequences, ``B * num_kv_heads`` blocks do not fill
a GPU. The grid's third axis cuts each row tile's keys into ``num_splits``
ranges; each writes a partial output normalised by its own sum plus its
log-sum-exp, and :func:`merge_splits_kernel` combines them (FlashDecoding,
vLLM's paged attention v2). Log-sum-exp ``-inf`` marks an empty split.

Simplifications compared with vLLM/FlashInfer kernels: scalar (not vectorised)
loads, no tensor cores, a fixed tile shape for every head_dim up to
``MAX_HEAD_DIM``, and K and V tiles loaded together rather than pipelined.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32

# ---------------------------------------------------------------------------
# Compile-time tile shape. cuda.shared.array needs constant shapes, so these
# are module constants; numba_cuda.py refuses head_dim > MAX_HEAD_DIM.
# ---------------------------------------------------------------------------
TILE_N = 16                          # keys per tile (= the lanes that share a row)
ROWS = 8                             # (query, head) rows per block
THREADS = ROWS * TILE_N              # 128 threads = 4 warps per block
MAX_HEAD_DIM = 256
PAD = MAX_HEAD_DIM + 1               # row stride of shared tiles: +1 float so the
                                     # 16 lanes reading k_s[n, d] hit 16 banks
D_PER_THREAD = MAX_HEAD_DIM // THREADS  # output columns each thread owns (2)
SENTINEL = -1e30                     # finite "minus infinity" for running maxima
FULL_MASK = 0xFFFFFFFF               # every lane of the warp takes part in a shuffle


# ---------------------------------------------------------------------------
# Scalar helpers. Spelled out rather than the builtins min/max, whose typing in
# Numba's CUDA target goes through a generic overload that fails to compile
# for device code in some Numba versions.
# ---------------------------------------------------------------------------
@cuda.jit(device=True)
def _max(a, b):
    return a if a > b else b


@cuda.jit(device=True)
def _min(a, b):
    return a if a < b else b


@cuda.jit(device=True)
def _key_pos(idx, n_sink, kv_lo):
    """Position of a block's ``idx``-th key: the ``n_sink`` sinks first, then the window."""
    return idx if idx < n_sink else kv_lo + idx - n_sink


@cuda.jit(device=True)
def _widen(x, scales, page, kh, off, lut, codes):
    """One page element as float32: itself, or an 8-bit code times its token's scale.

    ``lut[int32(x)]`` types for every page dtype but runs only for fp8 codes.
    """
    if codes == 0:
        return float32(x)
    if codes == 2:
        return lut[int32(x)] * scales[page, kh, off]
    return float32(x) * scales[page, kh, off]


# ---------------------------------------------------------------------------
# Warp reductions over the TILE_N lanes of one row: a butterfly of xor
# shuffles (offsets 8, 4, 2, 1), after which every lane holds the result.
# Called by every thread of the block at the same point (uniform control flow).
# ---------------------------------------------------------------------------
@cuda.jit(device=True)
def _row_max(x):
    offset = TILE_N // 2
    while offset > 0:
        x = _max(x, cuda.shfl_xor_sync(FULL_MASK, x, offset))
        offset //= 2
    return x


@cuda.jit(device=True)
def _row_sum(x):
    offset = TILE_N // 2
    while offset > 0:
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
        offset //= 2
    return x


@cuda.jit
def paged_attention_kernel(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc,
                           work_seq, work_row0, scale, window, group, out_part, lse_part,
                           k_scales, v_scales, lut, codes, qs, sinks, k_transposed):
    """Grid ``(num_work, num_kv_heads, num_splits)``, ``THREADS`` threads per block.

    q          float32 [T, num_heads, head_dim]
    k/v_pages  float32|float16|int8|uint8 [num_pages, num_kv_heads, page_size, head_dim]
               (k_pages [num_pages, num_kv_heads, head_dim, page_size] if k_transposed)
    k/v_scales float32 [num_pages, num_kv_heads, page_size] (read when codes > 0)
    lut        float32 [256]: fp8 e4m3 code -> value (read when codes == 2)
    codes      0: float pages, 1: int8 codes, 2: fp8 e4m3 codes
    qs         float32 like q: the queries that score the sinks out of their window
    sinks      int: the first keys every query sees (0: none)
    k_transposed  int: 1 when K pages are kv_layout "k_transposed"
    work_seq   int32 [num_work]: the sequence of each row tile
    work_row0  int32 [num_work]: its first row (row = query * group + head)
    out_part   float32 [num_splits, T, num_heads, head_dim] (normalised per split)
    lse_part   float32 [num_splits, T, num_heads] (-inf: split saw no key)
    """
    w = cuda.blockIdx.x
    kh = cuda.blockIdx.y                 # kv head
    split = cuda.blockIdx.z
    num_splits = cuda.gridDim.z
    tid = cuda.threadIdx.x
    r = tid // TILE_N                    # score phase: this thread is (row r, key n)
    n = tid - r * TILE_N
    head_dim = q.shape[2]
    page_size = v_pages.shape[2]

    b = work_seq[w]
    row0 = work_row0[w]
    seq_len = seq_lens[b]
    q0 = query_start_loc[b]
    n_q = query_start_loc[b + 1] - q0
    n_rows = _min(ROWS, n_q * group - row0)      # rows of this tile (last tile: fewer)
    first = seq_len - n_q                       # position of query 0

    # This thread's row -> query i -> position. Rows past n_rows never count.
    my_row = row0 + _min(r, n_rows - 1)
    pos = first + my_row // group
    # Keys the block needs: the union of its rows' windows.
    kv_hi = first + (row0 + n_rows - 1) // group + 1
    kv_lo = 0
    if window > 0:
        kv_lo = _max(0, first + row0 // group - window + 1)
    n_sink = _min(sinks, kv_lo)          # sinks no row's window starts at: walked first
    n_tiles = (n_sink + kv_hi - kv_lo + TILE_N - 1) // TILE_N
    per_split = (n_tiles + num_splits - 1) // num_splits
    t_begin = split * per_split
    t_end = _min(n_tiles, t_begin + per_split)

    q_s = cuda.shared.array((ROWS, PAD), float32)        # scaled queries
    qs_s = cuda.shared.array((ROWS, PAD), float32)       # scaled sinks' queries
    k_s = cuda.shared.array((TILE_N, PAD), float32)      # K tile, as float32
    v_s = cuda.shared.array((TILE_N, PAD), float32)      # V tile, as float32
    p_s = cuda.shared.array((ROWS, TILE_N), float32)     # probabilities of the tile
    alpha_s = cuda.shared.array(ROWS, float32)           # rescale of each row's acc
    l_s = cuda.shared.array(ROWS, float32)               # final row sums
    m_s = cuda.shared.array(ROWS, float32)               # final row maxima
    page_s = cuda.shared.array(TILE_N, int32)            # page id of each key (-1: none)
    off_s = cuda.shared.array(TILE_N, int32)             # its offset in the page

    # Stage the block's queries once, pre-multiplied by the softmax scale.
    for idx in range(tid, ROWS * head_dim, THREADS):
        rr = idx // head_dim
        d = idx - rr * head_dim
        if rr < n_rows:
            row = row0 + rr
            i = row // group
            q_s[rr, d] = q[q0 + i, kh * group + row - i * group, d] * scale
            qs_s[rr, d] = qs[q0 + i, kh * group + row - i * group, d] * scale
        else:
            q_s[rr, d] = 0.0
            qs_s[rr, d] = 0.0

    m_run = float32(SENTINEL)            # running max of row r (same in its 16 lanes)
    l_run = float32(0.0)                 # running sum of exp(s - m_run)
    acc = cuda.local.array((ROWS, D_PER_THREAD), float32)   # un-normalised output
    for rr in range(ROWS):
        for jj in range(D_PER_THREAD):
            acc[rr, jj] = 0.0

    for tile in range(t_begin, t_end):
        start = tile * TILE_N            # index among the block's keys: sinks, then window
        # 1. Where each key of the tile lives: one block-table read per key.
        if tid < TILE_N:
            j = _key_pos(start + tid, n_sink, kv_lo)
            if j < kv_hi:
                logical = j // page_size
                page_s[tid] = block_tables[b, logical]
                off_s[tid] = j - logical * page_size
            else:
                page_s[tid] = -1
        cuda.syncthreads()
        # 2. Stage K and V rows (consecutive threads read consecutive d: coalesced).
        for idx in range(tid, TILE_N * head_dim, THREADS):
            nn = idx // head_dim
            d = idx - nn * head_dim
            page = page_s[nn]
            if page >= 0:
                off = off_s[nn]
                if k_transposed:         # [D, page_size] tiles: a strided read
                    kx = k_pages[page, kh, d, off]
                else:
                    kx = k_pages[page, kh, off, d]
                k_s[nn, d] = _widen(kx, k_scales, page, kh, off, lut, codes)
                v_s[nn, d] = _widen(v_pages[page, kh, off, d], v_scales, page, kh, off, lut,
                                    codes)
            else:
                k_s[nn, d] = 0.0         # never read the slots past seq_len
                v_s[nn, d] = 0.0
        cuda.syncthreads()
        # 3. Score of (row r, key n), then the online softmax of row r.
        j = _key_pos(start + n, n_sink, kv_lo)
        in_window = window == 0 or j > pos - window
        valid = r < n_rows and j < kv_hi and j <= pos and (in_window or j < sinks)
        s = float32(SENTINEL)
        if valid:
            dot = float32(0.0)
            if in_window:
                for d in range(head_dim):
                    dot += q_s[r, d] * k_s[n, d]
            else:                        # a sink the window leaves out
                for d in range(head_dim):
                    dot += qs_s[r, d] * k_s[n, d]
            s = dot
        m_new = _max(m_run, _row_max(s))
        p = float32(0.0)
        if valid:
            p = math.exp(s - m_new)
        l_tile = _row_sum(p)
        alpha = math.exp(m_run - m_new)  # 0 when the old max was the sentinel
        l_run = l_run * alpha + l_tile
        m_run = m_new
        p_s[r, n] = p
        if n == 0:
            alpha_s[r] = alpha
        cuda.syncthreads()
        # 4. acc[r, d] = acc[r, d] * alpha[r] + sum_n p[r, n] * v[n, d]
        for jj in range(D_PER_THREAD):
            d = tid + jj * THREADS
            if d < head_dim:
                for rr in range(ROWS):
                    acc[rr, jj] *= alpha_s[rr]
                for nn in range(TILE_N):
                    vv = v_s[nn, d]
                    for rr in range(ROWS):
                        acc[rr, jj] += p_s[rr, nn] * vv

    # Hand each row's (max, sum) from the score layout to the output layout.
    if n == 0:
        m_s[r] = m_run
        l_s[r] = l_run
    cuda.syncthreads()
    for rr in range(ROWS):
        if rr < n_rows:
            row = row0 + rr
            i = row // group
            t = q0 + i
            h = kh * group + row - i * group
            l_row = l_s[rr]
            inv = float32(0.0)
            if l_row > 0.0:
                inv = float32(1.0) / l_row
            for jj in range(D_PER_THREAD):
                d = tid + jj * THREADS
                if d < head_dim:
                    out_part[split, t, h, d] = acc[rr, jj] * inv
            if tid == 0:
                if l_row > 0.0:
                    lse_part[split, t, h] = m_s[rr] + math.log(l_row)
                else:
                    lse_part[split, t, h] = -math.inf


@cuda.jit
def merge_splits_kernel(out_part, lse_part, out, lse):
    """Grid ``(T, num_heads)``, ``THREADS`` threads over head_dim.

    out = sum_s exp(lse_s - m) * out_s / sum_s exp(lse_s - m), with m = max_s lse_s;
    lse = m + log(sum_s exp(lse_s - m)). A split with lse -inf weighs 0.
    """
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    num_splits = lse_part.shape[0]
    head_dim = out.shape[2]
    m = float32(SENTINEL)
    for s in range(num_splits):
        m = _max(m, lse_part[s, t, h])
    total = float32(0.0)
    for s in range(num_splits):
        total += math.exp(lse_part[s, t, h] - m)
    for d in range(cuda.threadIdx.x, head_dim, THREADS):
        acc = float32(0.0)
        for s in range(num_splits):
            acc += math.exp(lse_part[s, t, h] - m) * out_part[s, t, h, d]
        out[t, h, d] = acc / total if total > 0.0 else 0.0
    if cuda.threadIdx.x == 0:
        lse[t, h] = m + math.log(total) if total > 0.0 else -math.inf


@cuda.jit
def reshape_and_cache_kernel(k_pages, v_pages, slots, k, v, k_transposed):
    """Scatter ``k, v [n, num_kv_heads, head_dim]`` into their slots (vLLM's name).

    Grid-stride loop over the n * num_kv_heads * head_dim elements; slot -1 is
    skipped (padding). Storing float32 into float16 pages rounds to nearest.
    ``k_transposed`` (1): K pages are ``[.., head_dim, page_size]``, K goes to column ``off``.
    """
    n_tok, n_heads, head_dim = k.shape
    page_size = v_pages.shape[2]
    per_token = n_heads * head_dim
    idx = cuda.grid(1)
    while idx < n_tok * per_token:
        i = idx // per_token
        rest = idx - i * per_token
        h = rest // head_dim
        d = rest - h * head_dim
        slot = slots[i]
        if slot >= 0:
            page = slot // page_size
            off = slot - page * page_size
            if k_transposed:
                k_pages[page, h, d, off] = k[i, h, d]
            else:
                k_pages[page, h, off, d] = k[i, h, d]
            v_pages[page, h, off, d] = v[i, h, d]
        idx += cuda.gridsize(1)


@cuda.jit
def copy_pages_kernel(arena, src, dst):
    """Copy page ``src[i]`` onto page ``dst[i]`` in every layer, K and V.

    arena [num_layers, 2, num_pages, num_kv_heads, page_size, head_dim];
    grid ``(len(src), num_layers * 2)``: one block per page pair and (layer, K|V).
    """
    pair = cuda.blockIdx.x
    layer = cuda.blockIdx.y // 2
    kv = cuda.blockIdx.y - layer * 2
    a = src[pair]
    b = dst[pair]
    page_size = arena.shape[4]
    head_dim = arena.shape[5]
    per_head = page_size * head_dim
    for idx in range(cuda.threadIdx.x, arena.shape[3] * per_head, cuda.blockDim.x):
        h = idx // per_head
        rest = idx - h * per_head
        o = rest // head_dim
        d = rest - o * head_dim
        arena[layer, kv, b, h, o, d] = arena[layer, kv, a, h, o, d]


@cuda.jit
def fill_zero_kernel(flat):
    """``flat[:] = 0`` for a 1-d device array (grid-stride loop)."""
    idx = cuda.grid(1)
    while idx < flat.shape[0]:
        flat[idx] = 0
        idx += cuda.gridsize(1)
