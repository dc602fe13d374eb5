"""The passes of :func:`.kernels.batch`: a block's codes times 3-5 input rows, 16 lanes.

``batch`` (4 or more input rows: a batch of decodes, a speculative verify
step, prefill) takes each 32-weight block of a group in passes of 3-5 input
rows x 16 output lanes, each row's sum in registers through the block's 32
codes. The block's first pass converts the codes as it multiplies them and
keeps them in a float32 tile in L1; the passes after it load them from there.
Every pass does the same operations in the same order as the one-row kernel
(:func:`.kernels._block_dot`), so a row of a batch gets the bits of a one-row
product.

Arguments are :mod:`.kernels`' records (``R`` = ``w.lanes`` = 64)::

    w     GroupedBlocks     the matrix (:mod:`.layouts`): w.codes flat [G, nb, J, R]
                            (J = 16 Q4 bytes or 32 Q8 codes), w.scales, w.mins [G, nb, R]
    blk   Block             one block b of one group g: blk.codes = (g nb + b) J R is its
                            first code in w.codes, blk.scales = (g nb + b) R its first scale
    x     Inputs            the product's inputs: x.values float32 [T, K] (as
                            :func:`.kernels.inputs` prepares them), x.sums [T, K/32]
    work  Scratch           one thread's L1 arrays: work.tile float32 [32, R], the block's
                            codes (row j multiplies x.values[:, 32 b + j]); work.acc
                            float32 [BATCH, R], a chunk's sums (row i: input row t0 + i)
    t0, t1                  the chunk: input rows t0:t1
    t, i, c                 an input row, its row of work.acc (t - t0), the first of 16
                            output lanes

Two row indices, ``t`` and ``i``, not one index into the chunk's rows sliced out of
``x``: with the slice (1a58318), LLVM computed the five input rows' addresses of a pass
one from the other inside the loop, 23 instructions per 10 fmas instead of 16 in the
hottest loop (``python benchmarks/quant_kernels.py --ir``).
"""

from __future__ import annotations

from numba import njit

from ..config import JIT_OPTIONS
from .formats import Q4
from .layouts import codes_kind
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
def scale_into(acc, i, c, s, w, blk, x, t):
    """A block's sums ``s`` (code x input row ``t``, 16 lanes) scaled into row ``i`` of
    ``acc``, lanes ``c:c+16``: ``acc += d s``, then for Q4 ``acc += m x.sums[t, b]``, each
    rounded once."""
    o, so = i * w.lanes + c, blk.scales + c
    a = fma(load_f32(w.scales, so), s, load_f32(acc, o))
    if codes_kind(w) == Q4:
        a = fma(load_f32(w.mins, so), splat(x.sums[t, blk.index]), a)
    store_f32(acc, o, a)


#: What a tile row holds (``row`` of :func:`tile_row`): Q4's low nibbles, Q4's whole
#: bytes, Q8's signed bytes.
LOW, BYTE, SIGNED = 0, 1, 2


@njit(inline="always", **JIT_OPTIONS)
def tile_row(codes, p, tile, i, convert, row):
    """One row of a block's codes tile, 16 lanes: the bytes ``codes[p:p+16]`` as float32
    (``row``: :data:`LOW`, :data:`BYTE` or :data:`SIGNED`), stored at ``tile[i:i+16]``,
    if ``convert``; else read back from there (converted by an earlier pass over the same
    block). Tile row ``2j`` of a Q4 block holds byte row ``j``'s low codes and row
    ``2j + 1`` its bytes; tile row ``j`` of a Q8 block its code row ``j``: row ``j``
    multiplies ``x.values[:, 32 b + j]``."""
    if convert:
        if row == LOW:
            q = low_codes_f32(codes, p)
        elif row == BYTE:
            q = byte_codes_f32(codes, p)
        else:
            q = int8_codes_f32(codes, p)
        store_f32(tile, i, q)
        return q
    return load_f32(tile, i)


# A pass: input rows ``t..t+n-1`` (n = 3, 4 or 5) times lanes ``c..c+15`` of a block's
# codes, each row's sum in registers (a :mod:`.simd` vector: two ``ymm`` on AVX2) through
# the block's 32 codes, then scaled into rows ``i..i+n-1`` of ``work.acc``. Per code:
# one conversion (the block's first pass, which also keeps it in the tile) or one tile
# load (the passes after it), one broadcast and one fma per row: the same fmas in the same
# order as ``_block_dot``. ``n`` and ``convert`` are constants where :func:`_pass_of`
# calls it, so each compiled loop body has a fixed set of sums and no branch between its
# multiply-adds (the sums past ``n`` are never computed).


@njit(inline="always", **JIT_OPTIONS)
def _pass(w, blk, x, work, t, i, c, n, convert):
    R, xv, o = w.lanes, x.values, 32 * blk.index                 # o: the block's first input
    a0 = a1 = a2 = a3 = a4 = zeros_f32()
    if codes_kind(w) == Q4:
        for j in range(16):
            p, k = blk.codes + j * R + c, o + 2 * j
            q = tile_row(w.codes, p, work.tile, 2 * j * R + c, convert, LOW)
            a0 = fma(q, splat(xv[t, k]), a0)
            a1 = fma(q, splat(xv[t + 1, k]), a1)
            a2 = fma(q, splat(xv[t + 2, k]), a2)
            if n > 3:
                a3 = fma(q, splat(xv[t + 3, k]), a3)
            if n > 4:
                a4 = fma(q, splat(xv[t + 4, k]), a4)
            q = tile_row(w.codes, p, work.tile, (2 * j + 1) * R + c, convert, BYTE)
            a0 = fma(q, splat(xv[t, k + 1]), a0)
            a1 = fma(q, splat(xv[t + 1, k + 1]), a1)
            a2 = fma(q, splat(xv[t + 2, k + 1]), a2)
            if n > 3:
                a3 = fma(q, splat(xv[t + 3, k + 1]), a3)
            if n > 4:
                a4 = fma(q, splat(xv[t + 4, k + 1]), a4)
    else:
        for j in range(32):
            q = tile_row(w.codes, blk.codes + j * R + c, work.tile, j * R + c, convert, SIGNED)
            a0 = fma(q, splat(xv[t, o + j]), a0)
            a1 = fma(q, splat(xv[t + 1, o + j]), a1)
            a2 = fma(q, splat(xv[t + 2, o + j]), a2)
            if n > 3:
                a3 = fma(q, splat(xv[t + 3, o + j]), a3)
            if n > 4:
                a4 = fma(q, splat(xv[t + 4, o + j]), a4)
    scale_into(work.acc, i, c, a0, w, blk, x, t)
    scale_into(work.acc, i + 1, c, a1, w, blk, x, t + 1)
    scale_into(work.acc, i + 2, c, a2, w, blk, x, t + 2)
    if n > 3:
        scale_into(work.acc, i + 3, c, a3, w, blk, x, t + 3)
    if n > 4:
        scale_into(work.acc, i + 4, c, a4, w, blk, x, t + 4)


@njit(inline="always", **JIT_OPTIONS)
def _pass_of(w, blk, x, work, t, i, c, n, convert):
    """:func:`_pass` with ``n`` (3-5) made a constant, one compiled body per row count."""
    if n == 5:
        _pass(w, blk, x, work, t, i, c, 5, convert)
    elif n == 4:
        _pass(w, blk, x, work, t, i, c, 4, convert)
    else:
        _pass(w, blk, x, work, t, i, c, 3, convert)


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
def block_passes(w, blk, x, work, t0, t1, c_lo, c_hi):
    """Block ``blk``'s codes times input rows ``t0:t1`` of ``x``, output lanes
    ``c_lo:c_hi``, into ``work.acc`` (its row ``i`` is input row ``t0 + i``): passes of
    :func:`pass_rows` rows x 16 lanes. The first pass converts the codes as it multiplies
    them and keeps them in ``work.tile``; the others read them there."""
    t = t0
    while t < t1:
        n = pass_rows(t1 - t)
        for c in range(c_lo, c_hi, 16):
            if t == t0:                                          # converts, constant True
                _pass_of(w, blk, x, work, t, 0, c, n, True)
            else:
                _pass_of(w, blk, x, work, t, t - t0, c, n, False)
        t += n


@njit(inline="always", **JIT_OPTIONS)
def prefetch_block(w, q, c_lo, c_hi):
    """Ask for lanes ``c_lo:c_hi`` of the block whose first code is ``w.codes[q]`` to be
    brought into L2, one hint per cache line of each of its byte rows; nothing past the
    array's end."""
    J, R = w.code_rows, w.lanes
    if q + J * R > w.codes.size:
        return
    for j in range(J):
        for c in range(c_lo - c_lo % CACHE_LINE, c_hi, CACHE_LINE):
            prefetch_l2(w.codes, q + j * R + c)
