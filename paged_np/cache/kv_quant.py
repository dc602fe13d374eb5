"""Quantized KV pages: int8 and fp8 (e4m3) with one float32 scale per token and kv head.

What it is
----------
``kv_cache_dtype`` (vLLM's name) picks what one K or V element of a page is:

==============  ==============  ======  =====================================
kv_cache_dtype  stored as       bytes   value
==============  ==============  ======  =====================================
``"auto"``      float32         4       itself (``"float32"`` is the same)
``"float16"``   float16         2       itself, widened to float32 on reading
``"int8"``      int8            1       ``q * scale``, ``q`` in [-127, 127]
``"fp8_e4m3"``  uint8 (bits)    1       ``FP8_E4M3[q] * scale``, ``|.| <= 448``
==============  ==============  ======  =====================================

The two 8-bit formats keep, beside each page, one float32 ``scale`` per
(token, kv head): the row of ``head_dim`` values one token writes for one kv
head shares it. Quantizing a row is symmetric (no zero point)::

    scale = max(|x|) / QMAX        # QMAX = 127 (int8) or 448 (the largest e4m3)
    q     = round(x / scale)       # int8: to the nearest integer
                                   # fp8: to the nearest e4m3 value (ties to even)
    x'    = q * scale              # what attention reads back

Why one scale per token-head (and not per page, nor per 32 values as
llama.cpp's q8_0), measured on SmolLM2-135M's own K/V
(``benchmarks/kv_scale_granularity.md``: relative RMS error of each layer's
attention output against float32 K/V, int8):

- a page fills one token at a time during decode; a token's scale is fixed
  when it is written, so nothing is ever re-quantized. A per-page scale must
  be fixed before the page is full or re-quantize it, and even the ideal one
  (from the full page's maximum) errs 1.6x more (3.2e-2 against 2.0e-2);
- the kernels apply it once per score (K) and once per weight (V), never per
  element, which keeps int8 decode near float16's speed (q8_0's blocks would
  cut every dot product into ``head_dim / 32`` scaled parts);
- q8_0's blocks err 0.7x as much (1.4e-2) but cost 72 bytes a row instead of
  68 (``head_dim = 64``): 3.56x float32's pages per MiB instead of 3.76x.

fp8 e4m3 (the "fn" variant of the OCP spec, as in vLLM and PyTorch's
``float8_e4m3fn``): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no
infinities, ``0x7F``/``0xFF`` are NaN (never produced here). It is widened
through the 256-entry table :data:`FP8_E4M3`.

Simplified compared with vLLM: its fp8 cache takes one scale per tensor (or
per head) fixed ahead of time from calibration; here every row measures its
own, which needs no calibration and cannot overflow.
"""

from __future__ import annotations

import numpy as np

from ..config import kv_format
from ..errors import DTypeError, InvalidArgument
from ..registry import KV_FORMATS

__all__ = ["FP8_E4M3", "dequantize", "format_of_pages", "fp8_e4m3_encode", "kv_format",
           "quantize"]

def _fp8_e4m3_table() -> np.ndarray:
    """float32 [256]: the value of every e4m3 bit pattern (``0x7F``, ``0xFF``: NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, (b & 0x7).astype(np.float64)
    value = np.where(exp == 0, man / 8 * 2.0**-6,                # subnormal: 0.m * 2**-6
                     (1 + man / 8) * 2.0 ** (exp - 7))            # normal: 1.m * 2**(e-7)
    value[(b & 0x7F) == 0x7F] = np.nan
    return (sign * value).astype(np.float32)


#: float32 [256]: code -> value of an fp8 e4m3 byte (the widening table the kernels read).
FP8_E4M3 = _fp8_e4m3_table()
FP8_E4M3.flags.writeable = False
_FP8_POSITIVE = FP8_E4M3[:0x7F].astype(np.float64)  # codes 0..126, ascending: 0 .. 448


def format_of_pages(dtype) -> str:
    """The format of pages stored as ``dtype``: uint8 pages are fp8 e4m3."""
    return kv_format(np.dtype(dtype))


def fp8_e4m3_encode(y: np.ndarray) -> np.ndarray:
    """float ``y`` (any shape, ``|y| <= 448``) -> uint8 e4m3 codes, nearest (ties to even)."""
    a = np.minimum(np.abs(y.astype(np.float64)), 448.0)
    hi = np.minimum(np.searchsorted(_FP8_POSITIVE, a), 0x7E)     # pos[hi-1] < a <= pos[hi]
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - _FP8_POSITIVE[lo], _FP8_POSITIVE[hi] - a
    # Nearer code; on a tie the even code (its last mantissa bit 0), as IEEE rounds.
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    return (code | np.where(np.signbit(y), 0x80, 0)).astype(np.uint8)   # -0 stays -0


def quantize(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``x`` ``[..., head_dim]`` -> (codes ``[..., head_dim]``, scales f32 ``[...]``).

    One scale per row (a token's ``head_dim`` values of one kv head).
    An all-zero row gets scale 1 and codes 0.
    """
    top = KV_FORMATS[fmt].qmax if isinstance(fmt, str) and fmt in KV_FORMATS else None
    if top is None:
        raise InvalidArgument(f"quantize: format must be an 8-bit KV format, got {fmt!r}")
    x = np.asarray(x, dtype=np.float32)
    amax = np.abs(x).max(axis=-1)                                # [...]
    scale = np.where(amax > 0, amax / np.float32(top), 1).astype(np.float32)  # [...]
    y = x / scale[..., None]                                     # [..., D] in [-QMAX, QMAX]
    if fmt == "int8":
        q = np.clip(np.rint(y), -127, 127).astype(np.int8)       # [..., D]
    else:
        q = fp8_e4m3_encode(y)                                   # [..., D]
    return q, scale


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Codes ``[..., D]`` (int8 or fp8 uint8) and scales ``[...]`` -> float32 ``[..., D]``."""
    if q.dtype == np.uint8:
        values = FP8_E4M3[q]                                     # [..., D] the table
    elif q.dtype == np.int8:
        values = q.astype(np.float32)                            # [..., D]
    else:
        raise DTypeError(f"dequantize: codes must be int8 or uint8 (fp8), got {q.dtype}")
    return values * scale[..., None].astype(np.float32, copy=False)

