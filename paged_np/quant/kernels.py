"""Numba kernels over the repacked quantized layout of :mod:`.matrix`.

The layout (built once, on load): output rows are taken in groups of
``LANES`` (64, or ``WIDE_LANES``, 128, where the row count allows)
consecutive rows, and for each group and each 32-weight block the group's
quantized values are stored side by side::

    Q4: qs uint8 [G, nb, 16, LANES]   byte (j, r) = row r's weight j (low nibble)
                                                    and weight j + 16 (high nibble)
    Q8: qs int8  [G, nb, 32, LANES]   row r's weight j
        d, m float32 [G, nb, LANES]   row r's block scale (and minimum)

so the innermost loop runs across *rows*: one input value ``x[j]`` is
broadcast and multiplied into a group's rows at once, a SIMD multiply-add
whose lanes never need to be summed together. The block's scale is then a
vector too (the group's scales), applied once per block::

    y[r] = sum_b ( d[b, r] * sum_j q[b, j, r] * x[b, j]  +  m[b, r] * sum_j x[b, j] )

(The obvious loop, one row at a time, must add its 32 products into one
number at every block before it can scale them, and that horizontal sum stops
the vectorisation: 2 GB/s instead of the memory's 10-20.)

Kernels (all take checked, contiguous arrays; :mod:`.matrix` validates):

- ``rows``: 1-3 input rows (decode at batch 1, a few decodes), parallel
  over row groups: each row decodes the group's bytes as it multiplies, and
  the group's blocks come from memory once per call, from cache for the
  other rows (one kernel for 1 and for 3 rows: a separate matrix-vector
  kernel measured no faster, and each parallel kernel costs about 1.5 s of
  cold compile);
- ``batch``: 4 or more rows (a batch of decodes, a speculative verify
  step, prefill), parallel over row groups: each block is dequantized once
  into a float32 tile ``[32, LANES]`` in L1 and multiplied into up to
  ``BATCH`` rows, four rows per pass (:func:`_multiply_tile`);
- ``batch_registers``: the same with each pass's sums (3-5 input rows x 16
  output rows) in registers through a block, for AVX2's 16 vector registers
  (:data:`.matrix.BATCH_KERNEL` picks one of the two by the CPU);
- ``*_embed``: dequantize whole rows (token embedding lookup).

The loops read their trip counts from the arrays' shapes (not constants):
with a constant 16 or 32 LLVM unrolls the lane loop fully and vectorises the
wrong way (measured 2.5x slower).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..config import JIT_OPTIONS
from ..errors import ShapeError
from .simd import fma, load_f32, splat, store_f32

#: Output rows per group: the inner loop's length. LLVM vectorises it 16 float32 lanes
#: wide, 4 vectors per iteration (64 rows); every loop entry pays a fixed cost (trip
#: count, overlap checks between the arrays), so a longer loop does better: matrices
#: whose row count is a multiple of ``WIDE_LANES`` get 128 rows per group, the rest 64
#: (``benchmarks/quant_kernels.md`` times 64 rows everywhere against this).
LANES = 64
WIDE_LANES = 128
#: Input rows that share one dequantized block in ``*_batch`` (their accumulators:
#: 4 KiB of L1 at 64 lanes).
BATCH = 16


@njit(**JIT_OPTIONS)
def _block_sums(x):
    """``x`` float32 [T, K] -> per-block sums [T, K/32] (the minimum's term of Q4)."""
    T, K = x.shape
    nb = K // 32
    xs = np.empty((T, nb), np.float32)
    for t in range(T):
        for b in range(nb):
            s = np.float32(0.0)
            for j in range(32):
                s += x[t, b * 32 + j]
            xs[t, b] = s
    return xs


@njit(inline="always", **JIT_OPTIONS)                  # inlined into rows: no call per block
def dot_q4_block(qs, g, b, x, t, s):
    """``s[r] += sum_j q[g, b, j, r] * x[t, 32 b + j]`` over one Q4 block's 32 weights.

    Each byte holds weights ``j`` (low nibble) and ``j + 16`` (high): byte = lo + 16 hi,
    so lo x_l + hi x_h = lo (x_l - x_h/16) + byte x_h/16, which needs no shift
    (measured 1.2-1.5x faster than the plain form).
    """
    base = b * 32
    for j in range(16):
        xh = x[t, base + 16 + j] * np.float32(0.0625)
        xl = x[t, base + j] - xh
        row = qs[g, b, j]
        for r in range(row.shape[0]):
            q = row[r]
            s[r] += np.float32(q & np.uint8(15)) * xl + np.float32(q) * xh


@njit(inline="always", **JIT_OPTIONS)
def dot_q8_block(qs, g, b, x, t, s):
    """``s[r] += sum_j q[g, b, j, r] * x[t, 32 b + j]`` over one Q8 block's 32 weights."""
    base = b * 32
    for j in range(32):
        xj = x[t, base + j]
        row = qs[g, b, j]
        for r in range(row.shape[0]):
            s[r] += np.float32(row[r]) * xj


@njit(parallel=True, **JIT_OPTIONS)
def rows(qs, d, m, x, y):
    """Q4 (``m`` its minimums) or Q8 (``m`` None) times ``x`` float32 [T, K] (T = 1 to 3)
    -> ``y`` [T, G*LANES].

    Parallel over row groups. A group's blocks (``nb * 16 * LANES`` bytes for Q4: 18 KiB
    for K = 576 at 64 lanes) are read from memory once, by the first input row, and
    from L1/L2 by the others. At T = 1 this is the decode's matrix-vector product. Per
    block, the 32 products are summed in ``s`` and then scaled: ``d s`` (+ ``m`` times
    the block's sum of x, for Q4).
    """
    G, nb, _, R = qs.shape
    T = x.shape[0]
    if m is None:
        xs = np.zeros((0, 0), np.float32)
    else:
        xs = _block_sums(x)                                      # [T, nb]: Q4's m term
    for g in prange(G):
        acc = np.empty(R, np.float32)
        s = np.empty(R, np.float32)
        for t in range(T):
            acc[:] = 0.0
            for b in range(nb):
                s[:] = 0.0
                db = d[g, b]
                if m is None:
                    dot_q8_block(qs, g, b, x, t, s)
                    for r in range(R):
                        acc[r] += db[r] * s[r]
                else:
                    dot_q4_block(qs, g, b, x, t, s)
                    mb, xb = m[g, b], xs[t, b]
                    for r in range(R):
                        acc[r] += db[r] * s[r] + mb[r] * xb
            y[t, g * R:(g + 1) * R] = acc


@njit(**JIT_OPTIONS)
def dequantize_q4_block(qs, d, m, g, b, w):
    """Block ``b`` of row group ``g`` -> ``w`` float32 [32, LANES]: ``d * q + m``.

    The high nibble without a shift: ``byte - lo = 16 hi`` exactly, and
    ``(d / 16) (16 hi) = d hi`` exactly (a power of two), so each weight gets the same
    bits as ``d * hi + m``; Numba's ``uint8 >> 4`` became 64-bit shifts and a repack
    (measured 1.1-1.4x slower for the whole dequantization, on AVX2).
    """
    db, mb = d[g, b], m[g, b]
    for j in range(16):
        row, lo, hi = qs[g, b, j], w[j], w[j + 16]
        for r in range(row.shape[0]):
            q = np.int32(row[r])
            low = np.float32(q & np.int32(15))
            lo[r] = db[r] * low + mb[r]
            hi[r] = (db[r] * np.float32(0.0625)) * (np.float32(q) - low) + mb[r]


@njit(**JIT_OPTIONS)
def dequantize_q8_block(qs, d, g, b, w):
    """Block ``b`` of row group ``g`` -> ``w`` float32 [32, LANES]: ``d * q``."""
    db = d[g, b]
    for j in range(32):
        row, wj = qs[g, b, j], w[j]
        for r in range(row.shape[0]):
            wj[r] = db[r] * np.float32(row[r])


@njit(**JIT_OPTIONS)
def _multiply_tile(w, x, base, t0, t1, acc):
    """``acc[t - t0] += x[t, base:base+32] @ w`` for rows ``t0 <= t < t1``; ``w`` float32
    [32, LANES] is one dequantized block of a group's output rows.

    Four input rows at a time, four weights per pass: each weight vector loaded
    from the tile feeds four accumulators, and each accumulator is loaded and
    stored once per four products (``benchmarks/quant_kernels.py`` times it against
    one row and eight weights per pass).
    """
    R = w.shape[1]
    t = t0
    while t + 3 < t1:
        a0, a1, a2, a3 = acc[t - t0], acc[t - t0 + 1], acc[t - t0 + 2], acc[t - t0 + 3]
        for j in range(base, base + 32, 4):
            p0, p1, p2, p3 = x[t, j], x[t, j + 1], x[t, j + 2], x[t, j + 3]
            q0, q1, q2, q3 = x[t + 1, j], x[t + 1, j + 1], x[t + 1, j + 2], x[t + 1, j + 3]
            r0, r1, r2, r3 = x[t + 2, j], x[t + 2, j + 1], x[t + 2, j + 2], x[t + 2, j + 3]
            s0, s1, s2, s3 = x[t + 3, j], x[t + 3, j + 1], x[t + 3, j + 2], x[t + 3, j + 3]
            w0, w1, w2, w3 = w[j - base], w[j - base + 1], w[j - base + 2], w[j - base + 3]
            for r in range(R):
                v0, v1, v2, v3 = w0[r], w1[r], w2[r], w3[r]
                a0[r] += (v0 * p0 + v1 * p1) + (v2 * p2 + v3 * p3)
                a1[r] += (v0 * q0 + v1 * q1) + (v2 * q2 + v3 * q3)
                a2[r] += (v0 * r0 + v1 * r1) + (v2 * r2 + v3 * r3)
                a3[r] += (v0 * s0 + v1 * s1) + (v2 * s2 + v3 * s3)
        t += 4
    while t < t1:                                                # the last 1-3 rows
        a = acc[t - t0]
        for j in range(base, base + 32, 4):
            p0, p1, p2, p3 = x[t, j], x[t, j + 1], x[t, j + 2], x[t, j + 3]
            w0, w1, w2, w3 = w[j - base], w[j - base + 1], w[j - base + 2], w[j - base + 3]
            for r in range(R):
                a[r] += (w0[r] * p0 + w1[r] * p1) + (w2[r] * p2 + w3[r] * p3)
        t += 1


@njit(parallel=True, **JIT_OPTIONS)
def batch(qs, d, m, x, y):
    """Q4 (``m`` its minimums) or Q8 (``m`` None) times ``x`` float32 [T, K] (any T,
    best from 4 rows) -> ``y`` [T, G*LANES].

    Each block of a group is dequantized once into a float32 tile ``w`` [32, LANES]
    (8 KiB at 64 lanes, stays in L1) and multiplied into up to ``BATCH`` input rows, whose
    accumulators ``acc`` [BATCH, LANES] also stay in L1: the dequantization is paid
    once per ``BATCH`` rows instead of once per row, as ``rows`` pays it. (Numba
    compiles one version per format: ``m is None`` is decided when it compiles.)
    """
    G, nb, _, R = qs.shape
    T = x.shape[0]
    for g in prange(G):
        w = np.empty((32, R), np.float32)
        acc = np.empty((BATCH, R), np.float32)
        for t0 in range(0, T, BATCH):
            t1 = min(T, t0 + BATCH)
            acc[:] = 0.0
            for b in range(nb):
                if m is None:
                    dequantize_q8_block(qs, d, g, b, w)
                else:
                    dequantize_q4_block(qs, d, m, g, b, w)
                _multiply_tile(w, x, b * 32, t0, t1, acc)
            for t in range(t0, t1):
                y[t, g * R:(g + 1) * R] = acc[t - t0]


# --------------------------------------------- batch with sums in registers (AVX2)
# ``_multiply_tile`` leaves LLVM to vectorise its loop over a group's rows; with
# AVX2's 16 vector registers the 16 broadcast inputs of its 4 x 4 pass do not fit,
# and every pass loads and stores its four sums. The passes below hold the sums of
# 3-5 input rows x 16 output rows in registers (:mod:`.simd` vectors, two ``ymm``
# each on AVX2) through a block's 32 weights: per weight one tile load, one
# broadcast and one exact fma per input row, no store. Each sum still adds its
# products one weight after the other (``a = fma(w_j, x_j, a)``), the order LLVM
# gave ``_multiply_tile``'s contracted loop, so the results are the same.
# One function per row count, not one with a count argument: each loop body then
# has a fixed set of sums and no branch between its multiply-adds.


@njit(inline="always", **JIT_OPTIONS)
def _pass3(wf, R, x, base, acc, i, t, c):
    """Rows ``t..t+2`` of ``x``, lanes ``c..c+15`` of the tile ``wf`` (flat [32, R]), into
    ``acc`` (flat [rows, R]) from its row ``i``."""
    o = i * R + c
    a0, a1, a2 = load_f32(acc, o), load_f32(acc, o + R), load_f32(acc, o + 2 * R)
    for j in range(32):
        w = load_f32(wf, j * R + c)
        a0 = fma(w, splat(x[t, base + j]), a0)
        a1 = fma(w, splat(x[t + 1, base + j]), a1)
        a2 = fma(w, splat(x[t + 2, base + j]), a2)
    store_f32(acc, o, a0)
    store_f32(acc, o + R, a1)
    store_f32(acc, o + 2 * R, a2)


@njit(inline="always", **JIT_OPTIONS)
def _pass4(wf, R, x, base, acc, i, t, c):
    """:func:`_pass3` for four rows."""
    o = i * R + c
    a0, a1 = load_f32(acc, o), load_f32(acc, o + R)
    a2, a3 = load_f32(acc, o + 2 * R), load_f32(acc, o + 3 * R)
    for j in range(32):
        w = load_f32(wf, j * R + c)
        a0 = fma(w, splat(x[t, base + j]), a0)
        a1 = fma(w, splat(x[t + 1, base + j]), a1)
        a2 = fma(w, splat(x[t + 2, base + j]), a2)
        a3 = fma(w, splat(x[t + 3, base + j]), a3)
    store_f32(acc, o, a0)
    store_f32(acc, o + R, a1)
    store_f32(acc, o + 2 * R, a2)
    store_f32(acc, o + 3 * R, a3)


@njit(inline="always", **JIT_OPTIONS)
def _pass5(wf, R, x, base, acc, i, t, c):
    """:func:`_pass3` for five rows (10 of AVX2's 16 registers hold the sums)."""
    o = i * R + c
    a0, a1 = load_f32(acc, o), load_f32(acc, o + R)
    a2, a3, a4 = load_f32(acc, o + 2 * R), load_f32(acc, o + 3 * R), load_f32(acc, o + 4 * R)
    for j in range(32):
        w = load_f32(wf, j * R + c)
        a0 = fma(w, splat(x[t, base + j]), a0)
        a1 = fma(w, splat(x[t + 1, base + j]), a1)
        a2 = fma(w, splat(x[t + 2, base + j]), a2)
        a3 = fma(w, splat(x[t + 3, base + j]), a3)
        a4 = fma(w, splat(x[t + 4, base + j]), a4)
    store_f32(acc, o, a0)
    store_f32(acc, o + R, a1)
    store_f32(acc, o + 2 * R, a2)
    store_f32(acc, o + 3 * R, a3)
    store_f32(acc, o + 4 * R, a4)


@njit(inline="always", **JIT_OPTIONS)
def pass_rows(left: int) -> int:
    """Rows the next pass takes when ``left`` (>= 3) remain: fives while the rest still
    splits into passes of 3-5, then fours, then threes (9 = 5 + 4, 6 = 3 + 3)."""
    if left >= 9 or left == 5:
        return 5
    if left == 4 or left == 7 or left == 8:
        return 4
    return 3


@njit(parallel=True, **JIT_OPTIONS)
def batch_registers(qs, d, m, x, y):
    """:func:`batch` with the sums in registers: ``x`` float32 [T, K], T >= 4 -> ``y``.

    The same dequantized tile per block; the rows in chunks of at most ``BATCH``, of
    near-equal sizes (17 rows: 9 + 8), so every chunk has at least 4 rows and splits
    into passes of 3-5 (:func:`pass_rows`).
    """
    G, nb, _, R = qs.shape
    T = x.shape[0]
    if T < 4:
        raise ShapeError("x: batch_registers needs at least 4 input rows")
    chunks = -(-T // BATCH)
    for g in prange(G):
        w = np.empty((32, R), np.float32)
        wf = w.reshape(32 * R)
        acc = np.empty((BATCH, R), np.float32)
        accf = acc.reshape(BATCH * R)
        for k in range(chunks):
            t0, t1 = k * T // chunks, (k + 1) * T // chunks
            acc[:] = 0.0
            for b in range(nb):
                if m is None:
                    dequantize_q8_block(qs, d, g, b, w)
                else:
                    dequantize_q4_block(qs, d, m, g, b, w)
                t = t0
                while t < t1:
                    n = pass_rows(t1 - t)
                    for c in range(0, R, 16):
                        if n == 5:
                            _pass5(wf, R, x, b * 32, accf, t - t0, t, c)
                        elif n == 4:
                            _pass4(wf, R, x, b * 32, accf, t - t0, t, c)
                        else:
                            _pass3(wf, R, x, b * 32, accf, t - t0, t, c)
                    t += n
            for t in range(t0, t1):
                y[t, g * R:(g + 1) * R] = acc[t - t0]


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
