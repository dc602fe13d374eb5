"""Scores of a transposed K page: one vector load serves 16 keys (``kv_layout="k_transposed"``).

In the default layout a kv head's K page is ``[page_size, head_dim]``: a
key's dimensions lie side by side, so ``q . k`` multiplies along a row and
must *reduce* the vector across its lanes at the end (a few shuffles and adds
per score: :func:`~paged_np.attention.numba_kernels.tile_scores_4x4` spends
about as many instructions on them as on the multiply-adds).

Transpose the page to ``[head_dim, page_size]`` and dimension ``d`` of 16
consecutive keys is one 64-byte run: one 512-bit load. The scores of those 16
keys for one query row are then ``head_dim`` multiply-adds of a *broadcast*
``q[d]`` with that vector, summed lane by lane: key ``t`` stays in lane ``t``
from the first dimension to the last, so nothing is reduced across lanes and
the 16 scores come out in order, ready to store::

    acc[0:16] = 0
    for d in range(head_dim):
        acc[0:16] += q[d] * K_T[d, t0:t0+16]     # one load, one FMA per row
    s[row, t0:t0+16] = acc

Four query rows (the GQA heads that share the kv head) share each load, so a
load feeds four FMAs and the four sums stay in registers (8 of AVX2's 16).
This is vLLM's first paged-attention key layout ``[num_blocks, num_kv_heads,
head_size / x, block_size, x]`` with ``x = 1``: on a GPU each thread owned one
key and read ``x`` of its dimensions (16 bytes) at once; on a CPU the vector
runs across keys instead, so ``x`` is one element.

The fast path needs float32 pages and a page size that is a multiple of 16;
other page formats (float16 bits, 8-bit codes) and page sizes take
:func:`tile_scores_kt_any`, the same loop with the sums in the score rows
(widened element by element, which LLVM still vectorises across keys).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core.extending import intrinsic

from ..config import JIT_OPTIONS
from ..quant.simd import (
    CACHE_LINE,
    HAS_AVX512,
    LANES,
    V_F32,
    F32x16,
    address,
    fma,
    jitted_as,
    load_f32,
    prefetch_l2,
    splat_ir,
    store_f32,
    zeros_f32,
)
from .numba_kernels import accumulate_pv
from .numba_widen import target_widens_half, to_f32


@intrinsic
def _splat_at(typingctx, a, i):
    def codegen(context, builder, sig, args):
        x = builder.load(address(context, builder, sig.args[0], *args, V_F32.element))
        return splat_ir(builder, x, V_F32)
    return F32x16(a, i), codegen


@intrinsic
def _load_half16(typingctx, a, i):
    """LLVM: the 16 float16 bit patterns ``a[i:i+16]`` (uint16) widened to float32
    (``vcvtph2ps`` with F16C; used only where :func:`target_widens_half`)."""
    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(ir.IntType(16), LANES)
        bits = builder.load(address(context, builder, sig.args[0], *args, v16), align=2)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), V_F32)
    return F32x16(a, i), codegen


@jitted_as(_load_half16)
def load_half16(a, i):
    """``a``'s flat elements ``i:i+16``, float16 bit patterns, as float32."""
    return a.reshape(-1)[i:i + LANES].view(np.float16).astype(np.float32)


#: Whether float16 pages widen 16 at a time in vectors (the target has F16C).
HALF_VECTORS = target_widens_half()


@jitted_as(_splat_at)
def splat_at(a, i):
    """``a``'s flat element ``i`` in all 16 lanes: one broadcast load (no negative-index
    wrap-around: a plain ``a.flat[i]`` in jitted code tests ``i < 0`` at every load)."""
    return np.full(LANES, a.reshape(-1)[i], np.float32)


@jitted_as(fma)
def fmadd(a, b, c):
    """``a * b + c`` lane by lane, rounded once (the NumPy twin of ``simd.fma``)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


@njit(**JIT_OPTIONS)
def tile_scores_kt(qt, qtt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid, kw):
    """``s[r0:r1, col0:col0+P] = qt[r0:r1] @ kp[pid, kvh]`` for a transposed page ``[D, P]``.

    ``qtt`` is ``qt`` transposed (``[D, rows]``): the four rows' ``q[d]`` then
    lie side by side, one address for all four broadcasts (four row pointers
    spilled to the stack, measured in ``inspect_asm``). Writes the page's
    whole ``P`` columns (``s`` has room: a block is whole pages); columns past
    ``n_keys`` hold scores of stale slots, which the caller masks
    (:func:`~paged_np.attention.numba_kernels.pad_block`) or never reads.
    ``r1 - r0`` is a multiple of 4. As it reads the page it prefetches the
    next one, ``kp[next_pid, kvh]`` (``< 0``: none), a cache line per vector.

    Pages of float16 bits or 8-bit codes are first widened whole into ``kw``
    (float32 ``[1, 1, D, P]``, :func:`widen_tile`) and scored from there: the
    widening vectorises, and the scores then take the same vector tile.
    """
    if kp.shape[3] % LANES:
        tile_scores_kt_any(qt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid)
    elif kp.itemsize != 4:  # float32 is the one 4-byte format
        widen_tile(kp, pid, kvh, kw, next_pid)
        _tile_scores_vectors(qtt, kw, 0, 0, s, r0, r1, col0, n_keys, -1)
    else:
        _tile_scores_vectors(qtt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid)


@njit(**JIT_OPTIONS)
def widen_tile(src, pid, kvh, dst, next_pid):
    """``dst[0, 0] = src[pid, kvh]`` widened to float32 (:func:`to_f32`), and a prefetch
    of every cache line of the tile ``src[next_pid, kvh]`` (``< 0``: none)."""
    n = src.shape[2] * src.shape[3]                    # the tile: n contiguous elements
    flat, out = src.reshape(-1), dst.reshape(-1)       # views (both are C-contiguous)
    start = (pid * src.shape[1] + kvh) * n
    if src.itemsize == 2 and HALF_VECTORS and n % LANES == 0:  # float16: 16 per instruction
        for i in range(0, n, LANES):
            store_f32(out, i, load_half16(flat, start + i))
    else:
        for i in range(n):
            out[i] = to_f32(flat[start + i])
    if next_pid >= 0:
        start = (next_pid * src.shape[1] + kvh) * n
        for i in range(start, start + n, CACHE_LINE // src.itemsize):
            prefetch_l2(src, i)


@njit(**JIT_OPTIONS)
def _tile_scores_vectors(qtt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid):
    """:func:`tile_scores_kt` for float32 pages of 16k keys, 16 keys per vector."""
    D, P = kp.shape[2], kp.shape[3]
    base = (pid * kp.shape[1] + kvh) * D * P           # flat offset of the page's tile
    pbase = ((next_pid if next_pid >= 0 else pid) * kp.shape[1] + kvh) * D * P
    for t0 in range(0, min(n_keys, P), LANES):         # 16 keys per vector
        r = r0
        while r < r1:                                  # eight rows at a time where they fit
            if WIDE and r + 8 <= r1:
                _scores_8(qtt, kp, s, base + t0, pbase + t0, P, D, r, col0 + t0)
                r += 8
            else:
                _scores_4(qtt, kp, s, base + t0, pbase + t0, P, D, r, col0 + t0)
                r += 4


#: Eight rows per pass where the target has 32 vector registers (8 sums and a key
#: vector fit); four on AVX2's 16 (a 16-lane vector is two of its registers there).
WIDE = HAS_AVX512


@njit(**JIT_OPTIONS)
def _scores_4(qtt, kp, s, k0, p0, P, D, r, c):
    """``s[r:r+4, c:c+16] = qt[r:r+4] @ K_T[:, 16 keys]``, the keys at flat ``k0 + d * P``;
    prefetches the line at ``p0 + d * P`` as it goes."""
    R, W = qtt.shape[1], s.shape[1]                    # s, qtt are C-contiguous
    a0, a1, a2, a3 = zeros_f32(), zeros_f32(), zeros_f32(), zeros_f32()
    for d in range(D):
        prefetch_l2(kp, p0 + d * P)                    # the next page (a hint, never waits)
        k = load_f32(kp, k0 + d * P)                   # K_T[d, t0:t0+16]
        i = d * R + r                                  # qtt[d, r:r+4], flat
        a0 = fmadd(splat_at(qtt, i), k, a0)
        a1 = fmadd(splat_at(qtt, i + 1), k, a1)
        a2 = fmadd(splat_at(qtt, i + 2), k, a2)
        a3 = fmadd(splat_at(qtt, i + 3), k, a3)
    store_f32(s, r * W + c, a0)
    store_f32(s, (r + 1) * W + c, a1)
    store_f32(s, (r + 2) * W + c, a2)
    store_f32(s, (r + 3) * W + c, a3)


@njit(**JIT_OPTIONS)
def _scores_8(qtt, kp, s, k0, p0, P, D, r, c):
    """:func:`_scores_4` for eight rows: each key vector loaded feeds eight FMAs, enough
    independent sums to keep both FMA units busy through their latency (prefill)."""
    R, W = qtt.shape[1], s.shape[1]
    a0, a1, a2, a3 = zeros_f32(), zeros_f32(), zeros_f32(), zeros_f32()
    a4, a5, a6, a7 = zeros_f32(), zeros_f32(), zeros_f32(), zeros_f32()
    for d in range(D):
        prefetch_l2(kp, p0 + d * P)
        k = load_f32(kp, k0 + d * P)
        i = d * R + r
        a0 = fmadd(splat_at(qtt, i), k, a0)
        a1 = fmadd(splat_at(qtt, i + 1), k, a1)
        a2 = fmadd(splat_at(qtt, i + 2), k, a2)
        a3 = fmadd(splat_at(qtt, i + 3), k, a3)
        a4 = fmadd(splat_at(qtt, i + 4), k, a4)
        a5 = fmadd(splat_at(qtt, i + 5), k, a5)
        a6 = fmadd(splat_at(qtt, i + 6), k, a6)
        a7 = fmadd(splat_at(qtt, i + 7), k, a7)
    store_f32(s, r * W + c, a0)
    store_f32(s, (r + 1) * W + c, a1)
    store_f32(s, (r + 2) * W + c, a2)
    store_f32(s, (r + 3) * W + c, a3)
    store_f32(s, (r + 4) * W + c, a4)
    store_f32(s, (r + 5) * W + c, a5)
    store_f32(s, (r + 6) * W + c, a6)
    store_f32(s, (r + 7) * W + c, a7)


@njit(**JIT_OPTIONS)
def tile_scores_kt_any(qt, kp, pid, kvh, s, r0, r1, col0, n_keys, next_pid):
    """:func:`tile_scores_kt` for any page format and size: the sums live in ``s``'s rows.

    Writes columns ``col0 .. col0 + n_keys - 1``. Each score is still summed
    over ``d`` in order, one multiply-add at a time, so its bits do not depend
    on how many keys the page holds.
    """
    D = kp.shape[2]
    for r in range(r0, r1):
        for t in range(n_keys):
            s[r, col0 + t] = 0.0
    for d in range(D):
        if next_pid >= 0:
            prefetch_l2(kp, ((next_pid * kp.shape[1] + kvh) * D + d) * kp.shape[3])
        for r in range(r0, r1):
            qd = qt[r, d]
            for t in range(n_keys):
                s[r, col0 + t] += qd * to_f32(kp[pid, kvh, d, t])


@njit(**JIT_OPTIONS)
def accumulate_pv_kt(p, vp, pid, kvh, acc, r0, r1, col0, n_keys, next_pid, vw):
    """``acc[r0:r1] += p[r0:r1, col0:col0+n_keys] @ vp[pid, kvh, :n_keys]``, in vectors.

    The value pass of either layout (V pages are ``[page_size, head_dim]`` in
    both), for float32 pages and ``head_dim`` a multiple of 16; else
    :func:`~paged_np.attention.numba_kernels.accumulate_pv`. For each 16
    dimensions, four rows' sums stay in registers while the page's keys go
    by: one load of ``V[t, c:c+16]`` feeds four FMAs with the broadcast
    weights ``p[row, t]``. Keys are added one at a time, in order, so a
    key a row cannot see (weight 0) leaves its sums' bits as they were.
    Pages of float16 bits or 8-bit codes are widened whole into ``vw`` (float32
    ``[1, 1, P, D]``) first, as :func:`tile_scores_kt` does.
    """
    D = acc.shape[1]
    if D % LANES:
        accumulate_pv(p, vp, pid, kvh, acc, r0, r1, col0, n_keys, next_pid)
        return
    if vp.itemsize != 4:
        widen_tile(vp, pid, kvh, vw, next_pid)
        _accumulate_pv_vectors(p, vw, 0, 0, acc, r0, r1, col0, n_keys, -1)
    else:
        _accumulate_pv_vectors(p, vp, pid, kvh, acc, r0, r1, col0, n_keys, next_pid)


@njit(**JIT_OPTIONS)
def _accumulate_pv_vectors(p, vp, pid, kvh, acc, r0, r1, col0, n_keys, next_pid):
    """:func:`accumulate_pv_kt` for float32 pages."""
    D, P = acc.shape[1], vp.shape[2]
    base = (pid * vp.shape[1] + kvh) * P * D           # flat offset of the page's tile
    pbase = ((next_pid if next_pid >= 0 else pid) * vp.shape[1] + kvh) * P * D
    for c in range(0, D, LANES):
        r = r0
        while r < r1:                                  # eight rows at a time where they fit
            if WIDE and r + 8 <= r1:
                _values_8(p, vp, acc, base + c, pbase + c, D, r, c, col0, n_keys)
                r += 8
            else:
                _values_4(p, vp, acc, base + c, pbase + c, D, r, c, col0, n_keys)
                r += 4


@njit(**JIT_OPTIONS)
def _values_4(p, vp, acc, v0, p0, D, r, c, col0, n_keys):
    """``acc[r:r+4, c:c+16] += p[r:r+4, col0:col0+n_keys] @ V[:n_keys, c:c+16]``, V's row
    ``t`` at flat ``v0 + t * D``; prefetches the line at ``p0 + t * D`` as it goes."""
    W = p.shape[1]                                     # p and acc are C-contiguous
    a0, a1 = load_f32(acc, r * D + c), load_f32(acc, (r + 1) * D + c)
    a2, a3 = load_f32(acc, (r + 2) * D + c), load_f32(acc, (r + 3) * D + c)
    for t in range(n_keys):
        prefetch_l2(vp, p0 + t * D)                    # the next page (a hint)
        v = load_f32(vp, v0 + t * D)                   # V[t, c:c+16]
        i = r * W + col0 + t                           # p[r, col0 + t], flat
        a0 = fmadd(splat_at(p, i), v, a0)
        a1 = fmadd(splat_at(p, i + W), v, a1)
        a2 = fmadd(splat_at(p, i + 2 * W), v, a2)
        a3 = fmadd(splat_at(p, i + 3 * W), v, a3)
    store_f32(acc, r * D + c, a0)
    store_f32(acc, (r + 1) * D + c, a1)
    store_f32(acc, (r + 2) * D + c, a2)
    store_f32(acc, (r + 3) * D + c, a3)


@njit(**JIT_OPTIONS)
def _values_8(p, vp, acc, v0, p0, D, r, c, col0, n_keys):
    """:func:`_values_4` for eight rows (prefill): a value vector feeds eight FMAs."""
    W = p.shape[1]
    a0, a1 = load_f32(acc, r * D + c), load_f32(acc, (r + 1) * D + c)
    a2, a3 = load_f32(acc, (r + 2) * D + c), load_f32(acc, (r + 3) * D + c)
    a4, a5 = load_f32(acc, (r + 4) * D + c), load_f32(acc, (r + 5) * D + c)
    a6, a7 = load_f32(acc, (r + 6) * D + c), load_f32(acc, (r + 7) * D + c)
    for t in range(n_keys):
        prefetch_l2(vp, p0 + t * D)
        v = load_f32(vp, v0 + t * D)
        i = r * W + col0 + t
        a0 = fmadd(splat_at(p, i), v, a0)
        a1 = fmadd(splat_at(p, i + W), v, a1)
        a2 = fmadd(splat_at(p, i + 2 * W), v, a2)
        a3 = fmadd(splat_at(p, i + 3 * W), v, a3)
        a4 = fmadd(splat_at(p, i + 4 * W), v, a4)
        a5 = fmadd(splat_at(p, i + 5 * W), v, a5)
        a6 = fmadd(splat_at(p, i + 6 * W), v, a6)
        a7 = fmadd(splat_at(p, i + 7 * W), v, a7)
    store_f32(acc, r * D + c, a0)
    store_f32(acc, (r + 1) * D + c, a1)
    store_f32(acc, (r + 2) * D + c, a2)
    store_f32(acc, (r + 3) * D + c, a3)
    store_f32(acc, (r + 4) * D + c, a4)
    store_f32(acc, (r + 5) * D + c, a5)
    store_f32(acc, (r + 6) * D + c, a6)
    store_f32(acc, (r + 7) * D + c, a7)
