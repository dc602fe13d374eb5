"""Numba kernels over the repacked quantized layout of :mod:`.matrix`.

The layout (built once, on load): output rows are taken in groups of
``LANES`` (64) consecutive rows, and for each group and each 32-weight block
the 64 rows' quantized values are stored side by side::

    Q4: qs uint8 [G, nb, 16, LANES]   byte (j, r) = row r's weight j (low nibble)
                                                    and weight j + 16 (high nibble)
    Q8: qs int8  [G, nb, 32, LANES]   row r's weight j
        d, m float32 [G, nb, LANES]   row r's block scale (and minimum)

so the innermost loop runs across *rows*: one input value ``x[j]`` is
broadcast and multiplied into 64 rows' weights at once, a SIMD multiply-add
whose lanes never need to be summed together. The block's scale is then a
vector too (64 rows' scales), applied once per block::

    y[r] = sum_b ( d[b, r] * sum_j q[b, j, r] * x[b, j]  +  m[b, r] * sum_j x[b, j] )

(The obvious loop, one row at a time, must add its 32 products into one
number at every block before it can scale them, and that horizontal sum stops
the vectorisation: 2 GB/s instead of the memory's 10-20.)

Kernels (all take checked, contiguous arrays; :mod:`.matrix` validates):

- ``*_rows``: 1-16 input rows (decode at batch 1, a batch of decodes, a
  speculative verify step), parallel over row groups: a group's blocks are
  read from memory once per call and from cache for the other rows (one
  kernel for 1 and for 16 rows: a separate matrix-vector kernel measured no
  faster, and each parallel kernel costs about 1.5 s of cold compile);
- ``*_panel``: dequantize row groups into a float32 ``[in, rows]`` tile for
  BLAS (prefill and large batches, where the multiply is compute-bound);
- ``*_embed``: dequantize whole rows (token embedding lookup).

The loops read their trip counts from the arrays' shapes (not constants):
with a constant 16 or 32 LLVM unrolls the lane loop fully and vectorises the
wrong way (measured 2.5x slower).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..config import JIT_OPTIONS

#: Output rows per group: the inner loop's length. LLVM vectorises it 16 float32 lanes
#: wide, 4 vectors per iteration (64 rows); 32 rows measured 1.2-1.9x slower
#: (``benchmarks/quant_kernels.md``).
LANES = 64


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


@njit(parallel=True, **JIT_OPTIONS)
def q4_rows(qs, d, m, x, y):
    """Q4 ``[G*LANES, K]`` times ``x`` float32 [T, K] (T = 1 to 16) -> ``y`` [T, G*LANES].

    Parallel over row groups. A group's blocks (``nb * 16 * 64`` bytes: 18 KiB
    for K = 576) are read from memory once, by the first input row, and from
    L1/L2 by the others. At T = 1 this is the decode's matrix-vector product.
    """
    G, nb, _, R = qs.shape
    T = x.shape[0]
    xs = _block_sums(x)
    for g in prange(G):
        acc = np.empty(R, np.float32)
        s = np.empty(R, np.float32)
        for t in range(T):
            acc[:] = 0.0
            for b in range(nb):
                s[:] = 0.0
                base = b * 32
                for j in range(16):
                    # byte = lo + 16 hi, so lo x_l + hi x_h = lo (x_l - x_h/16) + byte x_h/16:
                    # no shift (measured 1.2-1.5x faster than the plain form).
                    xh = x[t, base + 16 + j] * np.float32(0.0625)
                    xl = x[t, base + j] - xh
                    row = qs[g, b, j]
                    for r in range(R):
                        q = row[r]
                        s[r] += np.float32(q & np.uint8(15)) * xl + np.float32(q) * xh
                db, mb, xb = d[g, b], m[g, b], xs[t, b]
                for r in range(R):
                    acc[r] += db[r] * s[r] + mb[r] * xb
            y[t, g * R:(g + 1) * R] = acc


@njit(parallel=True, **JIT_OPTIONS)
def q8_rows(qs, d, x, y):
    """Q8 times ``x`` float32 [T, K] (T = 1 to 16) -> ``y`` [T, G*LANES]; a group's
    blocks are read from memory once and from cache by the other rows."""
    G, nb, _, R = qs.shape
    T = x.shape[0]
    for g in prange(G):
        acc = np.empty(R, np.float32)
        s = np.empty(R, np.float32)
        for t in range(T):
            acc[:] = 0.0
            for b in range(nb):
                s[:] = 0.0
                base = b * 32
                for j in range(32):
                    xj = x[t, base + j]
                    row = qs[g, b, j]
                    for r in range(R):
                        s[r] += np.float32(row[r]) * xj
                db = d[g, b]
                for r in range(R):
                    acc[r] += db[r] * s[r]
            y[t, g * R:(g + 1) * R] = acc


@njit(parallel=True, **JIT_OPTIONS)
def q4_panel(qs, d, m, g0, g1, out):
    """Dequantize row groups ``[g0, g1)`` into ``out`` float32 [K, (g1-g0)*LANES], [in, out].

    Each block row is dequantized into a local 64-float vector, then copied into
    the tile as one slice (writing the tile element by element measured 5-40x
    slower: LLVM could not vectorise stores that might alias the inputs).
    """
    nb, R = qs.shape[1], qs.shape[3]
    for g in prange(g0, g1):
        c = (g - g0) * R
        lo = np.empty(R, np.float32)
        hi = np.empty(R, np.float32)
        for b in range(nb):
            db, mb = d[g, b], m[g, b]
            for j in range(16):
                row = qs[g, b, j]
                for r in range(R):
                    q = row[r]
                    lo[r] = db[r] * np.float32(q & np.uint8(15)) + mb[r]
                    hi[r] = db[r] * np.float32(q >> np.uint8(4)) + mb[r]
                out[b * 32 + j, c:c + R] = lo
                out[b * 32 + 16 + j, c:c + R] = hi


@njit(parallel=True, **JIT_OPTIONS)
def q8_panel(qs, d, g0, g1, out):
    """Dequantize row groups ``[g0, g1)`` into ``out`` float32 [K, (g1-g0)*LANES]."""
    nb, R = qs.shape[1], qs.shape[3]
    for g in prange(g0, g1):
        c = (g - g0) * R
        w = np.empty(R, np.float32)
        for b in range(nb):
            db = d[g, b]
            for j in range(32):
                row = qs[g, b, j]
                for r in range(R):
                    w[r] = db[r] * np.float32(row[r])
                out[b * 32 + j, c:c + R] = w


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
