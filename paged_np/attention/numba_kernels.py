"""The small @njit helpers of the Numba paged attention kernel.

Everything here works on one *tile*: a block of query rows against the tokens
of one page of one kv head, a contiguous ``[page_size, head_dim]`` slab of the
arena (HND layout). :mod:`paged_np.attention.numba_cpu` strings the tiles
together (the driver) and validates nothing: it relies on the public
``paged_attention`` for that.

Three tricks make these loops fast, and each is one function here:

- **base-2 softmax.** The driver multiplies ``q`` by ``scale * log2(e)`` once,
  so scores are in log2 units and the softmax needs ``2**x``, which is a
  shift of the exponent bits plus a short polynomial (:func:`exp2`). LLVM
  vectorises it; ``np.exp`` would be a scalar libm call per score.
- **four keys at a time.** The dot products and the ``p @ V`` update walk four
  tokens of the page per pass, so every load of a query row (or of an
  accumulator row) is used four times.
- **float16 pages as bits.** Numba cannot load ``float16`` on the CPU, so the
  driver passes the pages as ``uint16`` and :func:`tile_f32` widens one page
  tile to float32 in a scratch buffer, with integer operations only.

``fastmath`` assumes there are no infinities, so nothing here starts at
``-inf``: the running max starts at :data:`EMPTY` (``-1e30``) and masked scores
are :data:`MASKED` (``-2e30``), whose ``exp2`` is exactly 0 even in a row that
has seen nothing yet.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..config import JIT_OPTIONS

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
    """``2**x`` for ``x <= 0`` in float32; exactly 0 below ``-126``."""
    if x < -126.0:
        return np.float32(0.0)
    n = np.floor(x + np.float32(0.5))  # nearest integer: 2**x = 2**n * 2**f
    f = x - n  # f in [-0.5, 0.5]
    p = np.float32(1.0) + f * (_C1 + f * (_C2 + f * (_C3 + f * (_C4 + f * (_C5 + f * _C6)))))
    # 2**n built directly in the exponent bits of a float32
    two_n = np.uint32((np.int32(n) + 127) << 23).view(np.float32)
    return p * two_n


@njit(**JIT_OPTIONS)
def half_to_f32(h):
    """Widen the bits of one IEEE float16 (a uint16) to float32.

    Moving the 15 low bits up by 13 lines the float16 exponent and mantissa up
    with float32's; the result is then too small by 2**112 (the difference of
    the exponent biases), which one multiply fixes, subnormals included.
    """
    bits = np.uint32(h)
    mag = np.uint32((bits & np.uint32(0x7FFF)) << np.uint32(13)).view(np.float32)
    sign = np.float32(1.0) - np.float32(2.0) * np.float32(bits >> np.uint32(15))
    return mag * np.float32(5.192296858534828e33) * sign  # 2**112


def tile_f32(tile, buf, n):
    """The first ``n`` rows of a page tile as float32 ``[>=n, head_dim]``.

    Plain-Python version (``NUMBA_DISABLE_JIT=1``); the jitted one below
    returns float32 tiles untouched and widens uint16 (float16 bits) into ``buf``.
    """
    if tile.dtype == np.uint16:
        buf[:n] = tile[:n].view(np.float16)
        return buf
    return tile


@overload(tile_f32, jit_options=JIT_OPTIONS)
def _tile_f32_jit(tile, buf, n):
    if tile.dtype == types.float32:
        return lambda tile, buf, n: tile  # read the arena in place

    def widen(tile, buf, n):  # [n, D] uint16 -> [n, D] float32 in buf
        for t in range(n):
            for d in range(tile.shape[1]):
                buf[t, d] = half_to_f32(tile[t, d])
        return buf

    return widen


@njit(**JIT_OPTIONS)
def tile_scores(qt, k, s, n_rows, n_keys):
    """``s[:n_rows, :n_keys] = qt[:n_rows] @ k[:n_keys].T`` (rows x keys).

    Four keys per pass: each query element loaded feeds four dot products.
    """
    D = qt.shape[1]
    t = 0
    while t + 3 < n_keys:
        k0, k1, k2, k3 = k[t], k[t + 1], k[t + 2], k[t + 3]  # 4 x [D]
        for r in range(n_rows):
            qr = qt[r]  # [D]
            x0 = x1 = x2 = x3 = np.float32(0.0)
            for d in range(D):
                qd = qr[d]
                x0 += qd * k0[d]
                x1 += qd * k1[d]
                x2 += qd * k2[d]
                x3 += qd * k3[d]
            s[r, t], s[r, t + 1], s[r, t + 2], s[r, t + 3] = x0, x1, x2, x3
        t += 4
    while t < n_keys:  # the last 0-3 keys of the page
        kt = k[t]
        for r in range(n_rows):
            qr = qt[r]
            x = np.float32(0.0)
            for d in range(D):
                x += qr[d] * kt[d]
            s[r, t] = x
        t += 1


@njit(**JIT_OPTIONS)
def mask_scores(s, row_pos, n_rows, key_pos0, n_keys, window):
    """Set ``s[r, t] = MASKED`` where key ``key_pos0 + t`` is invisible to row ``r``.

    Causal: a key after the row's query position is masked. Sliding window:
    keys at or before ``row_pos - window`` are masked too.
    """
    for r in range(n_rows):
        p = row_pos[r]
        for t in range(n_keys):
            j = key_pos0 + t
            if j > p or (window > 0 and j <= p - window):
                s[r, t] = MASKED


@njit(**JIT_OPTIONS)
def online_softmax(s, m, l, acc, n_rows, n_keys):
    """Fold one tile's scores into the running (max, sum); rescale ``acc``.

    On return ``s[r, :n_keys]`` holds the weights ``p = 2**(s - m_new)`` that
    the ``p @ V`` step adds to the accumulator.
    """
    D = acc.shape[1]
    for r in range(n_rows):
        sr = s[r]
        m_new = m[r]
        for t in range(n_keys):
            m_new = max(m_new, sr[t])
        alpha = exp2(m[r] - m_new)  # how much the old sum and acc shrink
        total = np.float32(0.0)
        for t in range(n_keys):
            p = exp2(sr[t] - m_new)
            sr[t] = p
            total += p
        m[r] = m_new
        l[r] = l[r] * alpha + total
        if alpha != 1.0:
            ar = acc[r]
            for d in range(D):
                ar[d] *= alpha


@njit(**JIT_OPTIONS)
def accumulate_pv(p, v, acc, n_rows, n_keys):
    """``acc[:n_rows] += p[:n_rows, :n_keys] @ v[:n_keys]``, four keys per pass."""
    D = acc.shape[1]
    t = 0
    while t + 3 < n_keys:
        v0, v1, v2, v3 = v[t], v[t + 1], v[t + 2], v[t + 3]  # 4 x [D]
        for r in range(n_rows):
            ar = acc[r]  # [D]
            p0, p1, p2, p3 = p[r, t], p[r, t + 1], p[r, t + 2], p[r, t + 3]
            for d in range(D):
                ar[d] += (p0 * v0[d] + p1 * v1[d]) + (p2 * v2[d] + p3 * v3[d])
        t += 4
    while t < n_keys:  # the last 0-3 keys
        vt = v[t]
        for r in range(n_rows):
            ar = acc[r]
            pt = p[r, t]
            for d in range(D):
                ar[d] += pt * vt[d]
        t += 1
