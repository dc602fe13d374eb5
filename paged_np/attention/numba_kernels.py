"""The small @njit helpers of the Numba paged attention kernel.

What it is for: the arithmetic of one *key block*, a block of query rows
against the tokens of a few consecutive pages of one kv head. Each page is a
contiguous ``[page_size, head_dim]`` slab of the arena (HND layout), read
where it lies. :mod:`paged_np.attention.numba_cpu` strings the blocks
together (the driver) and validates nothing: it relies on the public
``paged_attention`` for that.

How to read it, top to bottom:

- :func:`exp2`: the softmax in base 2 (the driver scales ``q`` by
  ``scale * log2(e)``), a branch-free polynomial that LLVM vectorises;
  ``np.exp`` would be a scalar libm call per score.
- :func:`~paged_np.attention.numba_widen.to_f32` (in :mod:`.numba_widen`):
  every page format widened to float32 as it is read: float16 pages arrive
  as ``uint16`` bits, int8 codes convert, fp8 e4m3 codes index a table.
- :func:`online_softmax_scaled`: with 8-bit pages, the softmax step also
  applies each token's scales, once per score (K) and once per weight (V),
  instead of once per element of the page.
- :func:`prefetch_rows`: while a page is being computed on, the same rows
  of the *next* page are requested into L2 (``prefetcht1``).
- :func:`tile_scores_4x4` / :func:`tile_scores_4x2` (``tile_scores`` is
  the one for this CPU, :func:`vector_registers`), :func:`mask_scores`,
  :func:`online_softmax`, :func:`accumulate_pv`: the four steps of a key
  block. Query rows come in fours (the driver pads with zero queries);
  each pass of the score tile keeps its running sums in vector registers,
  so every vector loaded from memory feeds several multiply-adds.

Why each trick is there, and what it measured (prefetch on and off, the
tile shapes, the time of each part), is in ``docs/concepts/kernels.md``,
with the numbers from ``benchmarks/kernel_ablation.py``.

``fastmath`` assumes there are no infinities, so nothing here starts at
``-inf``: the running max starts at :data:`EMPTY` (``-1e30``) and masked scores
are :data:`MASKED` (``-2e30``), whose ``exp2`` is exactly 0 even in a row that
has seen nothing yet.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import JIT_OPTIONS
from ..quant.simd import (
    CACHE_LINE,
    HAS_AVX512,
    add,
    lane,
    load_f32,
    maximum,
    prefetch_l2,
    splat,
    store_f32,
    zeros_f32,
)
from .numba_widen import to_f32

#: Running max of a row that has seen no key yet (finite: fastmath forbids inf).
EMPTY = np.float32(-1e30)
#: Score of a masked key; ``exp2(MASKED - EMPTY)`` is still exactly 0.
MASKED = np.float32(-2e30)
LOG2E = np.float32(1.4426950408889634)
LN2 = np.float32(0.6931471805599453)

# Taylor coefficients of 2**f = e**(f ln2) for f in [-0.5, 0.5]; degree 6 leaves
# a relative error near 1e-7, the size of float32 rounding.
_C1 = np.float32(0.6931471805599453)
_C2 = np.float32(0.2402265069591007)
_C3 = np.float32(0.05550410866482158)
_C4 = np.float32(0.009618129107628477)
_C5 = np.float32(0.0013333558146428443)
_C6 = np.float32(0.00015403530393381606)


@njit(**JIT_OPTIONS)
def exp2(x):
    """``2**x`` for ``x <= 0`` in float32; exactly 0 at and below ``-127``.

    No branch, so a loop of them vectorises: below -127 the input is clamped
    to -127, where ``2**n`` has all exponent bits 0 and the product is 0.
    """
    x = max(x, np.float32(-127.0))
    n = np.floor(x + np.float32(0.5))  # nearest integer: 2**x = 2**n * 2**f
    f = x - n  # f in [-0.5, 0.5]
    p = np.float32(1.0) + f * (_C1 + f * (_C2 + f * (_C3 + f * (_C4 + f * (_C5 + f * _C6)))))
    # 2**n built directly in the exponent bits of a float32 (n = -127 gives 0.0)
    two_n = np.uint32((np.int32(n) + 127) << 23).view(np.float32)
    return p * two_n


@njit(**JIT_OPTIONS)
def prefetch_rows(pages, pid, kvh, t0, t1):
    """Prefetch rows ``t0:t1`` of the tile ``pages[pid, kvh]`` into L2; nothing if ``pid < 0``.

    ``pages`` ``[num_pages, num_kv_heads, page_size, head_dim]`` is
    C-contiguous, so the rows are one run of ``(t1 - t0) * head_dim``
    elements: one prefetch per cache line.
    """
    if pid < 0:
        return
    D = pages.shape[3]
    start = ((pid * pages.shape[1] + kvh) * pages.shape[2] + t0) * D  # flat element offset
    for i in range(start, start + (t1 - t0) * D, CACHE_LINE // pages.itemsize):
        prefetch_l2(pages, i)


def vector_registers() -> int:
    """Vector registers of the target Numba compiles for: 32 with AVX-512, else 16.

    The quantized kernels' test (:data:`paged_np.quant.simd.HAS_AVX512`): the CPU
    features Numba hands LLVM, so ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` on
    an AVX-512 machine counts 16, like the AVX2 machine it imitates.
    """
    return 32 if HAS_AVX512 else 16


@njit(**JIT_OPTIONS)
def tile_scores_4x4(qt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid):
    """``s[r0:r1, col0:col0+n_keys] = qt[r0:r1] @ kp[pid, kvh, :n_keys].T``.

    While it reads keys ``t..t+3`` it prefetches rows ``t..t+3`` of the next
    page's tile ``kp[next_pid, kvh]`` (``next_pid < 0``: none), 32 cache lines
    for 128 multiply-adds, so the requests spread over the arithmetic.

    ``r1 - r0`` is a multiple of 4. Four rows x four keys per pass: each query
    element loaded feeds four dot products, and so does each key element, so
    a float16 key is widened once per four rows. The 16 running sums stay in
    vector registers; each is reduced (summed across its lanes) once.

    Keys always go in fours from the page's start: a last pass short of keys
    re-reads the page's last key and writes up to 3 columns past ``n_keys``
    (``s`` has :data:`SPARE_COLUMNS`; the next page or :func:`pad_block`
    overwrites them). So every score comes from the same instructions whether the
    page holds 5 keys or 16: a query's scores do not depend on the batch.
    """
    D = qt.shape[1]
    last = n_keys - 1
    for t in range(0, n_keys, 4):
        prefetch_rows(kp, next_pid, kvh, t, min(t + 4, n_keys))
        c = col0 + t
        t1, t2, t3 = min(t + 1, last), min(t + 2, last), min(t + 3, last)
        for r in range(r0, r1, 4):
            x00 = x01 = x02 = x03 = x10 = x11 = x12 = x13 = np.float32(0.0)
            x20 = x21 = x22 = x23 = x30 = x31 = x32 = x33 = np.float32(0.0)
            for d in range(D):  # x<key><row> += q[row, d] * k[key, d]
                q0, q1, q2, q3 = qt[r, d], qt[r + 1, d], qt[r + 2, d], qt[r + 3, d]
                k0 = to_f32(kp[pid, kvh, t, d])
                x00 += q0 * k0
                x01 += q1 * k0
                x02 += q2 * k0
                x03 += q3 * k0
                k1 = to_f32(kp[pid, kvh, t1, d])
                x10 += q0 * k1
                x11 += q1 * k1
                x12 += q2 * k1
                x13 += q3 * k1
                k2 = to_f32(kp[pid, kvh, t2, d])
                x20 += q0 * k2
                x21 += q1 * k2
                x22 += q2 * k2
                x23 += q3 * k2
                k3 = to_f32(kp[pid, kvh, t3, d])
                x30 += q0 * k3
                x31 += q1 * k3
                x32 += q2 * k3
                x33 += q3 * k3
            s[r, c], s[r, c + 1], s[r, c + 2], s[r, c + 3] = x00, x10, x20, x30
            s[r + 1, c], s[r + 1, c + 1], s[r + 1, c + 2], s[r + 1, c + 3] = x01, x11, x21, x31
            s[r + 2, c], s[r + 2, c + 1], s[r + 2, c + 2], s[r + 2, c + 3] = x02, x12, x22, x32
            s[r + 3, c], s[r + 3, c + 1], s[r + 3, c + 2], s[r + 3, c + 3] = x03, x13, x23, x33


@njit(**JIT_OPTIONS)
def tile_scores_4x2(qt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid):
    """:func:`tile_scores_4x4` in passes of four rows x two keys, for 16 vector registers.

    Four rows x four keys hold 16 running sums, plus four query vectors and a
    key: 21 registers. AVX2 has 16, so LLVM kept some sums on the stack and
    every pass stored and reloaded them (seen in ``inspect_asm``). Eight sums,
    four query vectors and two keys fit. Keys go in twos from the page's start
    (an odd page's last pass re-reads its last key), as 4x4 goes in fours.
    """
    D = qt.shape[1]
    last = n_keys - 1
    for t in range(0, n_keys, 2):
        prefetch_rows(kp, next_pid, kvh, t, min(t + 2, n_keys))
        c = col0 + t
        t1 = min(t + 1, last)
        for r in range(r0, r1, 4):
            x00 = x01 = x02 = x03 = x10 = x11 = x12 = x13 = np.float32(0.0)
            for d in range(D):  # x<key><row> += q[row, d] * k[key, d]
                q0, q1, q2, q3 = qt[r, d], qt[r + 1, d], qt[r + 2, d], qt[r + 3, d]
                k0 = to_f32(kp[pid, kvh, t, d])
                x00 += q0 * k0
                x01 += q1 * k0
                x02 += q2 * k0
                x03 += q3 * k0
                k1 = to_f32(kp[pid, kvh, t1, d])
                x10 += q0 * k1
                x11 += q1 * k1
                x12 += q2 * k1
                x13 += q3 * k1
            s[r, c], s[r, c + 1] = x00, x10
            s[r + 1, c], s[r + 1, c + 1] = x01, x11
            s[r + 2, c], s[r + 2, c + 1] = x02, x12
            s[r + 3, c], s[r + 3, c + 1] = x03, x13


#: The score tile of the target: ``s[r0:r1, col0:col0+n_keys] = qt[r0:r1] @ kp[pid, kvh].T``.
#: Chosen once per process from :func:`vector_registers` (Numba's cache keeps the
#: code of each target apart, so a cached AVX-512 build never runs on AVX2).
tile_scores = tile_scores_4x4 if vector_registers() == 32 else tile_scores_4x2


@njit(**JIT_OPTIONS)
def mask_scores(s, row_pos, n_rows, key_pos0, n_keys, window):
    """Set ``s[r, t] = MASKED`` where key ``key_pos0 + t`` is invisible to row ``r``.

    Causal: a key after the row's query position is masked. Sliding window:
    keys at or before ``row_pos - window`` are masked too.
    """
    for r in range(n_rows):  # each is one run of columns or two: no test per score
        p = row_pos[r]
        for t in range(max(0, p + 1 - key_pos0), n_keys):  # after the row's position
            s[r, t] = MASKED
        if window > 0:
            for t in range(min(n_keys, p - window + 1 - key_pos0)):  # at or before p - window
                s[r, t] = MASKED


@njit(**JIT_OPTIONS)
def mask_sink_scores(s, row_pos, n_rows, key_pos0, n_keys, window):
    """Attention sinks: mask the sink keys a row's window covers (``> row_pos - window``),
    which the window's own pass scores; the row sees the rest of them here."""
    for r in range(n_rows):
        for t in range(max(0, row_pos[r] - window + 1 - key_pos0), n_keys):
            s[r, t] = MASKED


#: Columns of the score scratch past a block: :func:`tile_scores` writes up to 3 past a
#: page's keys and :func:`pad_block` pads a block's keys to a multiple of :data:`LANES`.
SPARE_COLUMNS = 16
#: Running sums of a softmax row: one per lane of a 512-bit vector.
LANES = 16
#: Fast-math without reassociation, for the softmax's sums: LLVM may still vectorise the
#: lanes (independent sums) but may not regroup the additions of one lane, so appending
#: zeros to a row changes none of its bits.
NO_REASSOC = dict(JIT_OPTIONS, fastmath={"nnan", "ninf", "nsz", "arcp", "contract", "afn"})


@njit(**JIT_OPTIONS)
def pad_block(s, n_rows, n_keys):
    """Mask columns ``n_keys`` up to the next multiple of :data:`LANES`; returns that."""
    n16 = (n_keys + LANES - 1) // LANES * LANES
    for r in range(n_rows):
        for t in range(n_keys, n16):
            s[r, t] = MASKED
    return n16


@njit(inline="always", **NO_REASSOC)
def _lane_sum(s, r, n16, lanes):
    """``sum(s[r, :n16])`` as :data:`LANES` running sums (key ``t`` in lane ``t % 16``),
    then the lanes in order. Keys past a row's last visible one weigh exactly 0 and come
    last, so they add nothing to any lane: a decode row and the same row in a verify
    step, which sees more (masked) keys, get the same bits. The running sums are one
    16-lane vector (:mod:`paged_np.quant.simd`'s exact ``add``): as a loop over a
    scratch array, LLVM stored and reloaded them at every step (5x slower)."""
    row = r * s.shape[1]                                         # s is C-contiguous
    acc = zeros_f32()
    for t0 in range(0, n16, LANES):
        acc = add(acc, load_f32(s, row + t0))
    store_f32(lanes, 0, acc)
    total = np.float32(0.0)
    for i in range(LANES):
        total += lanes[i]
    return total


@njit(**JIT_OPTIONS)
def block_max(s, m, n_rows, n16, m_new):
    """``m_new[r] = max(m[r], max(s[r, :n16]))``, 16 lanes at a time. A maximum is exact
    in any order (only the sums forbid regrouping); as a plain loop LLVM kept it scalar."""
    W = s.shape[1]                                               # s is C-contiguous
    for r in range(n_rows):
        v = splat(m[r])
        for t0 in range(0, n16, LANES):
            v = maximum(v, load_f32(s, r * W + t0))
        x = m[r]
        for i in range(LANES):
            x = max(x, lane(v, i))
        m_new[r] = x


@njit(**JIT_OPTIONS)
def scale_scores(s, ksc, n_rows, n16, rows_per_head):
    """8-bit pages: ``s[r, t] *= ksc[head of r, t]`` where not :data:`MASKED`."""
    for r in range(n_rows):
        h = r // rows_per_head
        for t in range(n16):
            x = s[r, t]
            s[r, t] = x * ksc[h, t] if x != MASKED else x


@njit(**NO_REASSOC)
def online_softmax(s, m, l, acc, n_rows, n16, scratch):
    """Fold one block's scores into the running (max, sum); rescale ``acc``.

    ``n16``: the block's keys padded by :func:`pad_block`. On return ``s[r, :n16]``
    holds the weights ``p = 2**(s - m_new)`` that the ``p @ V`` step adds to the
    accumulator (0 for masked and padding keys). ``scratch`` float32
    ``[LANES + n_rows]``: the lane sums, then each row's new maximum.
    """
    D = acc.shape[1]
    lanes, m_new = scratch[:LANES], scratch[LANES:]
    block_max(s, m, n_rows, n16, m_new)
    for r in range(n_rows):
        mr = m_new[r]
        alpha = exp2(m[r] - mr)  # how much the old sum and acc shrink
        for t in range(n16):
            s[r, t] = exp2(s[r, t] - mr)
        m[r] = mr
        l[r] = l[r] * alpha + _lane_sum(s, r, n16, lanes)
        if alpha != 1.0:
            for d in range(D):
                acc[r, d] *= alpha


@njit(**NO_REASSOC)
def online_softmax_scaled(s, m, l, acc, n_rows, n16, ksc, vsc, rows_per_head, scratch):
    """:func:`online_softmax` for 8-bit pages, whose scores came from the codes.

    A score is ``q . (code * scale_k) = scale_k * (q . code)`` and a weight
    times a value row is ``p * (code * scale_v) = (p * scale_v) * code``, so
    each token's scales multiply its column once here: ``ksc, vsc`` ``[heads,
    n16]`` hold the block's scales of each kv head, and row ``r`` belongs to
    head ``r // rows_per_head``. Masked scores stay :data:`MASKED`. On return
    ``s[r, :n16]`` holds ``p * scale_v``; ``l`` sums the plain ``p``. (A separate
    pass over the block for the scales cost half the time of the int8 decode
    kernel at context 8192 when it was a kernel of its own; here it is one more
    loop over a block already in L1.)
    """
    scale_scores(s, ksc, n_rows, n16, rows_per_head)
    online_softmax(s, m, l, acc, n_rows, n16, scratch)
    for r in range(n_rows):
        h = r // rows_per_head
        for t in range(n16):
            s[r, t] *= vsc[h, t]


@njit(**JIT_OPTIONS)
def accumulate_pv(p, vp, pid, kvh, acc, r0, r1, col0, n_keys, next_pid):
    """``acc[r0:r1] += p[r0:r1, col0:col0+n_keys] @ vp[pid, kvh, :n_keys]``.

    Prefetches the next page's value tile ``vp[next_pid, kvh]`` as it goes,
    like :func:`tile_scores`.

    ``r1 - r0`` is even. Two rows x four keys per pass: each accumulator
    element is loaded and stored once per four keys, each (float16) value
    element widened once per two rows, and the eight weights plus four value
    vectors still fit in registers (four rows would spill: measured slower).
    Keys go in fours from the page's start; a last pass short of keys weighs
    the missing ones 0 (re-reading the last value row), so a row's sums are
    grouped alike whatever the number of keys after its own.
    """
    D = acc.shape[1]
    last = n_keys - 1
    zero = np.float32(0.0)
    for t in range(0, n_keys, 4):
        prefetch_rows(vp, next_pid, kvh, t, min(t + 4, n_keys))
        c = col0 + t
        t1, t2, t3 = min(t + 1, last), min(t + 2, last), min(t + 3, last)
        for r in range(r0, r1, 2):
            p00, p10 = p[r, c], p[r + 1, c]
            p01, p11 = (p[r, c + 1], p[r + 1, c + 1]) if t + 1 <= last else (zero, zero)
            p02, p12 = (p[r, c + 2], p[r + 1, c + 2]) if t + 2 <= last else (zero, zero)
            p03, p13 = (p[r, c + 3], p[r + 1, c + 3]) if t + 3 <= last else (zero, zero)
            for d in range(D):  # p<row><key>
                v0 = to_f32(vp[pid, kvh, t, d])
                v1 = to_f32(vp[pid, kvh, t1, d])
                v2 = to_f32(vp[pid, kvh, t2, d])
                v3 = to_f32(vp[pid, kvh, t3, d])
                acc[r, d] += (p00 * v0 + p01 * v1) + (p02 * v2 + p03 * v3)
                acc[r + 1, d] += (p10 * v0 + p11 * v1) + (p12 * v2 + p13 * v3)
