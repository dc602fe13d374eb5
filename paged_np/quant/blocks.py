"""GGUF's block formats, read the obvious way: bytes -> (values, scales, mins) -> float32.

A quantized row of ``in`` weights is cut into blocks of 32 weights; each block
stores one float16 scale ``d`` (and for Q4_1 a float16 minimum ``m``) and 32
small integers ``q``. The weight is ``w = d * q + m``:

============  =====================================  ========================  ===============
format        bytes per block of 32                  q                         w
============  =====================================  ========================  ===============
``Q8_0``      34: d (2), 32 x int8                   -128..127                 ``d * q``
``Q4_0``      18: d (2), 16 bytes of nibbles         0..15                     ``d * (q - 8)``
``Q4_1``      20: d (2), m (2), 16 bytes of nibbles  0..15                     ``d * q + m``
============  =====================================  ========================  ===============

(The table of formats the code reads is :data:`.formats.BLOCK_FORMATS`.)

A nibble byte ``j`` (0..15) of a Q4 block holds weight ``j`` in its low four
bits and weight ``j + 16`` in its high four bits (not ``2j`` and ``2j+1``).

Everything here is NumPy and written for reading: :func:`parse_blocks` turns a
GGUF tensor's raw bytes into ``(q, d, m)`` with ``m = -8 d`` for Q4_0 (so the
three formats share one formula), :func:`dequantize_blocks` is that formula,
and :func:`quantize_q8_0` is what llama.cpp's converter does to a float row
(``d = max|w| / 127``, ``q = round(w / d)``). The Numba kernels in
:mod:`.kernels` are checked against these.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from .formats import FLOAT_FORMATS, FORMATS, QUANT_FORMATS

__all__ = ["BLOCK", "FLOAT_FORMATS", "FORMATS", "QUANT_FORMATS", "dequantize_blocks",
           "dequantize_raw", "parse_blocks", "quantize_q8_0"]

#: Weights per block (every GGUF format here).
BLOCK = 32


def parse_blocks(raw: np.ndarray, fmt: str, rows: int, cols: int):
    """A GGUF tensor's bytes -> ``q`` ``[rows, cols/32, 32]``, ``d`` and ``m`` ``[rows, cols/32]``.

    ``raw`` is the tensor's data as the file holds it (uint8, any shape with
    ``rows * cols / 32 * bytes_per_block`` bytes). ``q`` is int8 for Q8_0 and
    uint8 (0..15) for Q4_0/Q4_1; ``d`` and ``m`` are float32 (``m`` is
    ``-8 d`` for Q4_0 and 0 for Q8_0).
    """
    if fmt not in QUANT_FORMATS:
        raise DTypeError(f"fmt must be one of {tuple(QUANT_FORMATS)}, got {fmt!r}")
    if cols % BLOCK:
        raise ShapeError(f"cols: {cols} is not a multiple of the {BLOCK}-weight block")
    nb = cols // BLOCK
    size = QUANT_FORMATS[fmt]
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if raw.size != rows * nb * size:
        raise ShapeError(f"raw: {raw.size} bytes, expected {rows * nb * size} for a "
                         f"{rows} x {cols} {fmt} tensor")
    b = raw.reshape(rows, nb, size)                              # [rows, nb, bytes]
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)   # [rows, nb]
    if fmt == "Q8_0":
        q = b[..., 2:].view(np.int8).copy()                      # [rows, nb, 32]
        return q, d, np.zeros_like(d)
    if fmt == "Q4_1":
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        nib = b[..., 4:]                                         # [rows, nb, 16]
    else:                                                        # Q4_0: w = d q - 8 d
        m = np.float32(-8.0) * d
        nib = b[..., 2:]
    q = np.concatenate([nib & 0x0F, nib >> 4], axis=-1)         # [rows, nb, 32]: j, then j+16
    return q, d, m


def dequantize_blocks(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``w = d * q + m`` block by block: ``[rows, nb, 32]`` -> float32 ``[rows, nb * 32]``."""
    w = d[..., None] * q.astype(np.float32) + m[..., None]       # [rows, nb, 32]
    return w.reshape(q.shape[0], -1).astype(np.float32)


def quantize_q8_0(w: np.ndarray):
    """A float matrix ``[rows, cols]`` -> Q8_0 ``(q, d, m)``, llama.cpp's rule per block.

    ``d`` is rounded to float16 (as the file would store it) before ``q`` is
    computed, so ``dequantize_blocks(*quantize_q8_0(w))`` is what a GGUF
    Q8_0 file of ``w`` holds.
    """
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ShapeError(f"w: Q8_0 needs a 2-D [rows, cols] matrix with cols a multiple of "
                         f"{BLOCK}, got shape {w.shape}")
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // BLOCK, BLOCK)               # [rows, nb, 32]
    amax = np.abs(blocks).max(axis=-1)                           # [rows, nb]
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int8)
    return q, d, np.zeros_like(d)


def dequantize_raw(raw: np.ndarray, fmt: str, rows: int, cols: int) -> np.ndarray:
    """A GGUF tensor's bytes -> float32 ``[rows, cols]`` (the reference for a whole tensor)."""
    if fmt in FLOAT_FORMATS:
        dt = np.float32 if fmt == "F32" else np.float16
        return np.ascontiguousarray(raw).view(dt).reshape(rows, cols).astype(np.float32)
    return dequantize_blocks(*parse_blocks(raw, fmt, rows, cols))
