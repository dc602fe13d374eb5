"""The two layouts a quantized matrix is held in, drawn, with their pack and unpack.

The file stores a matrix row by row (``q [out, nb, 32]``, ``d, m [out, nb]``
from :func:`.blocks.parse_blocks`: row ``r``'s block ``b`` holds its weights of
inputs ``32 b .. 32 b + 31``). The kernels want the rows *side by side*
instead, so that one vector instruction works on many output rows at once and
no lane ever has to be summed with its neighbour. Each layout is repacked once,
on load, and is also the record the kernels take (a ``NamedTuple`` of flat
arrays and their dimensions: Numba passes it as a struct, for free):

- :class:`GroupedBlocks`, for float32 inputs (:mod:`.kernels`);
- :class:`Dot4Blocks`, for int8 inputs (:mod:`.int8`).

Both say how to read their codes by ``kind`` (:data:`.formats.Q4` or
:data:`.formats.Q8`). Scales and minimums are widened
from float16 to float32 here, so no kernel converts float16. Output rows are
padded with zero rows to a whole group (chunk); the padded results are never
shown.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba.core.extending import overload

from .blocks import BLOCK
from .formats import Q4, Q8

#: Output rows per group of :class:`GroupedBlocks`: four 16-lane vectors. (Matrices whose
#: row count is a multiple of 128 had groups of 128 while LLVM vectorised the kernels'
#: loops, where a longer loop paid its entry cost less often; with explicit vectors and
#: the first pass converting the codes, 64 is 2-5% faster at 9 rows and 1-3% at one: the
#: "128 lanes" column of ``benchmarks/quant_kernels_avx2.md``.)
LANES = 64
#: Output rows per chunk of :class:`Dot4Blocks`: the lanes of one int32 vector.
DOT4_ROWS = 16


def codes_kind(w) -> int:
    """``w.kind`` (:data:`.formats.Q4` or :data:`.formats.Q8`) of a :class:`GroupedBlocks`.

    Jitted code reads it from the type of the codes instead (uint8 bytes: Q4, int8: Q8),
    so that it is a constant where Numba compiles: each float kernel is compiled once per
    kind, and the other kind's branches are gone from its loops (read from the field at
    run time, they left one pass over SmolLM2's matrices 3% slower at one row and 20%
    at 9-16).
    """
    return w.kind


@overload(codes_kind, inline="always")
def _codes_kind_jitted(w):
    kind = Q8 if dict(zip(w.fields, w.types))["codes"].dtype.signed else Q4
    return lambda w: kind


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` ``[out, ...]`` with zero rows appended up to ``rows``."""
    return np.pad(a, ((0, rows - a.shape[0]),) + ((0, 0),) * (a.ndim - 1))


def _nibble_pairs(q: np.ndarray, axis: int) -> np.ndarray:
    """Q4 codes ``[..., 32 (at axis), ...]`` -> bytes ``[..., 16, ...]``: code ``j`` in the
    low nibble, code ``j + 16`` in the high one (the file's own pairing)."""
    lo = np.take(q, range(16), axis=axis)
    hi = np.take(q, range(16, 32), axis=axis)
    return (lo | (hi << 4)).astype(np.uint8)


# The float kernels' layout. One group g is LANES = 64 consecutive output rows; for each
# of its blocks b the codes are stored input by input, the group's 64 rows side by side:
#
#     Q8: codes [G, nb, 32, R]                  Q4: codes [G, nb, 16, R]
#                r=0    r=1   ...  r=63                    r=0          ...  r=63
#         j=0    q0,0   q1,0  ...  q63,0           j=0     q0,0|q0,16   ...  q63,0|q63,16
#         j=1    q0,1   q1,1  ...  q63,1           j=1     q0,1|q0,17   ...
#         ...                                      ...
#         j=31   q0,31  q1,31 ...  q63,31          j=15    q0,15|q0,31  ...  q63,15|q63,31
#
#     scales, mins [G, nb, R]: row r's d and m of block b, side by side too
#
# (q r,j: row r's code of input 32 b + j; lo|hi: one byte, its low nibble and its high.)
# Why: the kernels broadcast one input x[32 b + j] to 16 lanes and load 16 rows' codes
# of row j in one instruction (16 consecutive bytes): a multiply-add into 16 output rows
# whose lanes never need to be summed together. A block's scales are then one vector
# too, applied once per block. A Q4 byte keeps the file's pairing (j with j + 16), so
# the kernels pair the inputs to match (:func:`.kernels.inputs`).
class GroupedBlocks(NamedTuple):
    """A matrix for float32 inputs: codes ``[G, nb, J, R]`` (flat), scales and minimums
    ``[G, nb, R]`` (flat; Q8's minimums empty), drawn above."""

    kind: int                #: Q4 or Q8 (jitted code: :func:`codes_kind`)
    codes: np.ndarray        #: flat [G, nb, J, R]: uint8 (Q4's nibble pairs), int8 (Q8)
    scales: np.ndarray       #: float32, flat [G, nb, R]
    mins: np.ndarray         #: float32, flat [G, nb, R]; Q8: empty (no minimum)
    groups: int              #: G, output row groups
    blocks: int              #: nb, blocks of 32 inputs
    code_rows: int           #: J, byte rows per block: 16 (Q4, two codes a byte) or 32 (Q8)
    lanes: int               #: R, output rows per group

    @classmethod
    def pack(cls, kind: int, q, d, m, lanes: int = LANES) -> GroupedBlocks:
        """``q`` ``[out, nb, 32]``, ``d`` and ``m`` ``[out, nb]`` -> this layout."""
        out, nb = d.shape
        G = -(-out // lanes)
        qp = _pad_rows(q, G * lanes).reshape(G, lanes, nb, BLOCK)        # [G, R, nb, 32]
        qp = qp.transpose(0, 2, 3, 1)                                    # [G, nb, 32, R]
        if kind == Q4:
            codes = _nibble_pairs(qp, axis=2)                            # [G, nb, 16, R]
        else:
            codes = qp.astype(np.int8)                                   # [G, nb, 32, R]

        def side_by_side(a):                                             # [out, nb] -> [G, nb, R]
            a = _pad_rows(a.astype(np.float32), G * lanes).reshape(G, lanes, nb)
            return np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(-1)

        mins = side_by_side(m) if kind == Q4 else np.zeros(0, np.float32)
        return cls(kind, np.ascontiguousarray(codes).reshape(-1), side_by_side(d), mins,
                   G, nb, codes.shape[2], lanes)

    def unpack(self, out: int):
        """Back to the file's order: ``(q [out, nb, 32], d, m [out, nb])``."""
        G, nb, J, R = self.groups, self.blocks, self.code_rows, self.lanes
        codes = self.codes.reshape(G, nb, J, R)
        if self.kind == Q4:
            q = np.concatenate([codes & 0x0F, codes >> 4], axis=2)       # [G, nb, 32, R]
        else:
            q = codes
        q = q.transpose(0, 3, 1, 2).reshape(G * R, nb, BLOCK)[:out]
        d = self.scales.reshape(G, nb, R).transpose(0, 2, 1).reshape(G * R, nb)[:out]
        if self.kind == Q4:
            m = self.mins.reshape(G, nb, R).transpose(0, 2, 1).reshape(G * R, nb)[:out]
        else:
            m = np.zeros_like(d)
        return q, d, m

    @property
    def padded_rows(self) -> int:
        """Output rows the kernels write, padding included (``G * R``)."""
        return self.groups * self.lanes


# The int8 kernels' layout. One chunk c is DOT4_ROWS = 16 output rows, the 16 lanes of an
# int32 vector; in each of its blocks b the codes of four consecutive inputs of one row sit
# side by side, as AVX-512 VNNI's vpdpbusd reads them (lane r: four unsigned bytes times
# four signed input bytes, summed into lane r's int32):
#
#     codes [C, nb, Q, 16, 4]: one 64-byte vector per k = 0 .. Q-1
#
#         k=0:  [r=0: u0 u1 u2 u3] [r=1: u0 u1 u2 u3] ... [r=15: u0 u1 u2 u3]
#         k=1:  [r=0: u4 u5 u6 u7] [r=1: u4 u5 u6 u7] ...
#         ...
#
#     Q8 (Q = 8): u4k+i = row r's code of input 32 b + 4k + i, plus 128 (unsigned)
#     Q4 (Q = 4): u4k+i = row r's codes of inputs 4k + i (low nibble) and 16 + 4k + i (high)
#     scales, mins [C, nb, 16]: row r's d and m of block b (Q8: m = -128 d, not stored)
#
# Why: one load and one vpdpbusd take 64 codes: 4 inputs x 16 rows, the four inputs
# broadcast to every lane (:func:`.simd.broadcast4`). Q8's codes are shifted to unsigned
# (the instruction's left operand is unsigned) and the shift comes back as a minimum
# -128 d, so both formats are w = d u + m.
class Dot4Blocks(NamedTuple):
    """A matrix for int8 inputs: codes ``[C, nb, Q, 16, 4]`` (flat), scales and minimums
    ``[C, nb, 16]`` (flat; Q8's minimums empty), drawn above."""

    kind: int                #: Q4 or Q8
    codes: np.ndarray        #: uint8, flat [C, nb, Q, 16, 4]
    scales: np.ndarray       #: float32, flat [C, nb, 16]
    mins: np.ndarray         #: float32, flat [C, nb, 16]; Q8: empty (-128 d, computed)
    chunks: int              #: C, chunks of 16 output rows
    blocks: int              #: nb, blocks of 32 inputs
    quads: int               #: Q, 64-byte vectors per block: 4 (Q4) or 8 (Q8)

    @classmethod
    def pack(cls, kind: int, q, d, m) -> Dot4Blocks:
        """``q`` ``[out, nb, 32]``, ``d`` and ``m`` ``[out, nb]`` -> this layout."""
        out, nb = d.shape
        C = -(-out // DOT4_ROWS)
        q = _pad_rows(q, C * DOT4_ROWS).reshape(C, DOT4_ROWS, nb, BLOCK)  # [C, 16, nb, 32]
        if kind == Q8:
            u = (q.astype(np.int16) + 128).astype(np.uint8)               # u = q + 128
        else:
            u = _nibble_pairs(q, axis=3)                                  # [C, 16, nb, 16]
        Q = u.shape[3] // 4
        codes = u.reshape(C, DOT4_ROWS, nb, Q, 4).transpose(0, 2, 3, 1, 4)  # [C, nb, Q, 16, 4]

        def side_by_side(a):                                              # [out, nb] -> [C, nb, 16]
            a = _pad_rows(a.astype(np.float32), C * DOT4_ROWS).reshape(C, DOT4_ROWS, nb)
            return np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(-1)

        mins = side_by_side(m) if kind == Q4 else np.zeros(0, np.float32)
        return cls(kind, np.ascontiguousarray(codes).reshape(-1), side_by_side(d), mins,
                   C, nb, Q)

    def unpack(self, out: int):
        """Back to the file's order: ``(q [out, nb, 32], d, m [out, nb])``."""
        C, nb, Q = self.chunks, self.blocks, self.quads
        u = self.codes.reshape(C, nb, Q, DOT4_ROWS, 4).transpose(0, 3, 1, 2, 4)
        u = u.reshape(C * DOT4_ROWS, nb, Q * 4)[:out]                     # [out, nb, 4Q]
        d = self.scales.reshape(C, nb, DOT4_ROWS).transpose(0, 2, 1).reshape(-1, nb)[:out]
        if self.kind == Q8:
            return (u.astype(np.int16) - 128).astype(np.int8), d, np.zeros_like(d)
        m = self.mins.reshape(C, nb, DOT4_ROWS).transpose(0, 2, 1).reshape(-1, nb)[:out]
        return np.concatenate([u & 0x0F, u >> 4], axis=2), d, m

    @property
    def padded_rows(self) -> int:
        """Output rows the kernel writes, padding included (``C * 16``)."""
        return self.chunks * DOT4_ROWS
