"""Numba kernels over the repacked quantized layout of :mod:`.matrix`.

The layout (built once, on load): output rows are taken in groups of
``LANES`` (64) consecutive rows, and for each group and each 32-weight block the group's
quantized values are stored side by side::

    Q4: qs uint8 [G, nb, 16, LANES]   byte (j, r) = row r's weight j (low nibble)
                                                    and weight j + 16 (high nibble)
    Q8: qs int8  [G, nb, 32, LANES]   row r's weight j
        d, m float32 [G, nb, LANES]   row r's block scale (and minimum)

so the innermost loop runs across *rows*: one input value ``x[j]`` is
broadcast and multiplied into 16 of a group's rows at once, a SIMD
multiply-add whose lanes never need to be summed together. The block's scale
is then a vector too (the group's scales), applied once per block::

    y[r] = sum_b ( d[b, r] * sum_j q[b, j, r] * x[b, j]  +  m[b, r] * sum_j x[b, j] )

(The obvious loop, one row at a time, must add its 32 products into one
number at every block before it can scale them, and that horizontal sum stops
the vectorisation: 2 GB/s instead of the memory's 10-20.)

Both kernels compute that formula for every row with the same operations in
the same order, whatever the number of rows: the codes as float32 (exact),
``s = fma(code_j, x_j, s)`` over a block's 32 codes, then
``acc = fma(d, s, acc)`` (Q4: and ``acc = fma(m, sum x, acc)``), all through
:mod:`.simd`'s exact vector operations, with the inputs prepared once by
:func:`inputs`. So a row's result has the same bits alone and in a batch (a
speculative verify step's rows are its decode rows, ``tests/test_quant.py``).

Kernels (all take checked, contiguous arrays; :mod:`.matrix` validates):

- ``rows``: 1-3 input rows (decode at batch 1, a few decodes, a verify step
  with one or two drafts), parallel over row groups: the group's blocks come
  from memory once per call, and each code converted in registers feeds all
  the rows;
- ``batch``: 4 or more rows (a batch of decodes, a speculative verify
  step, prefill), parallel over strips of 16 output lanes (a group may be split
  between two threads, so 9 groups still share 2 threads evenly): each block's
  codes are multiplied into up to ``BATCH`` rows, 3-5 rows x 16 output rows per
  pass with the sums in registers (:func:`.passes.pass_rows`); the block's first pass
  converts the codes as it multiplies them and keeps them in a float32 tile
  ``[32, LANES]`` in L1 for the passes after it, while the next block's codes are
  requested into L2 (:mod:`.passes`);
- ``*_embed``: dequantize whole rows (token embedding lookup).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..config import JIT_OPTIONS
from ..errors import ShapeError
from .passes import block_passes, prefetch_block
from .passes import scale_into as _scale_into
from .simd import (
    byte_codes_f32,
    fma,
    int8_codes_f32,
    load_f32,
    low_codes_f32,
    mul,
    splat,
    store_f32,
    sub,
    zeros_f32,
    zip_high,
    zip_low,
)

#: Output rows per group: four 16-lane vectors. (Matrices whose row count is a multiple
#: of 128 had groups of 128 while LLVM vectorised these loops, where a longer loop paid
#: its entry cost less often; with explicit vectors and the first pass converting the
#: codes, 64 is 2-5% faster at 9 rows and 1-3% at one: the "128 lanes" column of
#: ``benchmarks/quant_kernels_avx2.md``.)
LANES = 64
#: Input rows that share one block's codes tile in ``batch`` (their accumulators: 4 KiB
#: of L1 at 64 lanes).
BATCH = 16


@njit(**JIT_OPTIONS)
def inputs(x, q4):
    """``x`` float32 [T, K] -> ``(xp, xs)``: what both kernels multiply by.

    Q8: ``xp`` is ``x``, ``xs`` empty. Q4: a byte holds weights ``j`` (low nibble) and
    ``j + 16`` (high) of a block, byte = lo + 16 hi, so lo x_l + hi x_h =
    lo (x_l - x_h/16) + byte x_h/16, which needs no shift. ``xp`` holds those two
    factors interleaved, ``xp[t, 32 b + 2 j] = x_l - x_h/16`` and ``xp[t, 32 b + 2 j + 1]
    = x_h/16``, in the order the kernels take the codes; ``xs`` [T, K/32] the blocks'
    sums of ``x`` (the minimum's term). Computed once per product, outside the kernels,
    so that ``rows`` and ``batch`` multiply by the same bits.
    """
    T, K = x.shape
    if not q4:
        return x, np.zeros((T, 0), np.float32)
    xp = np.empty_like(x)
    xs = np.empty((T, K // 32), np.float32)
    sixteenth = splat(np.float32(0.0625))
    for t in range(T):
        for b in range(K // 32):
            o = b * 32
            s = np.float32(0.0)
            for j in range(32):
                s += x[t, o + j]
            xs[t, b] = s
            # x_h / 16 is exact, so x_l - x_h / 16 is rounded once, as an fma would
            # round it. Sixteen of each at a time, then interleaved (as one loop of
            # scalar pairs, this took 2.5x longer at 9 rows).
            f = t * K + o                                            # flat index of x[t, o]
            xh = mul(load_f32(x, f + 16), sixteenth)
            xl = sub(load_f32(x, f), xh)
            store_f32(xp, f, zip_low(xl, xh))
            store_f32(xp, f + 16, zip_high(xl, xh))
    return xp, xs


@njit(inline="always", **JIT_OPTIONS)
def _block_dot(qf, qb, R, c, xp, t, o, q4):
    """One block of one input row, 64 output lanes from ``c`` as four 16-lane sums:
    ``sum_j code_j xp[t, o + j]`` over the block's 32 codes, one fma after the other in
    each lane. ``qb``: the block's first byte in ``qf`` (the flat ``qs``). Four sums, not
    one, so that four chains of fmas run side by side (one alone waits on each fma's
    latency: one cold pass over the matrices at one row measured 1.1-1.2x slower)."""
    s0 = s1 = s2 = s3 = zeros_f32()
    if q4:
        for j in range(16):
            p = qb + j * R + c
            xl, xh = splat(xp[t, o + 2 * j]), splat(xp[t, o + 2 * j + 1])
            s0 = fma(byte_codes_f32(qf, p), xh, fma(low_codes_f32(qf, p), xl, s0))
            s1 = fma(byte_codes_f32(qf, p + 16), xh, fma(low_codes_f32(qf, p + 16), xl, s1))
            s2 = fma(byte_codes_f32(qf, p + 32), xh, fma(low_codes_f32(qf, p + 32), xl, s2))
            s3 = fma(byte_codes_f32(qf, p + 48), xh, fma(low_codes_f32(qf, p + 48), xl, s3))
    else:
        for j in range(32):
            p = qb + j * R + c
            xj = splat(xp[t, o + j])
            s0 = fma(int8_codes_f32(qf, p), xj, s0)
            s1 = fma(int8_codes_f32(qf, p + 16), xj, s1)
            s2 = fma(int8_codes_f32(qf, p + 32), xj, s2)
            s3 = fma(int8_codes_f32(qf, p + 48), xj, s3)
    return s0, s1, s2, s3


@njit(inline="always", **JIT_OPTIONS)
def _block_dot2(qf, qb, R, c, xp, t, o, q4):
    """:func:`_block_dot` for input rows ``t`` and ``t + 1`` at once, over 32 output lanes
    from ``c`` (two 16-lane sums a row): each 16 codes converted once for both rows. Four
    chains again, now two rows x two; 32 lanes, not 64, so that the sums, one 16-lane run
    of codes and the inputs fit AVX2's 16 registers."""
    a0 = a1 = b0 = b1 = zeros_f32()
    if q4:
        for j in range(16):
            p = qb + j * R + c
            xl0, xh0 = splat(xp[t, o + 2 * j]), splat(xp[t, o + 2 * j + 1])
            xl1, xh1 = splat(xp[t + 1, o + 2 * j]), splat(xp[t + 1, o + 2 * j + 1])
            lo, by = low_codes_f32(qf, p), byte_codes_f32(qf, p)
            a0 = fma(by, xh0, fma(lo, xl0, a0))
            b0 = fma(by, xh1, fma(lo, xl1, b0))
            lo, by = low_codes_f32(qf, p + 16), byte_codes_f32(qf, p + 16)
            a1 = fma(by, xh0, fma(lo, xl0, a1))
            b1 = fma(by, xh1, fma(lo, xl1, b1))
    else:
        for j in range(32):
            p = qb + j * R + c
            x0, x1 = splat(xp[t, o + j]), splat(xp[t + 1, o + j])
            w = int8_codes_f32(qf, p)
            a0 = fma(w, x0, a0)
            b0 = fma(w, x1, b0)
            w = int8_codes_f32(qf, p + 16)
            a1 = fma(w, x0, a1)
            b1 = fma(w, x1, b1)
    return a0, a1, b0, b1


@njit(inline="always", **JIT_OPTIONS)
def _block_dot3(qf, qb, R, c, xp, t, o, q4):
    """:func:`_block_dot` for input rows ``t`` to ``t + 2`` at once, over 16 output lanes
    from ``c``: each 16 codes converted once for the three rows (three chains)."""
    a = b = e = zeros_f32()
    if q4:
        for j in range(16):
            p = qb + j * R + c
            lo, by = low_codes_f32(qf, p), byte_codes_f32(qf, p)
            a = fma(by, splat(xp[t, o + 2 * j + 1]), fma(lo, splat(xp[t, o + 2 * j]), a))
            b = fma(by, splat(xp[t + 1, o + 2 * j + 1]), fma(lo, splat(xp[t + 1, o + 2 * j]), b))
            e = fma(by, splat(xp[t + 2, o + 2 * j + 1]), fma(lo, splat(xp[t + 2, o + 2 * j]), e))
    else:
        for j in range(32):
            w = int8_codes_f32(qf, qb + j * R + c)
            a = fma(w, splat(xp[t, o + j]), a)
            b = fma(w, splat(xp[t + 1, o + j]), b)
            e = fma(w, splat(xp[t + 2, o + j]), e)
    return a, b, e


@njit(parallel=True, **JIT_OPTIONS)
def rows(qs, d, m, xp, xs, y):
    """Q4 (``m`` its minimums) or Q8 (``m`` None) times ``(xp, xs) = inputs(x)`` for
    ``x`` float32 [T, K] (T = 1 to 3) -> ``y`` [T, G*LANES].

    Parallel over row groups. A group's blocks (``nb * 16 * LANES`` bytes for Q4: 18 KiB
    for K = 576 at 64 lanes) are read from memory once; the codes are converted in
    registers and each conversion feeds all T input rows (:func:`_block_dot`,
    :func:`_block_dot2`, :func:`_block_dot3`). At T = 1 this is the decode's
    matrix-vector product; at 2 and 3, a few decodes or a verify step with one or two
    drafts (one pass over SmolLM2's matrices at 2 and 3 rows took 1.7x and 2.3x one
    row's time with each row converting the codes again, 1.2x and 1.5x sharing them:
    ``benchmarks/quant_kernels_avx2.md``).
    """
    G, nb, J, R = qs.shape
    T, N = xp.shape[0], y.shape[1]
    if T > 3:
        raise ShapeError("x: rows takes 1 to 3 input rows")
    q4 = m is not None
    qf, df = qs.reshape(qs.size), d.reshape(d.size)
    mf = m.reshape(m.size) if q4 else df
    yf = y.reshape(y.size)
    for g in prange(G):
        acc = np.zeros(T * R, np.float32)
        for b in range(nb):
            qb, so, o = (g * nb + b) * J * R, (g * nb + b) * R, b * 32
            if T == 1:
                for c in range(0, R, 64):
                    s0, s1, s2, s3 = _block_dot(qf, qb, R, c, xp, 0, o, q4)
                    _scale_into(acc, c, s0, df, mf, so + c, xs, 0, b, q4)
                    _scale_into(acc, c + 16, s1, df, mf, so + c + 16, xs, 0, b, q4)
                    _scale_into(acc, c + 32, s2, df, mf, so + c + 32, xs, 0, b, q4)
                    _scale_into(acc, c + 48, s3, df, mf, so + c + 48, xs, 0, b, q4)
            elif T == 2:
                for c in range(0, R, 32):
                    a0, a1, b0, b1 = _block_dot2(qf, qb, R, c, xp, 0, o, q4)
                    _scale_into(acc, c, a0, df, mf, so + c, xs, 0, b, q4)
                    _scale_into(acc, c + 16, a1, df, mf, so + c + 16, xs, 0, b, q4)
                    _scale_into(acc, R + c, b0, df, mf, so + c, xs, 1, b, q4)
                    _scale_into(acc, R + c + 16, b1, df, mf, so + c + 16, xs, 1, b, q4)
            else:
                for c in range(0, R, 16):
                    r0, r1, r2 = _block_dot3(qf, qb, R, c, xp, 0, o, q4)
                    _scale_into(acc, c, r0, df, mf, so + c, xs, 0, b, q4)
                    _scale_into(acc, R + c, r1, df, mf, so + c, xs, 1, b, q4)
                    _scale_into(acc, 2 * R + c, r2, df, mf, so + c, xs, 2, b, q4)
        for t in range(T):
            yf[t * N + g * R:t * N + (g + 1) * R] = acc[t * R:(t + 1) * R]


@njit(parallel=True, **JIT_OPTIONS)
def batch(qs, d, m, xp, xs, y, parts):
    """:func:`rows` for T >= 4 input rows: ``(xp, xs) = inputs(x)`` -> ``y`` [T, G*LANES].

    Each block's codes are converted to float32 once into a tile ``[32, LANES]`` (8 KiB at
    64 lanes, in L1) and multiplied into up to ``BATCH`` input rows, in chunks of
    near-equal sizes (17 rows: 9 + 8) so that every chunk splits into passes of 3-5
    (:func:`.passes.pass_rows`); their accumulators ``acc`` [BATCH, LANES] stay in L1 too.
    Numba compiles one version per format (``m is None`` is decided when it compiles).

    ``parts``: how many near-equal runs of 16-lane strips the output lanes are cut into,
    one per thread (:mod:`.matrix` passes ``numba.get_num_threads()``; read in here, it
    would keep Numba from caching the kernel). Whole groups gave SmolLM2's 576-row
    matrices, 9 groups, 5 to one thread and 4 to the other; four parts a thread, cut
    inside more groups, measured 2% slower than one. A lane's arithmetic does not depend
    on its neighbours, so any cut gives the same bits.
    """
    G, nb, J, R = qs.shape
    T, N = xp.shape[0], y.shape[1]
    if T < 4:
        raise ShapeError("x: batch needs at least 4 input rows")
    q4 = m is not None
    qf, df = qs.reshape(qs.size), d.reshape(d.size)
    mf = m.reshape(m.size) if q4 else df
    yf = y.reshape(y.size)
    chunks = -(-T // BATCH)
    strips = R // 16                                             # per group
    parts = max(1, min(parts, G * strips))
    for part in prange(parts):
        wf = np.empty(32 * R, np.float32)
        acc = np.empty(BATCH * R, np.float32)
        s_lo, s_hi = part * G * strips // parts, (part + 1) * G * strips // parts
        for g in range(s_lo // strips, (s_hi - 1) // strips + 1):
            c_lo = (max(s_lo, g * strips) - g * strips) * 16     # this part's lanes of g
            c_hi = (min(s_hi, (g + 1) * strips) - g * strips) * 16
            for k in range(chunks):
                t0, t1 = k * T // chunks, (k + 1) * T // chunks
                acc[:] = 0.0
                for b in range(nb):
                    qb, so = (g * nb + b) * J * R, (g * nb + b) * R
                    prefetch_block(qf, qb + J * R, J, R, c_lo, c_hi)    # the next block
                    block_passes(qf, qb, wf, R, xp, acc, t0, t1, c_lo, c_hi, df, mf, so, xs,
                                  b, q4)
                for t in range(t0, t1):
                    o, a = t * N + g * R, (t - t0) * R
                    yf[o + c_lo:o + c_hi] = acc[a + c_lo:a + c_hi]


@njit(**JIT_OPTIONS)
def q4_embed(qs, d, m, ids, out):
    """Rows ``ids`` (checked: 0 <= id < rows) of a Q4 matrix -> ``out`` float32 [T, K]."""
    nb, R = qs.shape[1], qs.shape[3]
    for t in range(ids.shape[0]):
        g, r = ids[t] // R, ids[t] % R
        for b in range(nb):
            for j in range(16):
                q = qs[g, b, j, r]
                out[t, b * 32 + j] = d[g, b, r] * np.float32(q & np.uint8(15)) + m[g, b, r]
                out[t, b * 32 + 16 + j] = d[g, b, r] * np.float32(q >> np.uint8(4)) + m[g, b, r]


@njit(**JIT_OPTIONS)
def q8_embed(qs, d, ids, out):
    """Rows ``ids`` (checked: 0 <= id < rows) of a Q8 matrix -> ``out`` float32 [T, K]."""
    nb, R = qs.shape[1], qs.shape[3]
    for t in range(ids.shape[0]):
        g, r = ids[t] // R, ids[t] % R
        for b in range(nb):
            for j in range(32):
                out[t, b * 32 + j] = d[g, b, r] * np.float32(qs[g, b, j, r])
