"""Numba kernels for float32 inputs: ``x @ w`` with ``w`` held as its quantized blocks.

The layout is :class:`.layouts.GroupedBlocks` (drawn there): output rows in
groups of ``LANES`` (64), and for each group and each 32-weight block the
group's codes stored side by side, ``codes [G, nb, J, R]``, ``scales, mins
[G, nb, R]``. So the innermost loop runs across *rows*: one input value
``x[j]`` is broadcast and multiplied into 16 of a group's rows at once, a SIMD
multiply-add whose lanes never need to be summed together. The block's scale
is then a vector too (the group's scales), applied once per block::

    y[r] = sum_b ( d[b, r] * sum_j q[b, j, r] * x[b, j]  +  m[b, r] * sum_j x[b, j] )

(The obvious loop, one row at a time, must add its 32 products into one
number at every block before it can scale them, and that horizontal sum stops
the vectorisation: 2 GB/s instead of the memory's 10-20.)

Arguments are small records (``NamedTuple``: Numba passes them as structs, and
a field read costs what a local variable does):

- ``w``: the matrix, a :class:`.layouts.GroupedBlocks` (its kind,
  :data:`.formats.Q4` or :data:`.formats.Q8`, read by
  :func:`.layouts.codes_kind`: a constant in each compiled kernel);
- ``x``: the inputs, an :class:`Inputs` made by :func:`inputs`;
- ``blk``: where one block of one group starts, a :class:`Block`;
- ``work``: one thread's scratch arrays in ``batch``, a :class:`Scratch`.

Both kernels compute that formula for every row with the same operations in
the same order, whatever the number of rows: the codes as float32 (exact),
``s = fma(code_j, x_j, s)`` over a block's 32 codes, then
``acc = fma(d, s, acc)`` (Q4: and ``acc = fma(m, sum x, acc)``), all through
:mod:`.simd`'s exact vector operations, with the inputs prepared once by
:func:`inputs`. So a row's result has the same bits alone and in a batch (a
speculative verify step's rows are its decode rows, ``tests/test_quant.py``).

Kernels (all take records of checked, contiguous arrays; :mod:`.matrix` validates):

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
- ``embed``: dequantize whole rows (token embedding lookup).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ..config import JIT_OPTIONS
from ..errors import ShapeError
from .formats import Q4
from .layouts import LANES, codes_kind
from .passes import block_passes, prefetch_block, scale_into
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

__all__ = ["BATCH", "LANES", "Block", "Inputs", "Scratch", "batch", "block_at", "embed",
           "inputs", "rows"]

#: Input rows that share one block's codes tile in ``batch`` (their accumulators: 4 KiB
#: of L1 at 64 lanes).
BATCH = 16


class Inputs(NamedTuple):
    """What both kernels multiply by, from :func:`inputs` (computed once per product)."""

    values: np.ndarray       #: float32 [T, K]: x (Q8), or x's pairs for Q4's bytes
    sums: np.ndarray         #: float32 [T, K/32]: each block's sum of x (Q4); Q8: [T, 0]


class Block(NamedTuple):
    """Where block ``index`` (inputs ``32 index ..``) of one row group starts in ``w``."""

    index: int               #: b
    codes: int               #: its first code byte in w.codes: (g nb + b) J R
    scales: int              #: its first scale in w.scales (and w.mins): (g nb + b) R


class Scratch(NamedTuple):
    """One thread's working arrays in ``batch``, both in L1."""

    tile: np.ndarray         #: float32 [32, R] flat: a block's codes, converted once
    acc: np.ndarray          #: float32 [BATCH, R] flat: a chunk's sums, row i = input row t0 + i


@njit(inline="always", **JIT_OPTIONS)
def block_at(w, g, b):
    """The :class:`Block` of block ``b`` of row group ``g``."""
    gb = g * w.blocks + b
    return Block(b, gb * w.code_rows * w.lanes, gb * w.lanes)


@njit(**JIT_OPTIONS)
def inputs(x, kind):
    """``x`` float32 [T, K] -> :class:`Inputs`: what both kernels multiply by.

    Q8: ``values`` is ``x``, ``sums`` empty. Q4: a byte holds weights ``j`` (low nibble)
    and ``j + 16`` (high) of a block, byte = lo + 16 hi, so lo x_l + hi x_h =
    lo (x_l - x_h/16) + byte x_h/16, which needs no shift. ``values`` holds those two
    factors interleaved, ``values[t, 32 b + 2 j] = x_l - x_h/16`` and
    ``values[t, 32 b + 2 j + 1] = x_h/16``, in the order the kernels take the codes;
    ``sums`` [T, K/32] the blocks' sums of ``x`` (the minimum's term). Computed once per
    product, outside the kernels, so that ``rows`` and ``batch`` multiply by the same bits.
    """
    T, K = x.shape
    if kind != Q4:
        return Inputs(x, np.zeros((T, 0), np.float32))
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
    return Inputs(xp, xs)


@njit(inline="always", **JIT_OPTIONS)
def _block_dot(w, blk, c, x, t):
    """One block of input row ``t``, 64 output lanes from ``c`` as four 16-lane sums:
    ``sum_j code_j x.values[t, 32 b + j]`` over the block's 32 codes, one fma after the
    other in each lane. Four sums, not one, so that four chains of fmas run side by side
    (one alone waits on each fma's latency: one cold pass over the matrices at one row
    measured 1.1-1.2x slower)."""
    R, qf, xv, o = w.lanes, w.codes, x.values, 32 * blk.index
    s0 = s1 = s2 = s3 = zeros_f32()
    if codes_kind(w) == Q4:
        for j in range(16):
            p = blk.codes + j * R + c
            xl, xh = splat(xv[t, o + 2 * j]), splat(xv[t, o + 2 * j + 1])
            s0 = fma(byte_codes_f32(qf, p), xh, fma(low_codes_f32(qf, p), xl, s0))
            s1 = fma(byte_codes_f32(qf, p + 16), xh, fma(low_codes_f32(qf, p + 16), xl, s1))
            s2 = fma(byte_codes_f32(qf, p + 32), xh, fma(low_codes_f32(qf, p + 32), xl, s2))
            s3 = fma(byte_codes_f32(qf, p + 48), xh, fma(low_codes_f32(qf, p + 48), xl, s3))
    else:
        for j in range(32):
            p = blk.codes + j * R + c
            xj = splat(xv[t, o + j])
            s0 = fma(int8_codes_f32(qf, p), xj, s0)
            s1 = fma(int8_codes_f32(qf, p + 16), xj, s1)
            s2 = fma(int8_codes_f32(qf, p + 32), xj, s2)
            s3 = fma(int8_codes_f32(qf, p + 48), xj, s3)
    return s0, s1, s2, s3


@njit(inline="always", **JIT_OPTIONS)
def _block_dot2(w, blk, c, x, t):
    """:func:`_block_dot` for input rows ``t`` and ``t + 1`` at once, over 32 output lanes
    from ``c`` (two 16-lane sums a row): each 16 codes converted once for both rows. Four
    chains again, now two rows x two; 32 lanes, not 64, so that the sums, one 16-lane run
    of codes and the inputs fit AVX2's 16 registers."""
    R, qf, xv, o = w.lanes, w.codes, x.values, 32 * blk.index
    a0 = a1 = b0 = b1 = zeros_f32()
    if codes_kind(w) == Q4:
        for j in range(16):
            p = blk.codes + j * R + c
            xl0, xh0 = splat(xv[t, o + 2 * j]), splat(xv[t, o + 2 * j + 1])
            xl1, xh1 = splat(xv[t + 1, o + 2 * j]), splat(xv[t + 1, o + 2 * j + 1])
            lo, by = low_codes_f32(qf, p), byte_codes_f32(qf, p)
            a0 = fma(by, xh0, fma(lo, xl0, a0))
            b0 = fma(by, xh1, fma(lo, xl1, b0))
            lo, by = low_codes_f32(qf, p + 16), byte_codes_f32(qf, p + 16)
            a1 = fma(by, xh0, fma(lo, xl0, a1))
            b1 = fma(by, xh1, fma(lo, xl1, b1))
    else:
        for j in range(32):
            p = blk.codes + j * R + c
            x0, x1 = splat(xv[t, o + j]), splat(xv[t + 1, o + j])
            q = int8_codes_f32(qf, p)
            a0 = fma(q, x0, a0)
            b0 = fma(q, x1, b0)
            q = int8_codes_f32(qf, p + 16)
            a1 = fma(q, x0, a1)
            b1 = fma(q, x1, b1)
    return a0, a1, b0, b1


@njit(inline="always", **JIT_OPTIONS)
def _block_dot3(w, blk, c, x, t):
    """:func:`_block_dot` for input rows ``t`` to ``t + 2`` at once, over 16 output lanes
    from ``c``: each 16 codes converted once for the three rows (three chains)."""
    R, qf, xv, o = w.lanes, w.codes, x.values, 32 * blk.index
    a = b = e = zeros_f32()
    if codes_kind(w) == Q4:
        for j in range(16):
            p, k = blk.codes + j * R + c, o + 2 * j
            lo, by = low_codes_f32(qf, p), byte_codes_f32(qf, p)
            a = fma(by, splat(xv[t, k + 1]), fma(lo, splat(xv[t, k]), a))
            b = fma(by, splat(xv[t + 1, k + 1]), fma(lo, splat(xv[t + 1, k]), b))
            e = fma(by, splat(xv[t + 2, k + 1]), fma(lo, splat(xv[t + 2, k]), e))
    else:
        for j in range(32):
            q = int8_codes_f32(qf, blk.codes + j * R + c)
            a = fma(q, splat(xv[t, o + j]), a)
            b = fma(q, splat(xv[t + 1, o + j]), b)
            e = fma(q, splat(xv[t + 2, o + j]), e)
    return a, b, e


@njit(parallel=True, **JIT_OPTIONS)
def rows(w, x, y):
    """``w`` (:class:`.layouts.GroupedBlocks`) times ``x = inputs(...)`` for 1 to 3 input
    rows -> ``y`` float32 [T, G*LANES].

    Parallel over row groups. A group's blocks (``nb * 16 * LANES`` bytes for Q4: 18 KiB
    for K = 576 at 64 lanes) are read from memory once; the codes are converted in
    registers and each conversion feeds all T input rows (:func:`_block_dot`,
    :func:`_block_dot2`, :func:`_block_dot3`). At T = 1 this is the decode's
    matrix-vector product; at 2 and 3, a few decodes or a verify step with one or two
    drafts (one pass over SmolLM2's matrices at 2 and 3 rows took 1.7x and 2.3x one
    row's time with each row converting the codes again, 1.2x and 1.5x sharing them:
    ``benchmarks/quant_kernels_avx2.md``).
    """
    R = w.lanes
    T, N = x.values.shape[0], y.shape[1]
    if T > 3:
        raise ShapeError("x: rows takes 1 to 3 input rows")
    yf = y.reshape(y.size)
    for g in prange(w.groups):
        acc = np.zeros(T * R, np.float32)                        # [T, R]
        for b in range(w.blocks):
            blk = block_at(w, g, b)
            if T == 1:
                for c in range(0, R, 64):
                    s0, s1, s2, s3 = _block_dot(w, blk, c, x, 0)
                    scale_into(acc, 0, c, s0, w, blk, x, 0)
                    scale_into(acc, 0, c + 16, s1, w, blk, x, 0)
                    scale_into(acc, 0, c + 32, s2, w, blk, x, 0)
                    scale_into(acc, 0, c + 48, s3, w, blk, x, 0)
            elif T == 2:
                for c in range(0, R, 32):
                    a0, a1, b0, b1 = _block_dot2(w, blk, c, x, 0)
                    scale_into(acc, 0, c, a0, w, blk, x, 0)
                    scale_into(acc, 0, c + 16, a1, w, blk, x, 0)
                    scale_into(acc, 1, c, b0, w, blk, x, 1)
                    scale_into(acc, 1, c + 16, b1, w, blk, x, 1)
            else:
                for c in range(0, R, 16):
                    r0, r1, r2 = _block_dot3(w, blk, c, x, 0)
                    scale_into(acc, 0, c, r0, w, blk, x, 0)
                    scale_into(acc, 1, c, r1, w, blk, x, 1)
                    scale_into(acc, 2, c, r2, w, blk, x, 2)
        for t in range(T):
            yf[t * N + g * R:t * N + (g + 1) * R] = acc[t * R:(t + 1) * R]


@njit(parallel=True, **JIT_OPTIONS)
def batch(w, x, y, parts):
    """:func:`rows` for T >= 4 input rows: ``w`` times ``x = inputs(...)`` -> ``y``
    float32 [T, G*LANES].

    Each block's codes are converted to float32 once into a tile ``[32, LANES]`` (8 KiB at
    64 lanes, in L1) and multiplied into up to ``BATCH`` input rows, in chunks of
    near-equal sizes (17 rows: 9 + 8) so that every chunk splits into passes of 3-5
    (:func:`.passes.pass_rows`); their accumulators ``acc`` [BATCH, LANES] stay in L1 too.

    ``parts``: how many near-equal runs of 16-lane strips the output lanes are cut into,
    one per thread (:mod:`.matrix` passes ``numba.get_num_threads()``; read in here, it
    would keep Numba from caching the kernel). Whole groups gave SmolLM2's 576-row
    matrices, 9 groups, 5 to one thread and 4 to the other; four parts a thread, cut
    inside more groups, measured 2% slower than one. A lane's arithmetic does not depend
    on its neighbours, so any cut gives the same bits.
    """
    G, R = w.groups, w.lanes
    T = x.values.shape[0]
    if T < 4:
        raise ShapeError("x: batch needs at least 4 input rows")
    yf = y.reshape(y.size)
    parts = max(1, min(parts, G * (R // 16)))
    for part in prange(parts):
        _batch_part(w, x, yf, y.shape[1], np.int64(part), parts)  # not prange's uint64


@njit(**JIT_OPTIONS)
def _batch_part(w, x, yf, N, part, parts):
    """One thread's part of :func:`batch`: its run of 16-lane strips, all input rows, into
    ``yf`` (``y`` flat, rows of ``N``). A function of its own, not the body of ``batch``'s
    ``prange``: Numba's parallel passes then handle a loop of one call, and the inlined
    passes compile once, in the plain pipeline: a cold compile of the Q8 kernel took
    19.5 s, 24.3 s as one parallel body (``benchmarks/compile_log.py``)."""
    G, R = w.groups, w.lanes
    T = x.values.shape[0]
    chunks = -(-T // BATCH)
    strips = R // 16                                             # per group
    acc = np.empty(BATCH * R, np.float32)                        # [BATCH, R]
    work = Scratch(np.empty(32 * R, np.float32), acc)            # tile [32, R], acc
    s_lo, s_hi = part * G * strips // parts, (part + 1) * G * strips // parts
    for g in range(s_lo // strips, (s_hi - 1) // strips + 1):
        c_lo = (max(s_lo, g * strips) - g * strips) * 16         # this part's lanes of g
        c_hi = (min(s_hi, (g + 1) * strips) - g * strips) * 16
        for k in range(chunks):
            t0, t1 = k * T // chunks, (k + 1) * T // chunks
            acc[:] = 0.0
            for b in range(w.blocks):
                blk = block_at(w, g, b)
                prefetch_block(w, blk.codes + w.code_rows * R, c_lo, c_hi)  # the next
                block_passes(w, blk, x, work, t0, t1, c_lo, c_hi)
            for t in range(t0, t1):                              # a loop, not a slice
                o, a = t * N + g * R, (t - t0) * R               # copy: that one compiles
                for c in range(c_lo, c_hi):                      # its shape-mismatch
                    yf[o + c] = acc[a + c]                       # message, 40 functions


@njit(**JIT_OPTIONS)
def embed(w, ids, out):
    """Rows ``ids`` (checked: 0 <= id < rows) of ``w`` -> ``out`` float32 [T, K]:
    ``d q + m`` (Q4) or ``d q`` (Q8) for every code of each row."""
    R, J = w.lanes, w.code_rows
    for t in range(ids.shape[0]):
        g, r = ids[t] // R, ids[t] % R
        for b in range(w.blocks):
            blk = block_at(w, g, b)
            d = w.scales[blk.scales + r]
            if codes_kind(w) == Q4:
                m = w.mins[blk.scales + r]
                for j in range(16):
                    q = w.codes[blk.codes + j * R + r]
                    out[t, b * 32 + j] = d * np.float32(q & np.uint8(15)) + m
                    out[t, b * 32 + 16 + j] = d * np.float32(q >> np.uint8(4)) + m
            else:
                for j in range(J):
                    out[t, b * 32 + j] = d * np.float32(w.codes[blk.codes + j * R + r])
