"""Quantized weights times int8 activations: integer dot products, as llama.cpp multiplies.

The float kernels of :mod:`.kernels` turn every weight back into a float32
and multiply it by a float32 input. This module quantizes the *input* too:
each 32-value block of each input row becomes 32 int8 codes and one float32
scale (``x ~ xd * xq``, ``xd = max|x| / 127``, the Q8_0 rule), and a weight
block times an input block is then a sum of 32 integer products, exact in
int32, scaled once::

    sum_j w_j x_j  ~  d xd sum_j u_j xq_j  +  m xd sum_j xq_j

with the weight block ``w_j = d u_j + m``: Q4_1 has codes ``u`` 0..15 and a
minimum ``m``; Q8_0 codes ``q`` -128..127 are stored as ``u = q + 128`` with
``m = -128 d``, so both formats are the same formula and the unsigned codes
suit the instruction. One ``vpdpbusd`` (:mod:`.simd`) does 64 of those
products, four per lane, where float32 does 16: with more than a few input
rows (a speculative verify step, prefill) the products were the bound
(``benchmarks/spec_decode.md`` times them at 1 to 13 rows on both paths).
The price is the input's rounding, at most half a step of 1/127 of each
block's largest value, measured as perplexity and KL against float32 by
``python -m paged_np eval --weights none,gguf,gguf_a8``
(``benchmarks/perplexity_weights.md``).

The layout is :class:`.layouts.Dot4Blocks` (drawn there): output rows in
chunks of 16 (one vector's lanes), and in each chunk's block the codes of 4
consecutive inputs of a row side by side, as the instruction reads them::

    codes uint8 [C, nb, Q, 16, 4]   Q = 4 (Q4: nibble pairs) or 8 (Q8: q + 128)
    scales, mins float32 [C, nb, 16]

Every row's result is computed by the same instructions in the same order,
whether it came alone or with 15 others, four at a time or one: a row's
numbers do not depend on the batch (:mod:`.simd`: exact fma, no fast-math).
So a speculative verify step scores its drafts with exactly the numbers
one-token decoding would have produced.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..config import BOUNDSCHECK, JIT_OPTIONS
from .formats import Q4, Q8
from .layouts import DOT4_ROWS
from .simd import (
    broadcast4,
    dot4,
    dot4_nibbles,
    fma,
    high_nibbles,
    load_f32,
    load_u8x64,
    low_nibbles,
    mul,
    splat,
    store_f32,
    to_f32,
    zeros_f32,
    zeros_i32,
)

#: No fastmath here: the vector code's float operations are exact IEEE ones, so a row's
#: result does not depend on how many rows came with it.
OPTIONS = dict(cache=not BOUNDSCHECK, nogil=True, boundscheck=BOUNDSCHECK)
#: Output rows per chunk: the lanes of one vector.
ROWS = DOT4_ROWS


@njit(**OPTIONS)
def quantize_rows(x):
    """float32 ``x`` [T, K] -> int8 codes [T, K], scales ``xd`` and ``xs = xd * sum(codes)``
    [T, K/32] per 32-value block (Q8_0's rule: ``xd = max|x| / 127``, codes rounded to
    nearest, ties to even)."""
    T, K = x.shape
    nb = K // 32
    xq = np.empty((T, K), np.int8)
    xd = np.empty((T, nb), np.float32)
    xs = np.empty((T, nb), np.float32)
    for t in range(T):
        for b in range(nb):
            amax = np.float32(0.0)
            for j in range(b * 32, b * 32 + 32):
                amax = max(amax, abs(x[t, j]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            total = 0
            for j in range(b * 32, b * 32 + 32):
                q = int(np.rint(x[t, j] * inv))
                xq[t, j] = q
                total += q
            xd[t, b] = d
            xs[t, b] = d * np.float32(total)
    return xq, xd, xs


@njit(inline="always", **OPTIONS)
def _block(w, o, xf, xo, acc):
    """One row's integer sums over one block: ``acc[r] += sum_j u[r, j] xq[j]``, the
    block's codes from ``w.codes[o]``, the row's int8 inputs from ``xf[xo]``."""
    if w.kind == Q4:
        for c in range(4):
            v = load_u8x64(w.codes, o + 64 * c)
            acc = dot4_nibbles(acc, low_nibbles(v), broadcast4(xf, xo + 4 * c))
            acc = dot4_nibbles(acc, high_nibbles(v), broadcast4(xf, xo + 16 + 4 * c))
    else:
        for c in range(8):
            acc = dot4(acc, load_u8x64(w.codes, o + 64 * c), broadcast4(xf, xo + 4 * c))
    return acc


@njit(inline="always", **OPTIONS)
def _block4(w, o, xf, xo, K, a0, a1, a2, a3):
    """:func:`_block` for four rows ``K`` apart: each code vector unpacked once, used 4x."""
    if w.kind == Q4:
        for c in range(4):
            v = load_u8x64(w.codes, o + 64 * c)
            lo, hi = low_nibbles(v), high_nibbles(v)
            j, h = xo + 4 * c, xo + 16 + 4 * c
            a0 = dot4_nibbles(dot4_nibbles(a0, lo, broadcast4(xf, j)), hi, broadcast4(xf, h))
            a1 = dot4_nibbles(dot4_nibbles(a1, lo, broadcast4(xf, j + K)), hi,
                              broadcast4(xf, h + K))
            a2 = dot4_nibbles(dot4_nibbles(a2, lo, broadcast4(xf, j + 2 * K)), hi,
                              broadcast4(xf, h + 2 * K))
            a3 = dot4_nibbles(dot4_nibbles(a3, lo, broadcast4(xf, j + 3 * K)), hi,
                              broadcast4(xf, h + 3 * K))
    else:
        for c in range(8):
            v = load_u8x64(w.codes, o + 64 * c)
            j = xo + 4 * c
            a0 = dot4(a0, v, broadcast4(xf, j))
            a1 = dot4(a1, v, broadcast4(xf, j + K))
            a2 = dot4(a2, v, broadcast4(xf, j + 2 * K))
            a3 = dot4(a3, v, broadcast4(xf, j + 3 * K))
    return a0, a1, a2, a3


@njit(inline="always", **OPTIONS)
def _scale(acc, dv, mv, xd, xs, f):
    """``f + m xs + d (xd acc)``: one row's block added to its float32 result, always in
    this order (the bits do not depend on the batch)."""
    return fma(dv, mul(to_f32(acc), splat(xd)), fma(mv, splat(xs), f))


@njit(inline="always", **OPTIONS)
def _scales(w, cb, minus128):
    """Block ``cb`` (chunk c's block b: ``c nb + b``) of ``w``: its 16 rows' scales ``d``
    and minimums ``m`` as vectors (Q8: ``m = -128 d``, the shift of its codes)."""
    dv = load_f32(w.scales, cb * ROWS)
    mv = mul(dv, minus128) if w.kind == Q8 else load_f32(w.mins, cb * ROWS)
    return dv, mv


@njit(parallel=True, **OPTIONS)
def matmul(w, x, y):
    """``y`` [T, C*16] = ``x`` float32 [T, K] times ``w`` (:class:`.layouts.Dot4Blocks`),
    the input quantized to int8 first. Parallel over 16-row chunks; in each, input rows
    four at a time (a code vector unpacked once for four rows), the rest one by one."""
    nb = w.blocks
    T, K = x.shape
    xq, xd, xs = quantize_rows(x)                                # [T, K], [T, nb], [T, nb]
    xf, yf = xq.reshape(-1), y.reshape(-1)
    N = w.chunks * ROWS                                          # y's row length
    step = w.quads * 64                                          # code bytes per chunk block
    minus128 = splat(np.float32(-128.0))
    for c in prange(w.chunks):
        t = 0
        while t < T:
            if t + 4 <= T:
                f0, f1, f2, f3 = zeros_f32(), zeros_f32(), zeros_f32(), zeros_f32()
                for b in range(nb):
                    cb = c * nb + b
                    z = zeros_i32()
                    a0, a1, a2, a3 = _block4(w, cb * step, xf, t * K + 32 * b, K, z, z, z, z)
                    dv, mv = _scales(w, cb, minus128)
                    f0 = _scale(a0, dv, mv, xd[t, b], xs[t, b], f0)
                    f1 = _scale(a1, dv, mv, xd[t + 1, b], xs[t + 1, b], f1)
                    f2 = _scale(a2, dv, mv, xd[t + 2, b], xs[t + 2, b], f2)
                    f3 = _scale(a3, dv, mv, xd[t + 3, b], xs[t + 3, b], f3)
                store_f32(yf, t * N + c * ROWS, f0)
                store_f32(yf, (t + 1) * N + c * ROWS, f1)
                store_f32(yf, (t + 2) * N + c * ROWS, f2)
                store_f32(yf, (t + 3) * N + c * ROWS, f3)
                t += 4
            else:
                f = zeros_f32()
                for b in range(nb):
                    cb = c * nb + b
                    a = _block(w, cb * step, xf, t * K + 32 * b, zeros_i32())
                    dv, mv = _scales(w, cb, minus128)
                    f = _scale(a, dv, mv, xd[t, b], xs[t, b], f)
                store_f32(yf, t * N + c * ROWS, f)
                t += 1


@njit(**JIT_OPTIONS)                  # as kernels.embed, contracted alike: the same bits
def embed(w, ids, out):
    """Rows ``ids`` (checked: 0 <= id < rows) of ``w`` -> ``out`` float32 [T, K]:
    ``d u + m`` (Q4) or ``d (u - 128)`` (Q8), the float kernels' values exactly."""
    nb, Q = w.blocks, w.quads
    for t in range(ids.shape[0]):
        c, r = ids[t] // ROWS, ids[t] % ROWS
        for b in range(nb):
            cb = c * nb + b
            db = w.scales[cb * ROWS + r]
            mb = w.mins[cb * ROWS + r] if w.kind == Q4 else np.float32(0.0)  # Q8: none
            for k in range(Q):
                for i in range(4):
                    u = w.codes[((cb * Q + k) * ROWS + r) * 4 + i]  # [C, nb, Q, 16, 4]
                    if w.kind == Q4:
                        out[t, 32 * b + 4 * k + i] = db * np.float32(u & np.uint8(15)) + mb
                        out[t, 32 * b + 16 + 4 * k + i] = db * np.float32(u >> np.uint8(4)) + mb
                    else:
                        out[t, 32 * b + 4 * k + i] = db * np.float32(np.int32(u) - 128)
