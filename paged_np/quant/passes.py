"""The passes of :func:`.kernels.batch`: a block's codes times 3-5 input rows, 16 lanes.

``batch`` (4 or more input rows: a batch of decodes, a speculative verify
step, prefill) takes each 32-weight block of a group in passes of 3-5 input
rows x 16 output lanes, each row's sum in registers through the block's 32
codes. The block's first pass converts the codes as it multiplies them and
keeps them in a float32 tile in L1; the passes after it load them from there.
Every pass does the same operations in the same order as the one-row kernel
(:func:`.kernels._block_dot`), so a row of a batch gets the bits of a one-row
product.

Arrays (flat views, as ``batch`` hands them over; lanes ``R`` = 64)::

    qf   qs [G, nb, J, R]   codes: Q4 bytes (J = 16), Q8 int8 (J = 32); block (g, b)
                            starts at qb = (g nb + b) J R
    wf   float32 [32, R]    the block's codes tile, row j multiplies xp[:, 32 b + j]
    xp   float32 [T, K]     the inputs as :func:`.kernels.inputs` prepares them
    df, mf  float32 [G, nb, R]  block scales (and Q4's minimums); so = (g nb + b) R
    accf float32 [BATCH, R] one group's sums for a chunk of input rows
"""

from __future__ import annotations

from numba import njit

from ..config import JIT_OPTIONS
from .simd import (
    CACHE_LINE,
    byte_codes_f32,
    fma,
    int8_codes_f32,
    load_f32,
    low_codes_f32,
    prefetch_l2,
    splat,
    store_f32,
    zeros_f32,
)


@njit(inline="always", **JIT_OPTIONS)
def scale_into(accf, o, s, df, mf, so, xs, t, b, q4):
    """``acc[o:o+16] += d s`` (Q4: then ``+= m xs[t, b]``), each rounded once: a block's
    sum ``s`` of code x input, scaled, into one row's 16 output lanes."""
    a = fma(load_f32(df, so), s, load_f32(accf, o))
    if q4:
        a = fma(load_f32(mf, so), splat(xs[t, b]), a)
    store_f32(accf, o, a)


#: What a tile row holds (``kind`` of :func:`tile_row`): Q4's low nibbles, Q4's whole
#: bytes, Q8's signed bytes.
LOW, BYTE, SIGNED = 0, 1, 2


@njit(inline="always", **JIT_OPTIONS)
def tile_row(qf, p, wf, i, convert, kind):
    """One row of a block's codes tile, 16 lanes: the codes ``qf[p:p+16]`` as float32
    (``kind``: :data:`LOW`, :data:`BYTE` or :data:`SIGNED`), stored
    at ``wf[i:i+16]``, if ``convert``; else read back from there (converted by an
    earlier pass over the same block). Tile row ``2j`` of a Q4 block holds byte row
    ``j``'s low codes and row ``2j + 1`` its bytes; tile row ``j`` of a Q8 block its
    code row ``j``: row ``j`` multiplies ``xp[:, 32 b + j]``."""
    if convert:
        if kind == LOW:
            w = low_codes_f32(qf, p)
        elif kind == BYTE:
            w = byte_codes_f32(qf, p)
        else:
            w = int8_codes_f32(qf, p)
        store_f32(wf, i, w)
        return w
    return load_f32(wf, i)


# A pass: rows ``t..t+n-1`` of ``xp`` (n = 3, 4 or 5) times lanes ``c..c+15`` of a block's
# codes, each row's sum in registers (a :mod:`.simd` vector: two ``ymm`` on AVX2) through
# the block's 32 codes, then scaled into ``acc`` from its row ``i``. Per code: one
# conversion (the block's first pass, which also keeps it in the tile ``wf``) or one tile
# load (the passes after it), one broadcast and one fma per row: the same fmas in the
# same order as ``_block_dot``. ``n`` and ``convert`` are constants where
# :func:`_pass_of` calls it, so each compiled loop body has a fixed set of sums and no
# branch between its multiply-adds (the sums past ``n`` are never computed).


@njit(inline="always", **JIT_OPTIONS)
def _pass(qf, qb, wf, R, xp, o, accf, i, t, c, df, mf, so, xs, b, q4, n, convert):
    a0 = a1 = a2 = a3 = a4 = zeros_f32()
    if q4:
        for j in range(16):
            p, k = qb + j * R + c, o + 2 * j
            w = tile_row(qf, p, wf, 2 * j * R + c, convert, LOW)
            a0 = fma(w, splat(xp[t, k]), a0)
            a1 = fma(w, splat(xp[t + 1, k]), a1)
            a2 = fma(w, splat(xp[t + 2, k]), a2)
            if n > 3:
                a3 = fma(w, splat(xp[t + 3, k]), a3)
            if n > 4:
                a4 = fma(w, splat(xp[t + 4, k]), a4)
            w = tile_row(qf, p, wf, (2 * j + 1) * R + c, convert, BYTE)
            a0 = fma(w, splat(xp[t, k + 1]), a0)
            a1 = fma(w, splat(xp[t + 1, k + 1]), a1)
            a2 = fma(w, splat(xp[t + 2, k + 1]), a2)
            if n > 3:
                a3 = fma(w, splat(xp[t + 3, k + 1]), a3)
            if n > 4:
                a4 = fma(w, splat(xp[t + 4, k + 1]), a4)
    else:
        for j in range(32):
            w = tile_row(qf, qb + j * R + c, wf, j * R + c, convert, SIGNED)
            a0 = fma(w, splat(xp[t, o + j]), a0)
            a1 = fma(w, splat(xp[t + 1, o + j]), a1)
            a2 = fma(w, splat(xp[t + 2, o + j]), a2)
            if n > 3:
                a3 = fma(w, splat(xp[t + 3, o + j]), a3)
            if n > 4:
                a4 = fma(w, splat(xp[t + 4, o + j]), a4)
    scale_into(accf, i * R + c, a0, df, mf, so, xs, t, b, q4)
    scale_into(accf, (i + 1) * R + c, a1, df, mf, so, xs, t + 1, b, q4)
    scale_into(accf, (i + 2) * R + c, a2, df, mf, so, xs, t + 2, b, q4)
    if n > 3:
        scale_into(accf, (i + 3) * R + c, a3, df, mf, so, xs, t + 3, b, q4)
    if n > 4:
        scale_into(accf, (i + 4) * R + c, a4, df, mf, so, xs, t + 4, b, q4)


@njit(inline="always", **JIT_OPTIONS)
def _pass_of(qf, qb, wf, R, xp, o, accf, i, t, c, df, mf, so, xs, b, q4, n, convert):
    """:func:`_pass` with ``n`` (3-5) made a constant, one compiled body per row count."""
    if n == 5:
        _pass(qf, qb, wf, R, xp, o, accf, i, t, c, df, mf, so, xs, b, q4, 5, convert)
    elif n == 4:
        _pass(qf, qb, wf, R, xp, o, accf, i, t, c, df, mf, so, xs, b, q4, 4, convert)
    else:
        _pass(qf, qb, wf, R, xp, o, accf, i, t, c, df, mf, so, xs, b, q4, 3, convert)


@njit(inline="always", **JIT_OPTIONS)
def pass_rows(left: int) -> int:
    """Rows the next pass takes when ``left`` (>= 3) remain: fives while the rest still
    splits into passes of 3-5, then fours, then threes (9 = 5 + 4, 6 = 3 + 3)."""
    if left >= 9 or left == 5:
        return 5
    if left == 4 or left == 7 or left == 8:
        return 4
    return 3


@njit(inline="always", **JIT_OPTIONS)
def block_passes(qf, qb, wf, R, xp, accf, t0, t1, c_lo, c_hi, df, mf, so, xs, b, q4):
    """Block ``b``'s codes (from ``qf[qb:]``) times input rows ``t0:t1``, output lanes
    ``c_lo:c_hi``, into ``acc`` (its row ``i`` is input row ``t0 + i``): passes of
    :func:`pass_rows` rows x 16 lanes. The first pass converts the codes as it
    multiplies them and keeps them in the tile ``wf``; the others read them there."""
    t = t0
    while t < t1:
        n = pass_rows(t1 - t)
        for c in range(c_lo, c_hi, 16):
            if t == t0:                                          # converts, constant True
                _pass_of(qf, qb, wf, R, xp, b * 32, accf, 0, t, c, df, mf, so + c, xs, b, q4,
                         n, True)
            else:
                _pass_of(qf, qb, wf, R, xp, b * 32, accf, t - t0, t, c, df, mf, so + c, xs, b,
                         q4, n, False)
        t += n


@njit(inline="always", **JIT_OPTIONS)
def prefetch_block(qf, q, J, R, c_lo, c_hi):
    """Ask for lanes ``c_lo:c_hi`` of the block at ``qf[q:]`` (``J`` rows of ``R`` bytes)
    to be brought into L2, one hint per cache line; nothing past the array's end."""
    if q + J * R > qf.size:
        return
    for j in range(J):
        for c in range(c_lo - c_lo % CACHE_LINE, c_hi, CACHE_LINE):
            prefetch_l2(qf, q + j * R + c)
